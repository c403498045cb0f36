"""Legalization of float32 exp, erf, tanh and sigmoid (alone and inside softmax, GELU, SiLU)
into polynomial forms that LLVM vectorizes, and of ``power`` by a constant 0.5, 1, 2, 3 or 4
into a square root or multiplications.

Why: TVM 0.27 lowers ``exp``/``erf``/``tanh`` to LLVM intrinsics that become one libm call
per lane, 20-130x a memory-bound pass; TOPI's ``fast_exp``/``fast_tanh``/``fast_erf`` (range
reduction + polynomial, all in vector registers) run near memory speed. Accuracy on 1M points
over [-87, 88] and N(0, 25) against float64: max 4.5 ulp (exp), 5.2 ulp (tanh), 5.6 ulp (erf),
i.e. relative error under 3.4e-7 (tests/test_vector_math.py checks the bound).
softmax's exp, whose arguments (x - the row's max) are never above 0, is softmax_exp: fewer
operations for that domain, 2 ulp.
Special values: fast_exp and fast_tanh keep inf/-inf/NaN right; fast_erf maps NaN to 1, so
NaN is passed through explicitly here. exp underflows to 0 below about -88 (instead of
denormals down to 1e-45).

Other dtypes keep TVM's legalization (float16/bfloat16 reach here as float32 when
HalfInFloat32 ran; float64 keeps libm's exactness).

Where: merged into the ``LegalizeOps`` customize map (compiler/pipeline.py)."""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx, topi

from ..relax_walk import one_value


def _fast_exp(x: te.Tensor) -> te.Tensor:
    return topi.fast_exp(x)


def _fast_erf(x: te.Tensor) -> te.Tensor:
    erf = topi.fast_erf(x)
    return te.compute(x.shape, lambda *i: tirx.Select(tirx.isnan(x(*i)), x(*i), erf(*i)),
                      name="erf_nan")


# softmax_exp: exp(x) = 2^n * e^f with n = round(x * log2(e)) and f = x - n * ln(2) in
# [-ln(2)/2, ln(2)/2], ln(2) split in two (Cody and Waite: n * LN2_HIGH is exact for the n of
# float32's range), e^f by a degree-5 polynomial fitted for relative error on that interval.
_LOG2E = 1.4426950408889634
# 1.5 * 2^23 + 127: adding it rounds x * log2(e) to an integer n and leaves n + 127, the
# biased exponent of 2^n, in the low bits of the float's pattern
_ROUNDING_BIAS = 12582912.0 + 127.0
_LN2_HIGH, _LN2_LOW = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.0, 0.9999997, 0.4999915, 0.16667637, 0.04189798, 0.008290301)
# clamped here, n + 127 is 0 and the result exactly 0 (e^-88 is under float32's smallest
# normal)
_EXP_ZERO_BELOW = -88.0


def softmax_exp(x: te.Tensor) -> te.Tensor:
    """exp of float32 values at most 0: softmax's ``x - max(x)``, padded keys' lowest float
    and -inf included. Twelve vector operations an element against fast_exp's seventeen: the
    clamp at the top and the inf and NaN selects are not needed for such arguments, and 2^n
    is the float pattern of ``x * log2(e) + _ROUNDING_BIAS`` shifted left, with no separate
    rounding and conversion. Relative error under 2e-7 (2 ulp) where the result is a normal
    float (down to e^-87.3); below that a result is 0 or under the smallest normal, and from
    about -87.7 down, -inf included, exactly 0. NaN stays NaN (the clamp keeps it, and it
    then reaches the product); arguments above about 88 are out of its domain."""
    f32 = x.dtype

    def c(value: float):
        return tirx.const(value, f32)

    def exp(*i):
        value = x(*i)
        value = tirx.Select(value < c(_EXP_ZERO_BELOW), c(_EXP_ZERO_BELOW), value)
        biased = value * c(_LOG2E) + c(_ROUNDING_BIAS)
        bits = tirx.reinterpret("uint32", biased)
        # through the bit pattern: written as (a + b) - b, TVM's expression folding drops the
        # rounding
        n = tirx.reinterpret(f32, bits) - c(_ROUNDING_BIAS)
        f = value - n * c(_LN2_HIGH)
        f = f - n * c(_LN2_LOW)
        p = c(_EXP_POLY[-1])
        for coefficient in reversed(_EXP_POLY[:-1]):
            p = p * f + c(coefficient)
        scale = tirx.reinterpret(f32, bits << tirx.const(23, "uint32"))
        return p * scale
    return te.compute(x.shape, exp, name="softmax_exp")


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    exp = topi.fast_exp(topi.negative(x))
    one = tirx.const(1.0, x.dtype)
    return te.compute(x.shape, lambda *i: one / (one + exp(*i)), name="sigmoid")


def _softmax(x: te.Tensor, axis: int) -> te.Tensor:
    """exp(x - max) * (1 / sum). The max keeps TVM's finite identity (-3.4e38), unlike
    exact_minmax: here it gives the same result (a row of only -inf is NaN either way, any
    other row has a max of its own), and rfactor, which vectorizes the row max in the
    one-kernel attention, only knows the built-in reducers. One division a row and a multiply
    an element, not a division an element: a vector division issues far slower than a
    multiply (AVX2 and AVX-512 alike), and the one-kernel attention divided every score of
    every row. The product is within one float32 rounding of the quotient; a row of zeros
    (sum 0) is NaN either way."""
    axis = axis % len(x.shape)
    top = topi.max(x, axis=axis, keepdims=True)
    shifted = te.compute(x.shape, lambda *i: x(*i) - top(*_at_zero(i, axis)), name="shifted")
    exp = softmax_exp(shifted)
    total = topi.sum(exp, axis=axis, keepdims=True)
    one = tirx.const(1.0, x.dtype)
    inverse = te.compute(total.shape, lambda *i: one / total(*i), name="softmax_inverse")
    return te.compute(x.shape, lambda *i: exp(*i) * inverse(*_at_zero(i, axis)),
                      name="softmax")


def _at_zero(index, axis: int):
    return tuple(0 if k == axis else v for k, v in enumerate(index))


def _gelu(x: te.Tensor) -> te.Tensor:
    half = tirx.const(0.5, x.dtype)
    erf = _fast_erf(topi.multiply(x, tirx.const(0.5 ** 0.5, x.dtype)))
    return te.compute(x.shape, lambda *i: half * x(*i) * (tirx.const(1.0, x.dtype) + erf(*i)),
                      name="gelu")


def _gelu_tanh(x: te.Tensor) -> te.Tensor:
    c, k = tirx.const((2 / 3.141592653589793) ** 0.5, x.dtype), tirx.const(0.044715, x.dtype)
    inner = te.compute(x.shape, lambda *i: c * (x(*i) + k * x(*i) * x(*i) * x(*i)), name="inner")
    tanh = topi.fast_tanh(inner)
    half, one = tirx.const(0.5, x.dtype), tirx.const(1.0, x.dtype)
    return te.compute(x.shape, lambda *i: half * x(*i) * (one + tanh(*i)), name="gelu_tanh")


def _silu(x: te.Tensor) -> te.Tensor:
    return topi.multiply(x, _fast_sigmoid(x))


def _float32_only(op_name: str, compute, name_hint: str, with_axis: bool = False):
    """A customize-map entry: ``compute`` for float32, TVM's own legalization otherwise."""
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if getattr(call.args[0].ty, "dtype", None) != "float32":
            return tvm.ir.Op.get(op_name).get_attr("FLegalize")(bb, call)
        extra = [int(call.attrs.axis)] if with_axis else []
        return bb.call_te(compute, call.args[0], *extra, primfunc_name_hint=name_hint)
    return legalize


# x ** c for these constant exponents, as multiplications (or a square root): libm's pow is
# one scalar call per lane (GPT-2's tanh GELU cubes its input).
POWER_EXPONENTS = (0.5, 1.0, 2.0, 3.0, 4.0)


def _power(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    exponent = one_value(call.args[1])
    x = call.args[0]
    if (getattr(x.ty, "dtype", None) != "float32" or exponent not in POWER_EXPONENTS
            or len(getattr(call.args[1].ty, "shape", [])) > len(x.ty.shape)):
        return tvm.ir.Op.get("relax.power").get_attr("FLegalize")(bb, call)

    def compute(data: te.Tensor) -> te.Tensor:
        if exponent == 0.5:
            return te.compute(data.shape, lambda *i: tirx.sqrt(data(*i)), name="power")

        def product(*i):
            value = data(*i)
            for _ in range(int(exponent) - 1):
                value = value * data(*i)
            return value
        return te.compute(data.shape, product, name="power")
    return bb.call_te(compute, x, primfunc_name_hint="power")


LEGALIZE_MAP = {
    "relax.power": _power,
    "relax.exp": _float32_only("relax.exp", _fast_exp, "tir_exp"),
    "relax.erf": _float32_only("relax.erf", _fast_erf, "erf"),
    "relax.tanh": _float32_only("relax.tanh", topi.fast_tanh, "tir_tanh"),
    "relax.sigmoid": _float32_only("relax.sigmoid", _fast_sigmoid, "tir_sigmoid"),
    "relax.nn.softmax": _float32_only("relax.nn.softmax", _softmax, "softmax", with_axis=True),
    "relax.nn.gelu": _float32_only("relax.nn.gelu", _gelu, "gelu"),
    "relax.nn.gelu_tanh": _float32_only("relax.nn.gelu_tanh", _gelu_tanh, "gelu_tanh"),
    "relax.nn.silu": _float32_only("relax.nn.silu", _silu, "silu"),
}
