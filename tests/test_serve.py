"""``aotc serve`` as users run it: a real server process on loopback, spoken to by the
protocol's own client (tritonclient, HTTP and gRPC) and by raw HTTP where a client library
would hide what is checked (status codes, Retry-After, byte limits). Outputs are compared with
onnxruntime on the same inputs (rtol/atol 1e-4)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_builders import tiny_cnn

import aotc
from aotc.farm_daemons import free_port

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_serve")


def batched_cnn() -> onnx.ModelProto:
    """tiny_cnn with a symbolic batch dim ``N`` on its input and output."""
    model = tiny_cnn()
    for value in (model.graph.input[0], model.graph.output[0]):
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "N"
    return model


def compile_cnn(folder: Path) -> tuple[Path, Path]:
    onnx.save(batched_cnn(), folder / "cnn.onnx")
    aotc.compile(folder / "cnn.onnx", output=folder / "cnn.so")
    return folder / "cnn.onnx", folder / "cnn.so"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return compile_cnn(tmp_path_factory.mktemp("serve_cnn"))


class Running:
    """An ``aotc serve`` process; ``stop()`` sends SIGTERM and returns its exit code."""

    def __init__(self, args: list[str], env: dict | None = None, grpc: bool = True,
                 ready_s: float = 120):
        self.http, self.grpc = free_port(), free_port()
        ports = ["--http-port", str(self.http)] + (["--grpc-port", str(self.grpc)] if grpc else [])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from aotc.cli import main; main()", "serve", *args, *ports],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"aotc serve exited {self.proc.returncode}: "
                                     f"{self.proc.stderr.read()[-3000:]}")
            try:
                if urllib.request.urlopen(self.url("/v2/health/ready"), timeout=1).status == 200:
                    return
            except OSError:  # not listening, not ready (503), or not answering yet
                time.sleep(0.1)
        self.proc.kill()
        raise AssertionError(f"aotc serve did not become ready in {ready_s:.0f} s: "
                             f"{self.proc.stderr.read()[-3000:]}")

    def stderr_until(self, text: str) -> str:
        """What the server wrote on stderr up to the first line holding ``text``."""
        lines = []
        for line in self.proc.stderr:
            lines.append(line)
            if text in line:
                break
        return "".join(lines)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http}{path}"

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture(scope="module")
def server(cnn):
    running = Running([str(cnn[1]), "--max-batch", "8", "--max-delay-ms", "20",
                       "--access-log"])
    yield running
    assert running.stop() == 0


def post(url: str, body: bytes, headers: dict | None = None):
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def cnn_input(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 8, 12, 12)).astype(np.float32)


def onnxruntime_says(onnx_path: Path, feed: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, feed)


def test_metadata_and_health(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cnn")
    meta = client.get_model_metadata("cnn")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8, 12, 12]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}]
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    assert grpc.is_server_live() and grpc.is_server_ready() and grpc.is_model_ready("cnn")
    gmeta = grpc.get_model_metadata("cnn", as_json=True)
    assert gmeta["inputs"][0]["shape"] == ["-1", "8", "12", "12"]  # int64 in proto JSON


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_round_trip_matches_onnxruntime(server, cnn, binary):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
    x = cnn_input(3, seed=1)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = client.infer("cnn", [tensor], outputs=[
        httpclient.InferRequestedOutput("y", binary_data=binary)], request_id="r1")
    want = onnxruntime_says(cnn[0], {"x": x})[0]
    np.testing.assert_allclose(result.as_numpy("y"), want, rtol=1e-4, atol=1e-4)
    assert result.get_response()["id"] == "r1"


def test_grpc_round_trip_matches_onnxruntime(server, cnn):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    x = cnn_input(2, seed=2)
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("cnn", [tensor])
    want = onnxruntime_says(cnn[0], {"x": x})[0]
    np.testing.assert_allclose(result.as_numpy("y"), want, rtol=1e-4, atol=1e-4)


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(server, cnn):
    xs = [cnn_input(rows, seed=10 + k) for k, rows in enumerate([1, 2, 1, 3, 1, 1])]
    answers: dict[int, np.ndarray] = {}

    def ask(k: int) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
        tensor = httpclient.InferInput("x", list(xs[k].shape), "FP32")
        tensor.set_data_from_numpy(xs[k])
        answers[k] = client.infer("cnn", [tensor]).as_numpy("y")

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(answers) == list(range(len(xs)))
    for k, x in enumerate(xs):
        np.testing.assert_allclose(answers[k], onnxruntime_says(cnn[0], {"x": x})[0],
                                   rtol=1e-4, atol=1e-4, err_msg=f"request {k}")
    metrics = urllib.request.urlopen(server.url("/metrics")).read().decode()
    counts = [float(line.split()[-1]) for line in metrics.splitlines()
              if line.startswith('aotc_batch_size_count{model="cnn"}')]
    sums = [float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith('aotc_batch_size_sum{model="cnn"}')]
    assert counts and sums and sums[0] > counts[0], "no run held more than one request"


@pytest.mark.parametrize("tensor, expected", [
    ({"name": "image", "shape": [1, 8, 12, 12], "datatype": "FP32"},
     r"missing \['x'\], unknown \['image'\]"),
    ({"name": "x", "shape": [1, 8, 12, 13], "datatype": "FP32"},
     r"expected shape \['N', 8, 12, 12\], got \[1, 8, 12, 13\]"),
    ({"name": "x", "shape": [1, 8, 12, 12], "datatype": "INT32"},
     "expected dtype float32, got int32"),
    ({"name": "x", "shape": [1, 8, 12, 12], "datatype": "STRING"}, "datatype 'STRING'"),
])
def test_bad_inputs_are_refused_with_expected_and_got(server, tensor, expected):
    count = int(np.prod(tensor["shape"]))
    body = {"inputs": [{**tensor, "data": [0] * count}]}
    status, _, answer = post(server.url("/v2/models/cnn/infer"), json.dumps(body).encode())
    assert status == 400, answer
    import re
    assert re.search(expected, json.loads(answer)["error"]), answer
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    if tensor["datatype"] in ("FP32", "INT32"):
        x = np.zeros(tensor["shape"], np.float32 if tensor["datatype"] == "FP32" else np.int32)
        inp = grpcclient.InferInput(tensor["name"], tensor["shape"], tensor["datatype"])
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException, match=expected) as caught:
            grpc.infer("cnn", [inp])
        assert "INVALID_ARGUMENT" in str(caught.value.status())


def test_malformed_and_unknown_are_clear_errors(server):
    cases = [("/v2/models/cnn/infer", b"{not json", 400, "not JSON"),
             ("/v2/models/cnn/infer", json.dumps({"inputs": [{"name": "x", "shape": [1, 8, 12, 12],
                                                             "datatype": "FP32",
                                                             "data": [1.0]}]}).encode(),
              400, "1 values; shape"),
             ("/v2/models/resnet/infer", b'{"inputs": []}', 404, "no model named 'resnet'"),
             ("/v2/models/cnn/versions/7/infer", b'{"inputs": []}', 404, "no version '7'")]
    for path, body, status, message in cases:
        got, _, answer = post(server.url(path), body)
        assert got == status and message in json.loads(answer)["error"], (path, answer)
    # binary data that runs past the body
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 8, 12, 12], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4608}}]}).encode()
    got, _, answer = post(server.url("/v2/models/cnn/infer"), header + b"\0" * 100,
                          {"Inference-Header-Content-Length": str(len(header))})
    assert got == 400 and "runs past" in json.loads(answer)["error"]


def test_the_server_stays_up_and_counts_what_it_refused(server):
    x = cnn_input(1, seed=3)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    assert client.infer("cnn", [tensor]).as_numpy("y").shape == (1, 10)
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(server.url("/metrics")).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {(s.labels["model"], s.labels["outcome"]): s.value
                for s in families["aotc_requests"].samples if s.name == "aotc_requests_total"}
    assert requests[("cnn", "ok")] >= 1 and requests[("cnn", "bad_request")] >= 1
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert any(s.name == "aotc_request_seconds_bucket" for s in families["aotc_request_seconds"]
               .samples)


def test_a_full_queue_answers_503_with_retry_after_and_loses_nothing(cnn, tmp_path):
    """Queue limit 2, and the first request of a batch waits 2 s for company: of 12 requests
    sent at once, the ones past the queue are refused at once with 503 + Retry-After; every
    request is answered; the server then still serves."""
    running = Running([str(cnn[1]), "--queue-limit", "2", "--max-delay-ms", "2000",
                       "--max-batch", "64", "--no-grpc"])
    try:
        x = cnn_input(1, seed=4)
        body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.reshape(-1).tolist()}]}).encode()
        answers: list = []

        def ask() -> None:
            answers.append(post(running.url("/v2/models/cnn/infer"), body))

        threads = [threading.Thread(target=ask) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        statuses = sorted(a[0] for a in answers)
        assert len(answers) == 12 and set(statuses) == {200, 503}, statuses
        refused = [a for a in answers if a[0] == 503]
        assert all(int(a[1]["Retry-After"]) >= 1 and "queued" in json.loads(a[2])["error"]
                   for a in refused)
        assert post(running.url("/v2/models/cnn/infer"), body)[0] == 200
    finally:
        assert running.stop() == 0


def test_sigterm_answers_the_requests_already_received(cnn):
    running = Running([str(cnn[1]), "--max-delay-ms", "1500", "--max-batch", "64",
                       "--no-grpc"])
    x = cnn_input(1, seed=5)
    body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(
        post(running.url("/v2/models/cnn/infer"), body))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # received, waiting for their batch
    assert running.stop() == 0
    for t in threads:
        t.join(60)
    assert [a[0] for a in answers] == [200, 200, 200]


def test_a_request_body_over_the_limit_is_refused(cnn, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(f"max_request_bytes: 4096\nmodels:\n  - path: {cnn[1]}\n    name: small\n")
    running = Running(["--config", str(config), "--no-grpc"])
    try:
        x = cnn_input(1, seed=6)
        tensor_bytes = x.tobytes()
        header = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                         "parameters": {"binary_data_size": len(tensor_bytes)}}]
                             }).encode()
        status, _, answer = post(running.url("/v2/models/small/infer"), header + tensor_bytes,
                                 {"Inference-Header-Content-Length": str(len(header))})
        assert status == 413 and "at most 4096" in json.loads(answer)["error"]
    finally:
        assert running.stop() == 0


def test_a_bad_config_is_a_clear_error(tmp_path, cnn):
    config = tmp_path / "serve.yaml"
    config.write_text(f"models:\n  - path: {cnn[1]}\n    batching: {{max_bacth: 4}}\n")
    done = subprocess.run([sys.executable, "-c", "from aotc.cli import main; main()", "serve",
                           "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "unknown key(s) ['max_bacth']" in done.stderr, done.stderr


@pytest.mark.parametrize("ray, message", [
    ("{replicas: 2, autoscaling: {max_replicas: 3}}", "give 'replicas' or 'autoscaling'"),
    ("{replica: 2}", "unknown key(s) ['replica']"),
    ("{threads: 0}", "ray settings out of range"),
    ("{autoscaling: 3}", "autoscaling must be a mapping"),
])
def test_ray_settings_in_a_config_are_checked(tmp_path, cnn, ray, message):
    from aotc.errors import AotcError
    from aotc.serve import config as serve_config
    path = tmp_path / "serve.yaml"
    path.write_text(f"models:\n  - path: {cnn[1]}\n    ray: {ray}\n")
    with pytest.raises(AotcError, match=re.escape(message)):
        serve_config.read(path)
    path.write_text(f"models:\n  - path: {cnn[1]}\n    ray: {{autoscaling: {{min_replicas: 2,"
                    " max_replicas: 4}, threads: 2}\n")
    settings = serve_config.read(path).models[0].ray
    assert settings.describe() == "autoscaling 2-4 replicas, 2 threads each"


def test_ray_flags_need_ray(cnn):
    from click.testing import CliRunner

    from aotc.cli import main
    result = CliRunner().invoke(main, ["serve", "--replicas", "2", str(cnn[1])])
    assert result.exit_code == 2 and "go with --ray" in result.output, result.output


def test_batch_plans_follow_the_signature():
    from aotc.runtime.signature import ModelSignature, TensorSpec
    from aotc.serve.batcher import BatchPlan
    text = ModelSignature((TensorSpec("ids", ("batch", "seq"), "int64"),
                           TensorSpec("mask", ("batch", "seq"), "int64")),
                          (TensorSpec("hidden", ("batch", "seq", 64), "float32"),))
    buckets = {"dims": {"seq": [16, 64]}}
    plan = BatchPlan.of(text, buckets)
    assert plan == BatchPlan("batch", ("seq",), {"seq": (16, 64)})
    assert plan.key({"batch": 2, "seq": 9}) == ((("seq", 16),), {"seq": 16})
    assert plan.key({"batch": 1, "seq": 64}) == ((("seq", 64),), {"seq": 64})
    assert plan.key({"batch": 1, "seq": 65}) == ((("seq", 65),), {})  # past every bucket
    # without buckets, only equal lengths share a run
    assert BatchPlan.of(text, None).key({"batch": 1, "seq": 9}) == ((("seq", 9),), {})
    # an output with a symbolic dim no input has: it cannot be cropped, so nothing is padded
    odd = ModelSignature(text.inputs, (TensorSpec("h", ("batch", "other"), "float32"),))
    assert BatchPlan.of(odd, buckets).buckets == {}
    # fixed batch, or an output without the batch dim: request by request
    fixed = ModelSignature((TensorSpec("x", (1, 3), "float32"),),
                           (TensorSpec("y", (1, 3), "float32"),))
    assert BatchPlan.of(fixed, None).batch_dim is None
    pooled = ModelSignature((TensorSpec("x", ("n", 3), "float32"),),
                            (TensorSpec("y", (3,), "float32"),))
    assert BatchPlan.of(pooled, None).batch_dim is None


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    pytest.importorskip("transformers")
    from aotc.examples.dynamic_transformers import export
    folder = tmp_path_factory.mktemp("serve_bert")
    path = export("bert", folder / "bert.onnx", hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=128, vocab_size=1000)
    options = aotc.CompileOptions(buckets={"seq": (16, 64)})
    aotc.compile(path, output=folder / "bert.so", options=options)
    return path, folder / "bert.so"


@pytest.mark.slow
def test_text_requests_of_many_lengths_batch_within_buckets_and_match(bert):
    """Requests of lengths 3..64 sent at once: they share runs within a bucket (padded to it,
    the compiler having checked that padding changes nothing), never across; each answer is
    cropped to its own length and matches onnxruntime on the unpadded request."""
    from aotc.examples.dynamic_transformers import feed
    onnx_path, so = bert
    running = Running([str(so), "--max-batch", "8", "--max-delay-ms", "200"])
    try:
        lengths = [(1, 5), (1, 9), (2, 16), (1, 12), (1, 30), (1, 64), (1, 3), (1, 40)]
        names = ["input_ids", "attention_mask", "token_type_ids"]
        feeds = [feed(names, b, n, vocab=1000, seed=k) for k, (b, n) in enumerate(lengths)]
        answers: dict = {}

        def ask(k: int) -> None:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc}")
            tensors = []
            for name, value in feeds[k].items():
                tensor = grpcclient.InferInput(name, list(value.shape), "INT64")
                tensor.set_data_from_numpy(value)
                tensors.append(tensor)
            result = client.infer("bert", tensors)
            answers[k] = {o: result.as_numpy(o) for o in ("last_hidden_state", "pooler_output")}

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(feeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        for k, inputs in enumerate(feeds):
            hidden, pooled = session.run(None, inputs)
            np.testing.assert_allclose(answers[k]["last_hidden_state"], hidden, rtol=1e-4,
                                       atol=1e-4, err_msg=f"request {k} {lengths[k]}")
            np.testing.assert_allclose(answers[k]["pooler_output"], pooled, rtol=1e-4,
                                       atol=1e-4, err_msg=f"request {k} {lengths[k]}")
        from prometheus_client.parser import text_string_to_metric_families
        text = urllib.request.urlopen(running.url("/metrics")).read().decode()
        batch = {s.name: s.value for f in text_string_to_metric_families(text)
                 if f.name == "aotc_batch_size" for s in f.samples}
        assert batch["aotc_batch_size_sum"] == len(feeds)
        assert batch["aotc_batch_size_count"] < len(feeds)  # some runs held several requests
    finally:
        assert running.stop() == 0


class _SumModel:
    """A stand-in for a loaded library (signature, metadata, run) whose answers padding cannot
    change: doubled ids, and their sum per row. It records the shape of every run."""

    def __init__(self):
        from aotc.runtime.signature import ModelSignature, TensorSpec
        self.signature = ModelSignature((TensorSpec("ids", ("batch", "seq"), "int64"),),
                                        (TensorSpec("double", ("batch", "seq"), "int64"),
                                         TensorSpec("total", ("batch",), "int64")))
        self.metadata = {"buckets": {"dims": {"seq": [4, 8]}}}
        self.runs: list[tuple] = []

    def run(self, inputs):
        ids = inputs["ids"]
        self.runs.append(ids.shape)
        if (ids < 0).any():
            raise ValueError("negative id")
        return {"double": ids * 2, "total": ids.sum(axis=1)}


def test_the_batcher_groups_by_bucket_pads_crops_and_isolates_a_failure():
    """In process, on a stand-in model: requests of lengths 1..11 sent at once run as one
    batch per bucket (4, 8; 11 is past every bucket and runs at its own length); each answer
    is its own rows cropped to its own length; a request that makes the model fail fails
    alone, its batch-mates are answered."""
    import asyncio

    from aotc.serve.batcher import Batcher, BatchSettings
    model = _SumModel()
    lengths = [3, 6, 1, 8, 11, 4, 2]
    requests = [np.arange(1, n + 1, dtype=np.int64).reshape(1, n) for n in lengths]
    requests.append(-np.ones((1, 7), np.int64))  # bucket 8, fails

    async def main():
        batcher = Batcher("sum", model, BatchSettings(max_batch=16, max_delay_ms=50))
        batcher.start()
        answers = await asyncio.gather(*[batcher.infer({"ids": r}) for r in requests],
                                       return_exceptions=True)
        await batcher.close()
        return answers

    answers = asyncio.run(main())
    for ids, answer in zip(requests[:-1], answers):
        np.testing.assert_array_equal(answer["double"], ids * 2)
        np.testing.assert_array_equal(answer["total"], ids.sum(axis=1))
    assert isinstance(answers[-1], ValueError)
    # bucket 4: lengths 3, 1, 4, 2 in one run; bucket 8: 6, 8 and the failing 7, then each
    # alone; 11 alone
    assert sorted(model.runs) == sorted([(4, 4), (3, 8), (1, 6), (1, 8), (1, 7), (1, 11)])


def detector() -> onnx.ModelProto:
    """[N, 1, 24, 24] -> conv3x3 (1 -> 8) + relu -> features [N, 8, 24, 24]."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(7).standard_normal((8, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["features"])], "detector",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 24, 24])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 8, 24, 24])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def compile_detector(folder: Path) -> None:
    """detector.onnx and detector.so in ``folder``."""
    onnx.save(detector(), folder / "detector.onnx")
    aotc.compile(folder / "detector.onnx", output=folder / "detector.so")


# detector -> Python crop -> classifier, as the pipelines section of a serve config
DETECT_CLASSIFY = """pipelines:
  - name: detect_classify
    inputs: [image]
    outputs: [scores, corner]
    steps:
      - model: detector
        inputs: {image: image}
        outputs: {features: features}
      - name: crop
        function: serve_steps:crop_brightest
        inputs: {features: features}
        outputs: {crops: crops, corner: corner}
      - model: classifier
        inputs: {x: crops}
        outputs: {y: scores}
"""


def check_detect_classify(result, image: np.ndarray, detector_onnx: Path, cnn_onnx: Path):
    """The pipeline's answer against onnxruntime + the same crop + onnxruntime."""
    from serve_steps import crop_brightest
    cropped = crop_brightest(onnxruntime_says(detector_onnx, {"image": image})[0])
    want = onnxruntime_says(cnn_onnx, {"x": cropped["crops"]})[0]
    np.testing.assert_allclose(result.as_numpy("scores"), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(result.as_numpy("corner"), cropped["corner"])


def test_a_two_stage_pipeline_is_one_endpoint_with_its_latency_by_stage(cnn, tmp_path):
    """detector -> Python crop -> classifier, declared in the config and served as one model:
    the answer matches onnxruntime + the same crop + onnxruntime; the metrics split its
    latency by stage; a request that does not fit the first model is a 400."""
    compile_detector(tmp_path)
    config = tmp_path / "serve.yaml"
    config.write_text(f"""
models:
  - path: {tmp_path / 'detector.so'}
  - path: {cnn[1]}
    name: classifier
{DETECT_CLASSIFY}""")
    running = Running(["--config", str(config)],
                      env={"PYTHONPATH": str(Path(__file__).parent)})
    try:
        image = np.random.default_rng(8).standard_normal((2, 1, 24, 24)).astype(np.float32)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc}")
        tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        result = client.infer("detect_classify", [tensor])
        check_detect_classify(result, image, tmp_path / "detector.onnx", cnn[0])
        meta = httpclient.InferenceServerClient(f"127.0.0.1:{running.http}").get_model_metadata(
            "detect_classify")
        assert meta["inputs"] == [{"name": "image", "datatype": "FP32",
                                   "shape": [-1, 1, 24, 24]}]
        from prometheus_client.parser import text_string_to_metric_families
        text = urllib.request.urlopen(running.url("/metrics")).read().decode()
        stages = {s.labels["stage"]: s.value for f in text_string_to_metric_families(text)
                  if f.name == "aotc_stage_seconds" for s in f.samples
                  if s.name == "aotc_stage_seconds_count"}
        assert stages == {"detector": 1, "crop": 1, "classifier": 1}
        bad = {"inputs": [{"name": "image", "shape": [1, 1, 24, 25], "datatype": "FP32",
                           "data": [0.0] * 600}]}
        status, _, answer = post(running.url("/v2/models/detect_classify/infer"),
                                 json.dumps(bad).encode())
        assert status == 400 and "expected shape" in json.loads(answer)["error"], answer
    finally:
        assert running.stop() == 0


@pytest.mark.parametrize("step, message", [
    ("      - model: nowhere\n        inputs: {x: image}\n        outputs: {y: scores}\n",
     "runs model 'nowhere', which is not served"),
    ("      - model: classifier\n        inputs: {image: image}\n        outputs: {y: scores}\n",
     r"maps inputs \['image'\]; model 'classifier' takes \['x'\]"),
    ("      - model: classifier\n        inputs: {x: crops}\n        outputs: {y: scores}\n",
     r"reads \['crops'\], which no input or step produces"),
    ("      - function: serve_steps:no_such\n        inputs: {f: image}\n"
     "        outputs: {y: scores}\n", "cannot import 'serve_steps:no_such'"),
])
def test_a_broken_pipeline_is_refused_at_start(cnn, tmp_path, step, message):
    config = tmp_path / "serve.yaml"
    config.write_text(f"models:\n  - path: {cnn[1]}\n    name: classifier\npipelines:\n"
                      f"  - name: p\n    inputs: [image]\n    outputs: [scores]\n    steps:\n"
                      + step)
    done = subprocess.run([sys.executable, "-c", "from aotc.cli import main; main()", "serve",
                           "--config", str(config)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    import re
    assert done.returncode == 1 and re.search(message, done.stderr), done.stderr
