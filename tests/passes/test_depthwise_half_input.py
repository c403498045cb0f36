"""DepthwiseHalfInput on a small NHWC graph: relu -> depthwise 3x3 (its input's only user),
then a second depthwise conv whose input also feeds a residual add.

After the pass only the first reads float16: astype(float16) -> conv2d(out_dtype float32);
the second's input has two users (casting it would write the tensor twice) and stays. With
``enabled`` False (no int8 sites) nothing changes. Numbers: within float16's rounding of the
input (2^-11 relative per tap)."""

import numpy as np
import tvm
from relax_helpers import main_ops, run_main
from tvm import relax

from aotc.compiler.quantize import DepthwiseHalfInput

RNG = np.random.default_rng(0)


def _depthwise(x, channels):
    weight = relax.const(RNG.standard_normal((3, 3, 1, channels)).astype(np.float32))
    return relax.op.nn.conv2d(x, weight, padding=[1, 1], groups=channels,
                              data_layout="NHWC", kernel_layout="HWIO")


def _module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 12, 12, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            y = bb.emit(_depthwise(y, 16))
            z = bb.emit(_depthwise(y, 16))
            out = bb.emit_output(relax.op.add(z, y))
        bb.emit_func_output(out)
    return bb.get()


def _conv_input_dtypes(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(
        (e.args[0].ty.dtype, e.ty.dtype)) if isinstance(e, relax.Call)
        and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.nn.conv2d" else None)
    return found


def test_structure():
    before = _module()
    after = DepthwiseHalfInput(True)(before)
    assert _conv_input_dtypes(before) == [("float32", "float32"), ("float32", "float32")]
    assert _conv_input_dtypes(after) == [("float16", "float32"), ("float32", "float32")]
    assert main_ops(after) == ["relax.nn.relu", "relax.astype", "relax.nn.conv2d",
                               "relax.nn.conv2d", "relax.add"]


def test_disabled_without_int8_sites():
    before = _module()
    tvm.ir.assert_structural_equal(DepthwiseHalfInput(False)(before), before)


def test_numbers_within_float16_rounding():
    before = _module()
    x = RNG.standard_normal((1, 12, 12, 16)).astype(np.float32)
    want = run_main(before, x)
    got = run_main(DepthwiseHalfInput(True)(before), x)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())
    assert not np.array_equal(got, want)  # the pass did change the arithmetic
