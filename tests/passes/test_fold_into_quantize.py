"""FoldIntoQuantize on small NHWC graphs of an int8 epilogue: ``x * c[channel] -> max(0) ->
min(6) -> quantize(s, zp)`` and a float32 conv's ``x + bias[channel] -> quantize``.

Before: multiply, maximum, minimum, quantize. After: ``quantize(x * (c / s) [+ zp], 1, 0)``
when the clamps' bounds map to the quantize's own lowest/highest codes (zero point 0, a
calibrated range within [0, 6]): the clamps dropped, the constants folded into one
multiply-add. Clamps inside the codes' range, a relu before a non-zero zero point and a
multiply with another user stay. Numbers: the clamps alone go exactly; with the constants
folded, codes at most one step apart, on few elements (each constant rounded once instead of
twice). Legalized with aotc's map, as compile does (default_schedules/reciprocal_quantize.py)."""

import numpy as np
import pytest
import tvm
from relax_helpers import main_ops, one_input_module
from tvm import relax

from aotc.compiler.default_schedules.reciprocal_quantize import LEGALIZE_MAP
from aotc.compiler.quantize import FoldIntoQuantize
from aotc.targets import resolve

TARGET = tvm.target.Target(resolve("x86").tvm_target)
RNG = np.random.default_rng(0)
SHAPE = (1, 16, 16, 32)


def _const(values):
    return relax.const(np.asarray(values, np.float32))


def _quantize(z, scale, zero_point):
    return relax.op.quantize(z, _const(scale), relax.const(np.int32(zero_point)), axis=-1,
                             out_dtype="uint8")


def _module(channel_scale, high=6.0, scale=0.02, zero_point=0, relu=False,
            second_user=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(x, _const(channel_scale)))
            if relu:
                z = bb.emit(relax.op.nn.relu(y))
            else:
                z = bb.emit(relax.op.maximum(y, _const(0.0)))
                z = bb.emit(relax.op.minimum(z, _const(high)))
            q = bb.emit(_quantize(z, scale, zero_point))
            out = bb.emit_output(relax.op.add(relax.op.astype(q, "float32"), y)
                                 if second_user else q)
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    with TARGET:
        mod = relax.transform.LegalizeOps(LEGALIZE_MAP)(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _input():
    return (RNG.standard_normal(SHAPE) * 3).astype(np.float32)


def _assert_within_a_step(before, after):
    x = _input()
    want, got = _run(before, x).astype(np.int32), _run(after, x).astype(np.int32)
    assert np.abs(got - want).max() <= 1 and np.mean(got != want) < 1e-3, np.mean(got != want)
    return want


def _bindings(mod):
    return [b.value for b in mod["main"].body.blocks[0].bindings]


def test_clamps_and_channel_scale_fold_into_one_multiply_and_quantize():
    c = RNG.uniform(0.5, 2.0, SHAPE[-1])
    before = _module(c, scale=5.0 / 255)  # calibrated on [0, 5]: both clamps redundant
    after = FoldIntoQuantize()(before)
    assert main_ops(before) == ["relax.multiply", "relax.maximum", "relax.minimum",
                                "relax.quantize"]
    assert main_ops(after) == ["relax.multiply", "relax.quantize"]  # zero point 0: no add
    multiply, quantize = _bindings(after)[:2]
    np.testing.assert_allclose(multiply.args[1].value.numpy(),
                               (c.astype(np.float32) / np.float32(5.0 / 255)), rtol=1e-6)
    assert float(quantize.args[1].value.numpy()) == 1.0
    want = _assert_within_a_step(before, after)
    assert want.min() == 0 and want.max() == 255  # the clamps' range is exercised


def test_a_bias_and_zero_point_fold_into_one_offset():
    bias = RNG.standard_normal(SHAPE[-1])
    before = one_input_module(
        SHAPE, lambda bb, x: _quantize(bb.emit(relax.op.add(x, _const(bias))), 0.05, 7))
    after = FoldIntoQuantize()(before)
    assert main_ops(after) == ["relax.multiply", "relax.add", "relax.quantize"]
    multiply, add = _bindings(after)[:2]
    assert float(multiply.args[1].value.numpy()) == np.float32(20.0)
    np.testing.assert_allclose(add.args[1].value.numpy(), bias.astype(np.float32) / 0.05 + 7,
                               rtol=1e-6, atol=1e-5)
    _assert_within_a_step(before, after)


def test_clamps_alone_fold_exactly():
    before = one_input_module(
        SHAPE, lambda bb, x: _quantize(bb.emit(relax.op.nn.relu(x)), 0.02, 0))
    after = FoldIntoQuantize()(before)
    assert main_ops(after) == ["relax.quantize"]
    x = _input()
    np.testing.assert_array_equal(_run(after, x), _run(before, x))


@pytest.mark.parametrize("kwargs, ops", [
    # 6.0 maps to code 60 of 255: the min clamps where the quantize would not
    (dict(scale=0.1), ["relax.maximum", "relax.minimum", "relax.quantize"]),
    # a relu before zero point 10: codes 0..9 are reachable only without it
    (dict(relu=True, zero_point=10), ["relax.nn.relu", "relax.quantize"]),
])
def test_clamps_the_quantize_does_not_repeat_stay(kwargs, ops):
    before = _module(np.ones(SHAPE[-1]), **kwargs)
    after = FoldIntoQuantize()(before)
    assert main_ops(after) == ["relax.multiply", *ops]
    x = _input()
    np.testing.assert_array_equal(_run(after, x), _run(before, x))


def test_a_multiply_with_another_user_stays():
    before = _module(RNG.uniform(0.5, 2.0, SHAPE[-1]), scale=5.0 / 255, second_user=True)
    after = FoldIntoQuantize()(before)
    assert main_ops(after) == ["relax.multiply", "relax.quantize", "relax.astype",
                               "relax.add"]
    x = _input()
    np.testing.assert_array_equal(_run(after, x), _run(before, x))


def test_relu6_before_its_own_range_folds_although_6_over_the_float32_scale_is_under_255():
    """scale = float32(6 / 255): 6 / scale is 254.99999, but the kernel multiplies by the
    float32 reciprocal (42.5) and 6 gets code 255: the min(6) is redundant and goes."""
    before = _module(np.ones(SHAPE[-1]), scale=np.float32(6.0 / 255))
    assert 6.0 / float(np.float32(6.0 / 255)) < 255
    after = FoldIntoQuantize()(before)
    assert main_ops(after) == ["relax.multiply", "relax.quantize"]
    _assert_within_a_step(before, after)


def test_a_float_convs_scale_goes_into_its_weights():
    """A depthwise conv + bias -> quantize: 1/s goes into the conv's constant weights, the
    epilogue keeps the add (bias / s + zero point) alone."""
    weight = RNG.standard_normal((3, 3, 1, SHAPE[-1])).astype(np.float32)
    bias = RNG.standard_normal(SHAPE[-1])

    def build(bb, x):
        conv = bb.emit(relax.op.nn.conv2d(x, _const(weight), padding=[1, 1],
                                          groups=SHAPE[-1], data_layout="NHWC",
                                          kernel_layout="HWIO"))
        return _quantize(bb.emit(relax.op.add(conv, _const(bias))), 0.05, 3)

    before = one_input_module(SHAPE, build)
    after = FoldIntoQuantize()(before)
    assert main_ops(after) == ["relax.nn.conv2d", "relax.add", "relax.quantize"]
    conv = _bindings(after)[0]
    np.testing.assert_allclose(conv.args[1].value.numpy(), weight / np.float32(0.05),
                               rtol=1e-6)
    _assert_within_a_step(before, after)
