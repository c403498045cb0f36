"""``aotc serve --ray``: the same config deployed on a local Ray cluster (started by the
command, on loopback), spoken to by tritonclient over Ray's HTTP proxy. Outputs are compared
with onnxruntime (rtol/atol 1e-4)."""

from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_serve import (
    DETECT_CLASSIFY,
    Running,
    check_detect_classify,
    cnn_input,
    compile_cnn,
    compile_detector,
    httpclient,
    onnxruntime_says,
    post,
)

pytest.importorskip("ray.serve")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_serve")]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return compile_cnn(tmp_path_factory.mktemp("serve_cnn"))


@pytest.fixture(scope="module")
def ray_server(cnn, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_ray")
    compile_detector(folder)
    config = folder / "serve.yaml"
    config.write_text(f"""
models:
  - path: {folder / 'detector.so'}
    ray: {{autoscaling: {{min_replicas: 1, max_replicas: 2, target_ongoing_requests: 2}}}}
  - path: {cnn[1]}
    name: classifier
    batching: {{max_batch: 4, max_delay_ms: 20}}
    ray: {{replicas: 2, threads: 1}}
{DETECT_CLASSIFY}""")
    # 3 replicas of 1 thread: on a 2-core machine the cluster is told it has 4
    running = Running(["--config", str(config), "--ray", "--ray-cpus", "4"], grpc=False,
                      env={"PYTHONPATH": str(Path(__file__).parent)}, ready_s=300)
    yield running, folder
    assert running.stop() == 0


def test_replicas_run_as_configured(ray_server):
    running, _ = ray_server
    status = running.stderr_until("aotc serve --ray:")
    assert re.search(r"classifier \(2 replicas, 1 thread each", status), status
    assert re.search(r"detector \(autoscaling 1-2 replicas", status), status
    assert re.search(r"aotc-model-classifier: 2 RUNNING", status), status


def test_round_trips_through_ray_match_onnxruntime(ray_server, cnn):
    running, _ = ray_server
    url = f"127.0.0.1:{running.http}"
    meta = httpclient.InferenceServerClient(url).get_model_metadata("classifier")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8, 12, 12]}]

    def ask(k: int) -> tuple[np.ndarray, np.ndarray]:
        x = cnn_input(1 + k % 3, seed=k)
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=k % 2 == 0)
        client = httpclient.InferenceServerClient(url)  # gevent: one client per thread
        return x, client.infer("classifier", [tensor]).as_numpy("y")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(16)))
    for x, got in answers:
        np.testing.assert_allclose(got, onnxruntime_says(cnn[0], {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)


def test_a_pipeline_runs_across_deployments(ray_server, cnn):
    running, folder = ray_server
    image = np.random.default_rng(8).standard_normal((3, 1, 24, 24)).astype(np.float32)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http}")
    tensor = httpclient.InferInput("image", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    result = client.infer("detect_classify", [tensor])
    check_detect_classify(result, image, folder / "detector.onnx", cnn[0])


def test_errors_from_replicas_keep_their_status(ray_server):
    running, _ = ray_server
    bad = {"inputs": [{"name": "x", "shape": [1, 8, 12, 13], "datatype": "FP32",
                       "data": [0.0] * (8 * 12 * 13)}]}
    status, _, answer = post(running.url("/v2/models/classifier/infer"), json.dumps(bad).encode())
    assert status == 400 and "expected shape" in json.loads(answer)["error"], answer
    status, _, answer = post(running.url("/v2/models/nowhere/infer"), b"{}")
    assert status == 404, answer


def test_replicas_that_do_not_fit_the_cluster_are_refused(cnn):
    """Ray would wait forever for cores it lacks: the command says so and exits."""
    import subprocess
    import sys
    done = subprocess.run(
        [sys.executable, "-m", "aotc.cli", "serve", str(cnn[1]), "--ray", "--replicas", "3",
         "--ray-cpus", "2", "--http-port", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the models' replicas reserve 3 cores (replicas x threads) and the Ray cluster " \
           "has 2" in done.stderr, done.stderr[-2000:]
