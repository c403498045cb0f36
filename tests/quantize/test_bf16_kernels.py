"""The bf16 kernels ConvertBF16 emits (compiler/dot_kernels.py, format BF16), scheduled by
PackedDot onto AVX512-BF16's vdpbf16ps, against numpy on the same bfloat16-rounded operands
(ml_dtypes): ragged channels (3 -> 24), stride, dilation, padding, a matmul with leading axes
and a 1000-class classifier (guard elements past the output stay untouched). The float32 ->
bfloat16 rounding equals ml_dtypes' (nearest even, infinities, NaN). Targets without the
instruction: the rule declines, and the target refuses --precision bf16 with the reason."""

import ml_dtypes
import numpy as np
import pytest
import tvm
from kernel_helpers import build_scheduled, check_guard, conv_reference, guarded_output
from tvm import te

from aotc.compiler import dot_kernels as k
from aotc.compiler.default_schedules.cpu_dot import PackedDot
from aotc.errors import TargetError
from aotc.targets import bf16_dot, for_precision, resolve, x86

BF16_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "cooperlake", "num-cores": 2})
RNG = np.random.default_rng(0)
needs_bf16 = pytest.mark.skipif(not x86._BF16_FLAGS <= x86.cpu_flags(),
                                reason="this CPU has no AVX512-BF16 to run the kernels on")


def _rounded(values):
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


def _build(func):
    return build_scheduled(PackedDot(), func, BF16_TARGET, "vdpbf16ps")


@needs_bf16
@pytest.mark.parametrize("ic,oc,stride,pad,dilation", [(3, 24, 2, 1, 1), (32, 64, 1, 2, 2),
                                                        (16, 16, 1, 0, 1), (7, 40, 1, 1, 1)])
def test_conv_matches_numpy(ic, oc, stride, pad, dilation):
    x = RNG.standard_normal((1, 9, 10, ic)).astype(np.float32)
    w = RNG.standard_normal((3, 3, ic, oc)).astype(np.float32)
    xt = te.placeholder(x.shape, "float32", "x")
    packed = k.pack_conv_weight(w, k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    out = k.conv2d_nhwc(k.to_bf16_bits(xt), wt, oc, (stride, stride), (pad,) * 4,
                        (dilation, dilation), 0)
    lib = _build(te.create_prim_func([xt, wt, out]))
    want = conv_reference(_rounded(x), _rounded(w), stride, pad, dilation)
    got, whole = guarded_output(want.shape)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-4)
    check_guard(whole, want.shape)


@needs_bf16
@pytest.mark.parametrize("m,n", [(5, 20), (1, 1000)])
def test_matmul_matches_numpy(m, n):
    x = RNG.standard_normal((2, m, 31)).astype(np.float32)
    w = RNG.standard_normal((31, n)).astype(np.float32)
    xt = te.placeholder(x.shape, "float32", "x")
    packed = k.pack_matmul_weight(w, k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    acc = k.matmul(k.to_bf16_bits(xt), wt, n, 0)
    out = te.compute(acc.shape, lambda *i: acc(*i) * 2.0, name="epilogue")
    lib = _build(te.create_prim_func([xt, wt, out]))
    want = (_rounded(x).astype(np.float64) @ _rounded(w)) * 2
    got, whole = guarded_output(want.shape)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-4)
    check_guard(whole, want.shape)


def test_rounding_matches_ml_dtypes():
    values = np.concatenate([RNG.standard_normal(10000).astype(np.float32) * 1e3,
                             np.array([np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1e-40,
                                       1.00390625, 1.01171875], np.float32)])  # ties
    want = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(k.bf16_bits(values), want)
    xt = te.placeholder(values.shape, "float32", "x")
    lib = tvm.compile(te.create_prim_func([xt, k.to_bf16_bits(xt)]), target="llvm")
    got = tvm.runtime.tensor(np.zeros(values.shape, np.uint16))
    lib["main"](tvm.runtime.tensor(values), got)
    np.testing.assert_array_equal(got.numpy(), want)
    nan = k.bf16_bits(np.array([np.nan], np.float32)).view(ml_dtypes.bfloat16)
    assert np.isnan(nan.astype(np.float32)).all()


def test_numpy_rounding_is_the_kernels_on_any_bits():
    """bf16_bits (weights at compile time, a chunk at a time in uint32) and to_bf16_bits (the
    kernels) give the same bits for any float32 bit pattern, NaNs with any payload, the top of
    the range (0xFFFF8000 and up, where a uint32 sum would carry out) and values across chunk
    boundaries included; a scalar gives one value, as an array of one."""
    bits = np.concatenate([
        RNG.integers(0, 2**32, 3 * k._BF16_CHUNK + 17, dtype=np.uint64).astype(np.uint32),
        np.array([0x7F800001, 0x7FC00000, 0xFF800001, 0xFFFF8000, 0xFFFF7FFF, 0xFFFFFFFF,
                  0x7F7F8000, 0x3F808000, 0x3F818000, 0x00008000, 0x80008000], np.uint32)])
    values = bits.view(np.float32)
    wider = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(k.bf16_bits(values), wider)
    np.testing.assert_array_equal(k.bf16_bits(values.reshape(1, -1, 1)), wider.reshape(1, -1, 1))
    xt = te.placeholder(values.shape, "float32", "x")
    lib = tvm.compile(te.create_prim_func([xt, k.to_bf16_bits(xt)]), target="llvm")
    got = tvm.runtime.tensor(np.zeros(values.shape, np.uint16))
    lib["main"](tvm.runtime.tensor(values), got)
    np.testing.assert_array_equal(got.numpy(), wider)
    assert k.bf16_bits(np.float32(1.5)).tolist() == [0x3FC0]


def test_rule_declines_without_bf16():
    xt = te.placeholder((1, 4, 4, 16), "uint16", "x")
    wt = te.placeholder((1, 1, 1, 8, 16, 2), "uint16", "w")
    func = te.create_prim_func([xt, wt, k.conv2d_nhwc(xt, wt, 16, (1, 1), (0,) * 4, (1, 1), 0)])
    vnni = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server"})
    assert bf16_dot(vnni) is None and PackedDot().apply(func, vnni, False) is None


@pytest.mark.parametrize("name,precision,words", [
    ("x86-vnni", "bf16", "AVX512-BF16"), ("x86-avx2", "bf16", "AVX512-BF16"),
    ("arm", "bf16", "not built"), ("cuda", "bf16", "not built"), ("x86-vnni", "fp16",
                                                                  "AVX512-FP16"),
    ("x86-bf16", "fp16", "AVX512-FP16"), ("arm", "fp16", "not built")])
def test_targets_refuse_what_they_lack(name, precision, words):
    with pytest.raises(TargetError, match=words):
        for_precision(resolve(name), precision)


def test_bf16_targets():
    assert for_precision(resolve("x86-bf16"), "bf16") == resolve("x86-bf16")
    assert for_precision(resolve("x86-vnni"), "fp32") == resolve("x86-vnni")
    if x86._BF16_FLAGS <= x86.cpu_flags():
        host = for_precision(resolve("x86"), "bf16")
        assert bf16_dot(host.tvm_target) == "avx512-bf16"
