"""AnnotateInt8 then RealizeInt8 on a small NHWC graph: conv2d (+bias, ReLU), a depthwise
conv2d that has no int8 kernel, and a matmul (+bias).

After annotate: the activations of the conv2d and the matmul pass through quantize/dequantize,
their weights are int8 constants under dequantize; the depthwise conv is untouched.
After realize: no dequantize is left, the two contractions are int8 kernels (call_tir) fed
uint8, their biases are inside the one float32 offset added after the scale, and the depthwise
conv is still a float32 conv2d (the fp32 fallback boundary).
Numbers: the realized module equals the annotated (fake-quantized, float32) one up to float32
rounding, and both are near the float32 original."""

import numpy as np
import tvm
from relax_helpers import main_ops, run_main
from tvm import relax

from aotc.compiler.quantize import AnnotateInt8, RealizeInt8, main_sites

RNG = np.random.default_rng(0)


def _const(*shape):
    return relax.const(RNG.standard_normal(shape).astype(np.float32) * 0.3)


def _module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _const(3, 3, 3, 20), padding=[1, 1],
                                           data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, _const(20))))
            y = bb.emit(relax.op.nn.conv2d(y, _const(3, 3, 1, 20), padding=[1, 1], groups=20,
                                           data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.reshape(y, [1, 1280]))
            y = bb.emit(relax.op.matmul(y, _const(1280, 10)))
            out = bb.emit_output(relax.op.add(y, _const(10)))
        bb.emit_func_output(out)
    return bb.get()


def _ranges(mod):
    """Wide enough for the activations of this graph on standard-normal inputs."""
    return {site.name: (-8.0, 8.0) for site in main_sites(mod)}


def test_sites_skip_depthwise():
    assert [s.name for s in main_sites(_module())] == ["conv2d_0", "matmul_0"]


def test_annotate_then_realize_structure():
    before = _module()
    annotated = AnnotateInt8(_ranges(before))(before)
    ops = main_ops(annotated)
    assert ops.count("relax.quantize") == 2 and ops.count("relax.dequantize") == 4
    assert ops.count("relax.nn.conv2d") == 2 and ops.count("relax.matmul") == 1
    realized = RealizeInt8()(annotated)
    ops = main_ops(realized)
    assert "relax.dequantize" not in ops and ops.count("relax.quantize") == 2
    assert ops.count("relax.nn.conv2d") == 1  # the depthwise one, float32
    assert "relax.matmul" not in ops
    kernels = [gv.name_hint for gv, f in realized.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc)]
    assert sorted(kernels) == ["conv2d_int8", "matmul_int8"]
    # bias and zero-point correction in one offset: each kernel is followed by astype,
    # multiply (the scale) and add (the offset), no second add for the bias
    assert ops.count("relax.add") == 2 and ops.count("relax.astype") == 2


def test_realized_matches_annotated():
    before = _module()
    annotated = AnnotateInt8(_ranges(before))(before)
    realized = RealizeInt8()(annotated)
    x = RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    reference, fake, real = (run_main(m, x)
                             for m in (before, annotated, realized))
    np.testing.assert_allclose(real, fake, rtol=1e-3, atol=1e-3)
    cosine = float(fake.ravel() @ reference.ravel()
                   / np.linalg.norm(fake) / np.linalg.norm(reference))
    assert cosine > 0.99


def test_annotate_without_ranges_is_identity():
    before = _module()
    tvm.ir.assert_structural_equal(AnnotateInt8({})(before), before)
    tvm.ir.assert_structural_equal(RealizeInt8()(before), before)


def test_dynamic_matmul_range_per_run():
    """int8-dynamic: the matmul's activation scale and zero point are computed from this run's
    min and max (reductions in the IR); realize subtracts zx * sum(Wq) at run time. The conv
    keeps its calibrated range."""
    before = _module()
    ranges = {"conv2d_0": (-8.0, 8.0), "matmul_0": "dynamic"}
    annotated = AnnotateInt8(ranges)(before)
    assert {"relax.min", "relax.max"} <= set(main_ops(annotated))
    realized = RealizeInt8()(annotated)
    ops = main_ops(realized)
    assert "relax.dequantize" not in ops and "relax.matmul" not in ops
    assert ops.count("relax.subtract") == 2  # -low and acc - zx * sum(Wq)
    x = RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    reference, real = (run_main(m, x) for m in (before, realized))
    cosine = float(real.ravel() @ reference.ravel()
                   / np.linalg.norm(real) / np.linalg.norm(reference))
    assert cosine > 0.99
