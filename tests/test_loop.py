"""ONNX Loop: the body becomes a step function the runtime calls until the loop ends
(compiler/frontends/onnx_loop.py, runtime/loops.py, runtime/cpp/src/loops.cc). Every model runs
in a fresh process and is matched against onnxruntime (exact for tokens and shapes; rtol/atol
1e-4 for floats). Before, Loop had no converter and every such model was refused."""

import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_builders import greedy_decoder_loop, running_sum_loop
from tvm import tirx

import aotc
from aotc.errors import AotcError
from compiler.frontends.onnx_loader import import_onnx

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = pytest.mark.xdist_group("test_loop")


def _compiled(tmp_path, model: onnx.ModelProto, name: str):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    so = tmp_path / f"{name}.so"
    aotc.compile(path, output=so)
    return path, so


def _match(onnx_path, so, feeds: list[dict]) -> list[list[np.ndarray]]:
    model = aotc.load(so)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    results = []
    for feed in feeds:
        want = session.run(None, feed)
        got = list(model.run(feed).values())
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (feed, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        results.append(got)
    return results


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    return _compiled(tmp_path_factory.mktemp("decoder"), greedy_decoder_loop(), "decoder")


def _decoder_feed(seed: int, steps: int) -> dict:
    x = np.random.default_rng(seed).standard_normal((1, 16)).astype(np.float32)
    return {"x": x, "max_steps": np.array(steps, np.int64)}


def test_a_greedy_decoder_stops_where_onnxruntime_stops(decoder):
    feeds = [_decoder_feed(seed, steps) for seed in range(6) for steps in (0, 1, 7, 60)]
    results = _match(*decoder, feeds)
    lengths = {r[1].shape[1] for r in results}
    # the seeds reach the end token at different steps, and some run to the limit
    assert 0 in lengths and 60 in lengths and len(lengths - {0, 1, 7, 60}) >= 2


def test_the_step_function_keeps_static_dims_and_makes_the_growing_one_symbolic():
    mod = import_onnx(greedy_decoder_loop(), None).mod
    steps = [gv for gv in mod.functions if gv.name_hint.startswith("step_")]
    assert len(steps) == 1
    params = mod[steps[0]].params
    shapes = [[int(d) if isinstance(d, tirx.IntImm) else "n" for d in p.ty.shape.values]
              for p in params]
    # iteration, condition, hidden state, tokens so far, the context the body reads
    assert shapes == [[], [], [1, 16], [1, "n"], [1, 16]]


def test_thousands_of_steps_run_in_constant_stack(tmp_path):
    """The end token is out of the vocabulary: the loop runs to its limit. A recursive
    Relax function overflowed the stack between 2,000 and 2,500 steps."""
    onnx_path, so = _compiled(tmp_path, greedy_decoder_loop(eos=99), "endless")
    (tokens_result,) = _match(onnx_path, so, [_decoder_feed(0, 5000)])
    assert tokens_result[1].shape == (1, 5000) and tokens_result[2].shape == (5000, 1, 11)


@pytest.mark.parametrize("trip_count,condition", [(True, True), (True, False), (False, True)])
def test_trip_count_and_condition_are_each_optional(tmp_path, trip_count, condition):
    model = running_sum_loop(trip_count=trip_count, condition=condition)
    onnx_path, so = _compiled(tmp_path, model, "running_sum")
    feeds = [{"x": np.random.default_rng(b).standard_normal((b, 4)).astype(np.float32)}
             for b in (1, 3, 8)]
    results = _match(onnx_path, so, feeds)
    steps = 3 if trip_count else 6
    assert [r[1].shape for r in results] == [(steps, b, 4) for b in (1, 3, 8)]


def test_the_cpp_runner_runs_the_loop(decoder, tmp_path):
    if shutil.which("cmake") is None or shutil.which("g++") is None:
        pytest.skip("cmake and g++ build the C++ runner (.ci/run installs them)")
    from aotc import cpp_runner
    onnx_path, so = decoder
    feed = _decoder_feed(3, 50)
    flags = []
    for name, value in feed.items():
        np.save(tmp_path / f"{name}.npy", value)
        flags += ["--input", f"{name}={tmp_path / (name + '.npy')}"]
    done = subprocess.run([str(cpp_runner.build()), str(so), *flags, "--output-dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr
    want = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(
        None, feed)
    for name, expect in zip(["h_final", "tokens", "all_logits"], want):
        got = np.load(tmp_path / "out" / f"{name}.npy")
        assert got.shape == expect.shape, name
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4, err_msg=name)


def test_a_body_that_changes_a_carried_rank_is_refused_by_name(tmp_path):
    model = greedy_decoder_loop()
    body = model.graph.node[1].attribute[0].g
    body.node.append(helper.make_node("Unsqueeze", ["h_out", "axis0"], ["h_lifted"]))
    body.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    body.output[1].CopyFrom(helper.make_tensor_value_info("h_lifted", TensorProto.FLOAT, None))
    with pytest.raises(AotcError, match="carried value 0 changes rank"):
        import_onnx(model, None)


def test_a_scripted_torch_decoder_exported_by_torch_matches(tmp_path):
    """torch.jit.script turns a Python ``for`` with ``break`` into an ONNX Loop (legacy
    exporter); the end token is one the decoder emits a few steps in, so the loop stops
    early for some inputs and runs to max_len for others."""
    torch = pytest.importorskip("torch")

    class Decoder(torch.nn.Module):
        def __init__(self, eos: int):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 32)
            self.cell = torch.nn.Linear(64, 32)
            self.head = torch.nn.Linear(32, 50)
            self.eos = eos

        def forward(self, h: torch.Tensor, max_len: int = 40):
            token = torch.zeros(h.shape[0], dtype=torch.long)
            tokens = torch.zeros(h.shape[0], 0, dtype=torch.long)
            for _ in range(max_len):
                h = torch.tanh(self.cell(torch.cat([self.emb(token), h], 1)))
                token = self.head(h).argmax(-1)
                tokens = torch.cat([tokens, token.unsqueeze(1)], 1)
                if bool((token == self.eos).all()):
                    break
            return tokens, h

    torch.manual_seed(0)
    decoder = Decoder(eos=-1).eval()
    states = [torch.randn(1, 32, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    with torch.no_grad():
        decoder.eos = int(decoder(states[0])[0][0, 4])  # seed 0 stops at step 5 or before
    path = tmp_path / "decoder.onnx"
    torch.onnx.export(torch.jit.script(decoder), (states[0],), path, input_names=["h"],
                      output_names=["tokens", "h_out"], dynamo=False, opset_version=17)
    assert "Loop" in {n.op_type for n in onnx.load(path).graph.node}
    so = tmp_path / "decoder.so"
    aotc.compile(path, output=so)
    limit_name = [i.name for i in onnx.load(path).graph.input if i.name != "h"][0]
    feeds = [{"h": s.numpy(), limit_name: np.array(40, np.int64)} for s in states]
    results = _match(path, so, feeds)
    lengths = [r[0].shape[1] for r in results]
    assert lengths[0] <= 5 and max(lengths) > 5


def test_a_loop_compiles_in_a_process_that_has_loaded_a_model(decoder, tmp_path):
    """Loading a model registers aotc.run_loop here; the compile-time check that refuses
    functions only the compiler has must still know it as the runtime's (it refused every
    Loop model compiled after a model was loaded in the same process)."""
    from aotc.runtime import loops
    from aotc.runtime._tvm_runtime import tvm_ffi
    loops.register(tvm_ffi())
    _compiled(tmp_path, running_sum_loop(), "after_a_load")
