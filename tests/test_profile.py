"""aotc profile: the kernel table recorded at compile time, and per-kernel timing from it."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

import aotc
from aotc.cli import main
from aotc.runtime.profile import profile


def _two_matmuls(path):
    """x @ w1 -> relu -> @ w2, and the same w1 product once more: one kernel called twice."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w1", (64, 96)), ("w2", (96, 32)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("MatMul", ["x2", "w1"], ["h2"]),
             helper.make_node("Add", ["h", "h2"], ["s"]),
             helper.make_node("MatMul", ["s", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mm", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [16, 64])
                      for n in ("x", "x2")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_kernel_table_counts_calls_and_flops(tmp_path):
    meta = aotc.compile(_two_matmuls(tmp_path / "mm.onnx"), output=tmp_path / "mm.so")
    table = {k["name"]: k for k in meta["kernels"]}
    assert sum(k["calls"] for k in table.values()) >= 3
    by_flops = sorted(k["flops"] for k in table.values() if k["flops"])
    # 16x64x96 products twice (one kernel, two calls, or fused with the add) and 16x96x32
    assert 2 * 16 * 96 * 32 in by_flops
    for entry in table.values():
        assert all(arg["shape"] for arg in entry["args"])  # all static here


@pytest.mark.in_process
def test_profile_times_every_kernel_and_sums_by_calls(tmp_path):
    aotc.compile(_two_matmuls(tmp_path / "mm.onnx"), output=tmp_path / "mm.so")
    report = profile(aotc.load(tmp_path / "mm.so"), repeats=3)
    assert report.kernels and all(k.ms_per_call and k.ms_per_call > 0 for k in report.kernels)
    assert report.kernel_total_ms == sum(k.ms_per_call * k.calls for k in report.kernels)
    assert report.end_to_end_ms > 0
    assert any(k.gflops for k in report.kernels)
    text = report.table()
    assert "GFLOP/s" in text and "end-to-end" in text


@pytest.mark.in_process
def test_profile_cli_prints_table_and_writes_json(tiny_so, tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["profile", str(tiny_so), "--runs", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "kernel" in result.output and "share" in result.output
    data = json.loads(out.read_text())
    assert data["kernels"] and all("total_ms" in k for k in data["kernels"])


def _symbolic_attention(path):
    """A [batch, seq, 64] input, a projection and self-attention over seq: symbolic kernels
    (a padded packed matmul, padded attention)."""
    rng = np.random.default_rng(1)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(np.array(0.125, np.float32), "scale")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h", "ht"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "h"], ["y"])]
    graph = helper.make_graph(
        nodes, "attn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 64])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.in_process
def test_symbolic_kernels_are_timed_at_the_sizes_given(tmp_path):
    """Before, every kernel with a symbolic dim was listed "not timed"."""
    meta = aotc.compile(_symbolic_attention(tmp_path / "a.onnx"), output=tmp_path / "a.so")
    symbolic = [k for k in meta["kernels"] if any(a["shape"] is None for a in k["args"])]
    assert symbolic and all(k["flops"] is None for k in symbolic)
    assert any("(seq + T.int64(15)) // T.int64(16) * T.int64(16)" in a.get("dims", [])
               for k in symbolic for a in k["args"])
    model = aotc.load(tmp_path / "a.so")
    report = profile(model, repeats=2, dims={"seq": 37, "batch": 2})
    assert all(k.ms_per_call and k.ms_per_call > 0 for k in report.kernels), \
        [(k.name, k.note) for k in report.kernels]
    with pytest.raises(ValueError, match="no dim of that name"):
        profile(model, repeats=1, dims={"sequence": 8})
    done = CliRunner().invoke(main, ["profile", str(tmp_path / "a.so"), "--dim", "seq=16",
                                     "--runs", "1"])
    assert done.exit_code == 0, done.output
    assert "not timed" not in done.output
    done = CliRunner().invoke(main, ["profile", str(tmp_path / "a.so"), "--dim", "seq=x"])
    assert done.exit_code != 0 and "NAME=SIZE" in done.output


def test_dim_expressions_are_evaluated_not_executed():
    from aotc.runtime.profile import dim_size
    sizes = {"seq": 37, "batch": 2}
    assert dim_size("(seq + T.int64(15)) // T.int64(16) * T.int64(16)", sizes) == 48
    assert dim_size("T.min(seq, batch * T.int64(8))", sizes) == 16
    assert dim_size(5, sizes) == 5
    for hostile in ("__import__('os').system('true')", "seq ** 99999999", "open('x')",
                    "seq.__class__", "unknown + 1"):
        with pytest.raises(ValueError):
            dim_size(hostile, sizes)
