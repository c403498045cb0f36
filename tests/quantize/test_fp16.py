"""--precision fp16: the float16 kernels (dot_kernels.FP16, scheduled by PackedDot onto
AVX512-FP16's vfmadd231ph) against numpy on the same float16 operands, never writing past
their output; a model through the CLI against onnxruntime's float32 output (the pass itself:
tests/passes/test_convert_fp16.py)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from click.testing import CliRunner
from kernel_helpers import build_scheduled, check_guard, guarded_output
from onnx import TensorProto, helper, numpy_helper
from relax_helpers import assert_matches
from tvm import te

import aotc
from aotc.cli import main
from aotc.compiler import dot_kernels as k
from aotc.compiler.default_schedules.cpu_dot import PackedDot
from aotc.targets import fp16_dot, x86

SPR = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
RNG = np.random.default_rng(0)
needs_fp16 = pytest.mark.skipif(not x86._FP16_FLAGS <= x86.cpu_flags(),
                                reason="this CPU has no AVX512-FP16 to run float16 kernels on")


def _half(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float16)


def _tolerance(reduction: int, want: np.ndarray) -> float:
    """float16 sums: about sqrt(K) roundings of 2^-11 relative to the largest partial sum."""
    return 4 * np.sqrt(reduction) * 2.0 ** -11 * np.abs(want).max()


@needs_fp16
@pytest.mark.parametrize("ic,oc,stride", [(16, 32, 1), (24, 40, 2), (64, 64, 1)])
def test_conv(ic, oc, stride):
    x, w = _half(1, 9, 10, ic), _half(3, 3, ic, oc, scale=1 / np.sqrt(9 * ic))
    packed = k.pack_conv_weight(w, k.FP16)
    xt = te.placeholder(x.shape, "float16", "x")
    wt = te.placeholder(packed.shape, "float16", "w")
    out = k.conv2d_nhwc(xt, wt, oc, (stride, stride), (1,) * 4, (1, 1), 0)
    assert out.dtype == "float32"  # widened on the way out
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, out]), SPR, "vfmadd231ph")
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    oh, ow = (9 - 1) // stride + 1, (10 - 1) // stride + 1
    want = sum(xp[:, i:i + oh * stride:stride, j:j + ow * stride:stride] @ w[i, j]
               for i in range(3) for j in range(3))
    got, whole = guarded_output(want.shape)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), want, atol=_tolerance(9 * ic, want))
    check_guard(whole, want.shape)


@needs_fp16
def test_matmul_one_row_padded_columns():
    """A classifier row: 1000 columns padded to 1008, cropped, widened."""
    x, w = _half(1, 512), _half(512, 1000, scale=1 / np.sqrt(512))
    packed = k.pack_matmul_weight(w, k.FP16)
    xt = te.placeholder(x.shape, "float16", "x")
    wt = te.placeholder(packed.shape, "float16", "w")
    out = k.matmul(xt, wt, 1000, 0)
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, out]), SPR, "vfmadd231ph")
    want = x.astype(np.float64) @ w
    got, whole = guarded_output(want.shape)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), want, atol=_tolerance(512, want))
    check_guard(whole, want.shape)


def test_targets_without_fp16_get_no_kernel():
    xt = te.placeholder((1, 4, 4, 16), "float16", "x")
    wt = te.placeholder((1, 1, 1, 16, 32, 1), "float16", "w")
    func = te.create_prim_func([xt, wt, k.conv2d_nhwc(xt, wt, 32, (1, 1), (0,) * 4, (1, 1), 0)])
    vnni = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server"})
    assert fp16_dot(vnni) is None and PackedDot().apply(func, vnni, False) is None
    assert fp16_dot(SPR) == "avx512-fp16"


def _onnx_model(path):
    def init(name, *shape):
        return numpy_helper.from_array(
            (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "r0"], ["s1"]),
             helper.make_node("Relu", ["s1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "w2"], ["y"])]
    inits = [init("w0", 64, 3, 3, 3), init("b0", 64), init("w1", 64, 64, 3, 3),
             init("w2", 64, 10)]
    graph = helper.make_graph(nodes, "fp16_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_fp16
def test_compile_fp16_cli_against_onnxruntime(tmp_path):
    model = _onnx_model(tmp_path / "net.onnx")
    out = tmp_path / "net_fp16.so"
    result = CliRunner().invoke(main, ["compile", str(model), "-o", str(out),
                                       "--precision", "fp16"])
    assert result.exit_code == 0, result.output
    loaded = aotc.load(out)
    assert loaded.metadata["precision"] == "fp16"
    kernels = " ".join(kernel["name"] for kernel in loaded.metadata["kernels"])
    # the 10-class classifier fills no block of 32 channels: float32
    assert kernels.count("conv2d_fp16") == 2 and "matmul_fp16" not in kernels, kernels
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    assert_matches(loaded.run({"x": x})["y"], want, 0.9999, 0.01)
