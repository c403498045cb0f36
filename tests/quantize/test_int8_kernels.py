"""The int8 kernels realize emits, scheduled by PackedDot, against numpy's integer arithmetic:
channel counts that do not fill a 16x4 block (3 -> 24), stride, dilation, padding (filled with
the zero point), a matmul with leading axes; the code uses vpdpbusd. On a target without VNNI
the rule declines (Contraction schedules the kernel as plain integer loops)."""

import numpy as np
import pytest
import tvm
from kernel_helpers import (
    build_scheduled,
    check_guard,
    conv_reference,
    guarded_output,
    skip_unless_runs_here,
)
from tvm import te

from aotc.compiler import dot_kernels as k
from aotc.compiler.default_schedules.cpu_contraction import Contraction
from aotc.compiler.default_schedules.cpu_dot import PackedDot, tile_shape

VNNI = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})
RNG = np.random.default_rng(0)


def _build(out, inputs, target=VNNI):
    return build_scheduled(PackedDot(), te.create_prim_func([*inputs, out]), target)


@pytest.mark.parametrize("ic,oc,stride,pad,dilation", [(3, 24, 2, 1, 1), (32, 64, 1, 2, 2),
                                                        (16, 16, 1, 0, 1), (8, 40, 1, 1, 1)])
def test_conv2d_matches_integer_reference(ic, oc, stride, pad, dilation):
    x = RNG.integers(0, 256, (1, 11, 9, ic)).astype(np.uint8)
    w = RNG.integers(-127, 128, (3, 3, ic, oc)).astype(np.int8)
    zero = 7
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_conv_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    out = k.conv2d_nhwc(xt, wt, oc, (stride, stride), (pad, pad, pad, pad),
                        (dilation, dilation), zero)
    lib = _build(out, [xt, wt])
    want = conv_reference(x, w, stride, pad, dilation, zero, np.int64)
    got, whole = guarded_output(want.shape, "int32")
    skip_unless_runs_here(VNNI)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_array_equal(got.numpy(), want)
    check_guard(whole, want.shape)
    assert "vpdpbusd" in lib.mod.inspect_source("asm")


@pytest.mark.parametrize("m,n", [(5, 20), (1, 1000)])
def test_matmul_with_leading_axes(m, n):
    """Ragged K (30) and N (20, and a 1000-class classifier: 63 blocks of 16, three per tile:
    its last tile once wrote past the output)."""
    x = RNG.integers(0, 256, (2, m, 30)).astype(np.uint8)
    w = RNG.integers(-127, 128, (30, n)).astype(np.int8)
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_matmul_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    offset = te.placeholder((n,), "int32", "offset")
    acc = k.matmul(xt, wt, n, 3)
    # the epilogue realize puts after the kernel (offset and scale per output channel)
    out = te.compute(acc.shape, lambda b, i, j: (acc[b, i, j] + offset[j]) * 2, name="epilogue")
    lib = _build(out, [xt, wt, offset])
    got, whole = guarded_output((2, m, n), "int32")
    offsets = RNG.integers(-100, 100, n).astype(np.int32)
    skip_unless_runs_here(VNNI)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), tvm.runtime.tensor(offsets),
                got)
    xp = np.concatenate([x, np.full((2, m, 2), 3, np.uint8)], -1).astype(np.int64)
    wp = np.concatenate([w, np.zeros((2, n), np.int8)]).astype(np.int64)
    np.testing.assert_array_equal(got.numpy(), (xp @ wp + offsets) * 2)
    check_guard(whole, (2, m, n))


def test_no_vnni_declines():
    xt = te.placeholder((1, 4, 4, 16), "uint8", "x")
    wt = te.placeholder((1, 1, 1, 4, 16, 4), "int8", "w")
    func = te.create_prim_func([xt, wt, k.conv2d_nhwc(xt, wt, 16, (1, 1), (0, 0, 0, 0),
                                                      (1, 1), 0)])
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    assert PackedDot().apply(func, avx512, False) is None


def test_tile_shape_fits_registers():
    """Accumulators plus one register per weight vector fit the register file (32 on
    AVX-512, 16 on AVX2); 56-pixel rows of 64 channels get the 14x2 tile."""
    for registers in (32, 16):
        for blocks in (1, 2, 3, 4, 8, 24):
            for rows in (1, 7, 14, 56, 128, 197):
                r, v = tile_shape(blocks, rows, registers)
                assert blocks % v == 0 and rows % r == 0 and r * v + v <= registers
    assert tile_shape(4, 56) == (14, 2)
    assert tile_shape(32, 7) == (7, 4)
    assert tile_shape(2, 128) == (8, 2)  # not 16x1: one block feeds each broadcast once
    assert tile_shape(1, 128) == (16, 1)


@pytest.mark.parametrize("rule", [PackedDot(), Contraction()])
def test_padded_channels_never_written_past_the_output(rule):
    """A 1000-class int8 classifier (columns padded to 1008) with its epilogue: each rule's
    schedule stays inside the 1000-column output. TVM's reverse_compute_inline once merged the
    crop into the padded write-back (Contraction: 8 floats past the output, heap corruption
    in MobileNetV2)."""
    x = RNG.integers(0, 256, (1, 64)).astype(np.uint8)
    w = RNG.integers(-127, 128, (64, 1000)).astype(np.int8)
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_matmul_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    acc = k.matmul(xt, wt, 1000, 0)
    out = te.compute(acc.shape, lambda i, j: acc[i, j] * 3, name="epilogue")
    func = te.create_prim_func([xt, wt, out])
    with VNNI:
        sch = rule.apply(func, VNNI, False)
    lib = tvm.compile(sch.mod, target=VNNI)
    got, whole = guarded_output((1, 1000), "int32")
    skip_unless_runs_here(VNNI)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_array_equal(got.numpy(), (x.astype(np.int64) @ w) * 3)
    check_guard(whole, (1, 1000))


def test_residual_input_computed_in_the_epilogue():
    """int8 conv + residual add of ``dequantize(rq)`` (ResidualFromQuantized): the dequantize
    is not an input of the contraction, so PackedDot inlines it into the epilogue instead of
    running it as a pass of its own; the result is the integer reference plus the residual."""
    x = RNG.integers(0, 256, (1, 6, 6, 16)).astype(np.uint8)
    w = RNG.integers(-127, 128, (1, 1, 16, 32)).astype(np.int8)
    r = RNG.integers(0, 256, (1, 6, 6, 32)).astype(np.uint8)
    xt, rt = te.placeholder(x.shape, "uint8", "x"), te.placeholder(r.shape, "uint8", "r")
    packed = k.pack_conv_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    residual = te.compute(r.shape, lambda *i: (rt(*i).astype("int32") - 5).astype("float32")
                          * 0.5, name="dequantize")
    acc = k.conv2d_nhwc(xt, wt, 32, (1, 1), (0, 0, 0, 0), (1, 1), 3)
    # residual first: its block then precedes the contraction, as FuseTIR orders a fused
    # ``dequantize -> conv2d_int8 -> add`` (a block after it is an epilogue, inlined anyway)
    out = te.compute(acc.shape, lambda *i: residual(*i) + acc(*i).astype("float32") * 0.01,
                     name="epilogue")
    func = te.create_prim_func([rt, xt, wt, out])
    with VNNI:
        sch = PackedDot().apply(func, VNNI, False)
    assert not [b for b in sch.get_child_blocks(sch.get_sblock("root"))
                if sch.get(b).name_hint == "dequantize"]  # inlined
    lib = tvm.compile(sch.mod, target=VNNI)
    want = conv_reference(x, w, 1, 0, 1, 3, np.int64) * 0.01 + (r.astype(np.int64) - 5) * 0.5
    got = tvm.runtime.tensor(np.zeros(want.shape, np.float32))
    skip_unless_runs_here(VNNI)
    lib["main"](tvm.runtime.tensor(r), tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("ic, stays_on_the_stack", [(16, True), (512, False)])
def test_a_short_reductions_tile_buffer_stays_on_the_stack(ic, stays_on_the_stack):
    """A 1x1 int8 conv of 16 input channels (16 products per output) gets a tile of at most
    STACK_TILE_ACCUMULATORS, whose buffer LowerTVMBuiltin keeps on the stack: no
    TVMBackendAllocWorkspace call in its parallel tiles. A long reduction (512) keeps the
    larger tile and its workspace buffer. Both compute the integer reference."""
    from aotc.compiler.default_schedules import cpu_dot
    x = RNG.integers(0, 256, (1, 28, 28, ic)).astype(np.uint8)
    w = RNG.integers(-127, 128, (1, 1, ic, 96)).astype(np.int8)
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_conv_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    out = k.conv2d_nhwc(xt, wt, 96, (1, 1), (0, 0, 0, 0), (1, 1), 3)
    lib = _build(out, [xt, wt])
    asm = lib.mod.inspect_source("asm")
    assert ("TVMBackendAllocWorkspace@GOTPCREL" not in asm) == stays_on_the_stack
    assert cpu_dot.STACK_TILE_ACCUMULATORS * 16 * 4 < 1024
    got = tvm.runtime.tensor(np.zeros((1, 28, 28, 96), np.int32))
    skip_unless_runs_here(VNNI)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_array_equal(got.numpy(), conv_reference(x, w, 1, 0, 1, 3, np.int64))
