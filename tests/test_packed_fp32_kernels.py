"""The prepacked float32 kernels (dot_kernels.fp32_format, PrepackWeights) scheduled by
PackedDot, against numpy: conv2d with stride, dilation and padding, a matmul with leading
axes and one row (a classifier), at AVX-512's 16 lanes and AVX2's 8; the output is never
written past its end; the code is vectorized FMAs; a short reduction's tile buffer stays
on the stack."""

import re

import numpy as np
import pytest
import tvm
from kernel_helpers import (
    against_unmapped_pages,
    build_scheduled,
    check_guard,
    crop_loops,
    exit_code_in_child,
    guarded_output,
    loops_spilling_vectors,
    skip_unless_runs_here,
)
from tvm import s_tir, te

from aotc.compiler import dot_kernels as k
from aotc.compiler.default_schedules.cpu_dot import MATMUL_K_UNROLL, PackedDot, tile_shape

TARGETS = {16: {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2},
           8: {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}}
RNG = np.random.default_rng(0)


def _build(func, lanes):
    return build_scheduled(PackedDot(), func, tvm.target.Target(TARGETS[lanes]), "vfmadd")


def _check_run(lib, target, x, packed, want, atol=1e-4):
    """Run ``lib`` on ``x`` and the packed weight where ``target`` runs; its output must match
    ``want`` with nothing written past it."""
    got, whole = guarded_output(want.shape)
    skip_unless_runs_here(target)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=atol)
    check_guard(whole, want.shape)


def _packed_against_onnxruntime(graph, tmp_path):
    """Build the ONNX ``graph`` for the host and for x86-avx2 (runs on any x86 host): outputs
    against onnxruntime, and a packed conv kernel among the library's."""
    import onnx
    from helpers import check_against_onnxruntime
    from onnx import helper
    path = tmp_path / f"{graph.name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    for target in ("x86", "x86-avx2"):
        model, _ = check_against_onnxruntime(path, tmp_path / target, rtol=1e-4, atol=1e-4,
                                             target=target)
        names = [kernel["name"] for kernel in model.metadata["kernels"]]
        assert any("conv2d_packed" in name for name in names), names


def _conv_kernel(x, w, lanes, stride=1, pad=1, dilation=1):
    """(the packed float32 conv of NHWC ``x`` by HWIO ``w`` as a PrimFunc, ``w`` packed for
    ``lanes``)."""
    packed = k.pack_conv_weight(w, k.fp32_format(lanes))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    out = k.conv2d_nhwc(xt, wt, w.shape[3], (stride, stride), (pad,) * 4, (dilation, dilation),
                        0)
    return te.create_prim_func([xt, wt, out]), packed


def _numpy_conv(x, w, stride=1, pad=1, dilation=1):
    """The conv of a 3x3 HWIO ``w`` over NHWC ``x``, in float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh = (xp.shape[1] - 2 * dilation - 1) // stride + 1
    ow = (xp.shape[2] - 2 * dilation - 1) // stride + 1
    want = np.zeros((1, oh, ow, w.shape[3]))
    for i in range(3):
        for j in range(3):
            want += xp[:, i * dilation:i * dilation + oh * stride:stride,
                       j * dilation:j * dilation + ow * stride:stride] @ w[i, j]
    return want


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("ic,oc,stride,pad,dilation", [(3, 32, 2, 1, 1), (32, 64, 1, 2, 2),
                                                        (16, 16, 1, 0, 1)])
def test_conv(lanes, ic, oc, stride, pad, dilation):
    x = RNG.standard_normal((1, 9, 10, ic)).astype(np.float32)
    w = RNG.standard_normal((3, 3, ic, oc)).astype(np.float32)
    func, packed = _conv_kernel(x, w, lanes, stride, pad, dilation)
    lib = _build(func, lanes)
    want = _numpy_conv(x, w, stride, pad, dilation)
    _check_run(lib, TARGETS[lanes], x, packed, want)


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("shape,n", [((2, 8, 30), 48), ((1, 512), 1008)])
def test_matmul(lanes, shape, n):
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((shape[-1], n)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.fp32_format(lanes))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    acc = k.matmul(xt, wt, n, 0)
    out = te.compute(acc.shape, lambda *i: te.max(acc(*i), 0.0), name="relu")
    lib = _build(te.create_prim_func([xt, wt, out]), lanes)
    want = np.maximum(x.astype(np.float64) @ w, 0)
    _check_run(lib, TARGETS[lanes], x, packed, want)


@pytest.mark.parametrize("pixels", [True, False])
def test_both_tile_orders(pixels):
    """Pixels first (small weights) and channel blocks first (large ones) compute the same
    conv; the default picks by the weights' size."""
    x = RNG.standard_normal((1, 14, 14, 32)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 32, 64)).astype(np.float32)
    func, packed = _conv_kernel(x, w, 16)
    target = tvm.target.Target(TARGETS[16])
    with target:
        sch = PackedDot().schedule(s_tir.Schedule(func), target, pixels=pixels)
    assert _channels_outermost(sch) != pixels
    lib = tvm.compile(sch.mod, target=target)
    got, whole = guarded_output((1, 14, 14, 64))
    skip_unless_runs_here(target)
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    want = _numpy_conv(x, w)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    check_guard(whole, want.shape)
    with target:
        assert not _channels_outermost(PackedDot().apply(func, target, False))  # 74 KB weights


def _channels_outermost(sch) -> bool:
    """Whether the fused parallel loop starts with the output-channel axis (ax2...)."""
    loop = sch.get_loops(sch.get_sblock("aotc_fp32x16_contract_update"))[0]
    return str(sch.get(loop).loop_var).startswith("ax2")


def _stem_schedule(ic: int, kernel: int):
    xt = te.placeholder((1, 224, 224, ic), "float32", "x")
    w = np.zeros((kernel, kernel, ic, 32), np.float32)
    wt = te.placeholder(k.pack_conv_weight(w, k.fp32_format(16)).shape, "float32", "w")
    out = k.conv2d_nhwc(xt, wt, 32, (2, 2), (kernel // 2,) * 4, (1, 1), 0)
    target = tvm.target.Target(TARGETS[16])
    with target:
        return PackedDot().apply(te.create_prim_func([xt, wt, out]), target, False)


def test_short_reduction_reads_its_padding_through_guards():
    """A 3-channel stem (reduction 27): its padded copy was a scalar loop, 0.15 of its 0.22 ms
    (MobileNetV2); guarded, the tile keeps at most 14 accumulators (16 spilled). A long
    reduction (ResNet-18's 7x7 stem, 147) keeps its padded copy."""
    sch = _stem_schedule(3, 3)
    blocks = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert not any("pad" in name for name in blocks), blocks
    loops = sch.get_loops(sch.get_sblock("aotc_fp32x16_contract_update"))
    rows, blocks_in = (int(sch.get(loop).extent) for loop in loops[-3:-1])
    assert rows * blocks_in <= 14, (rows, blocks_in)
    long = _stem_schedule(3, 7)
    assert "aotc_dot_pad" in {long.get(b).name_hint
                              for b in long.get_child_blocks(long.get_sblock("root"))}


@pytest.mark.parametrize("ic, stays_on_the_stack", [(160, True), (512, False)])
def test_a_short_reductions_tile_buffer_stays_on_the_stack(ic, stays_on_the_stack):
    """A 1x1 float32 conv of 160 input channels at 7x7 (MobileNetV2's 160->960) gets a tile of
    at most cpu_dot.STACK_TILE_ACCUMULATORS, whose buffer stays on the stack: no
    TVMBackendAllocWorkspace call in its parallel tiles (with 28 accumulators it ran 0.87x
    slower end to end on the Zen 4 host). A long reduction (512) keeps the larger tile and
    its workspace buffer. Both match numpy."""
    x = RNG.standard_normal((1, 7, 7, ic)).astype(np.float32)
    w = RNG.standard_normal((1, 1, ic, 192)).astype(np.float32)
    packed = k.pack_conv_weight(w, k.fp32_format(16))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    out = k.conv2d_nhwc(xt, wt, 192, (1, 1), (0,) * 4, (1, 1), 0)
    lib = _build(te.create_prim_func([xt, wt, out]), 16)
    asm = lib.mod.inspect_source("asm")
    assert ("TVMBackendAllocWorkspace@GOTPCREL" not in asm) == stays_on_the_stack
    got = tvm.runtime.tensor(np.zeros((1, 7, 7, 192), np.float32))
    skip_unless_runs_here(TARGETS[16])
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), x @ w[0, 0], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rows,tile_rows", [(8, 8), (16, 8), (12, 6), (7, 7), (49, 7), (5, 5)])
def test_matmul_tile_rows(rows, tile_rows):
    """Tiles of at most cpu_dot.MATMUL_TILE_ROWS (8) rows, as deep as a divisor of the rows
    allows (7 rows, ConvNeXt's 7x7 tokens: 7, not one row); the output matches numpy. K is
    long enough that the stack's cap on accumulators (a short reduction's) does not apply."""
    x = RNG.standard_normal((1, rows, 512)).astype(np.float32)
    w = RNG.standard_normal((512, 64)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.fp32_format(16))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    func = te.create_prim_func([xt, wt, k.matmul(xt, wt, 64, 0)])
    sch = PackedDot().schedule(s_tir.Schedule(func), tvm.target.Target(TARGETS[16]))
    # unrolled: the reduction's MATMUL_K_UNROLL steps, then the tile's rows
    unrolled = re.findall(r"T\.unroll\((\d+)\)", sch.mod.script())
    assert unrolled[:2] == [str(MATMUL_K_UNROLL), str(tile_rows)]
    lib = _build(func, 16)
    got = tvm.runtime.tensor(np.zeros((1, rows, 64), np.float32))
    skip_unless_runs_here(TARGETS[16])
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("k_steps, unrolled", [(512, True), (36, False), (8, False)])
def test_matmul_reduction_steps_unroll_around_the_tile(k_steps, unrolled):
    """The untuned float32 matmul runs its reduction in steps of MATMUL_K_UNROLL, unrolled
    around the register tile, where they divide it (36 and 8 keep one loop). A tuning
    trace keeps its loop (the design space tuned records replay in). The output matches
    numpy."""
    x = RNG.standard_normal((1, 16, k_steps)).astype(np.float32)
    w = RNG.standard_normal((k_steps, 48)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.fp32_format(16))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    func = te.create_prim_func([xt, wt, k.matmul(xt, wt, 48, 0)])
    target = tvm.target.Target(TARGETS[16])
    for tunable in (False, True):
        sch = s_tir.Schedule(func)
        with target:
            PackedDot().schedule(sch, target, tunable)
        update = sch.get_sblock(k.fp32_format(16).block + "_update")
        extents = [int(sch.get(loop).extent) for loop in sch.get_loops(update)]
        kinds = [sch.get(loop).kind for loop in sch.get_loops(update)]
        # the parallel tiles, the reduction (in steps, unrolled), rows, blocks, lanes
        if unrolled and not tunable:
            assert extents[1:3] == [k_steps // MATMUL_K_UNROLL, MATMUL_K_UNROLL], extents
            assert kinds[2] == tvm.tirx.ForKind.UNROLLED
        else:
            assert extents[1] == k_steps, extents
    lib = _build(func, 16)
    got = tvm.runtime.tensor(np.zeros((1, 16, 48), np.float32))
    skip_unless_runs_here(TARGETS[16])
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)


def test_avx2_tiles_leave_the_broadcast_a_register():
    """Without AVX-512 every broadcast activation is a register of its own, so the tile's
    accumulators and weight vectors leave it and one spare (R*V + V + 2 <= 16); among those
    tiles, the one with the largest share of multiply-adds per broadcast and weight load.
    AVX-512 tiles are unchanged."""
    for blocks in (1, 2, 3, 4, 8, 24):
        for rows in (1, 7, 14, 56, 128, 197):
            r, v = tile_shape(blocks, rows, 16, broadcast_register=True)
            assert blocks % v == 0 and rows % r == 0 and r * v + v + 2 <= 16
    assert tile_shape(8, 56, 16, broadcast_register=True) == (4, 2)  # not 14x1, not 7x2
    assert tile_shape(32, 14, 16, broadcast_register=True) == (2, 4)
    assert tile_shape(64, 7, 16, broadcast_register=True) == (7, 1)
    assert tile_shape(8, 56, 16, max_rows=4, broadcast_register=True) == (4, 2)
    assert tile_shape(4, 56) == (14, 2)


def test_avx2_conv_keeps_its_accumulators_in_registers():
    """A 3x3 conv of 64 channels on 56-pixel rows built for AVX2 (haswell): no multiply-add
    loop reads or writes the stack (the 7x2 tile it had spilled an accumulator there every
    step); the output matches numpy."""
    x = RNG.standard_normal((1, 12, 56, 64)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 64, 64)).astype(np.float32)
    func, packed = _conv_kernel(x, w, 8)
    lib = _build(func, 8)
    assert loops_spilling_vectors(lib.mod.inspect_source("asm")) == []
    target = tvm.target.Target(TARGETS[8])
    with target:
        sch = PackedDot().apply(func, target, False)
    loops = sch.get_loops(sch.get_sblock("aotc_fp32x8_contract_update"))
    assert [int(sch.get(loop).extent) for loop in loops[-3:-1]] == [4, 2]
    got = tvm.runtime.tensor(np.zeros((1, 12, 56, 64), np.float32))
    skip_unless_runs_here(TARGETS[8])
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), _numpy_conv(x, w), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("size,pad", [(1, 0), (3, 1)])
def test_avx2_conv_tile_rows_run_on_across_output_rows(size, pad):
    """A conv to 112 channels (14 blocks of 8) of a 14x14 output, built for AVX2: 14 pixels a
    row allow only 2x2 tiles, so the kernel is indexed by fused pixels (196) and takes 4 pixels
    x 2 blocks, tiles that wrap from one output row to the next included (the one at pixel 12
    covers 12, 13, 14, 15). Accumulators stay in registers, the write-back writes each tile's
    own pixels only, the output matches numpy and nothing is written past its end."""
    x = RNG.standard_normal((1, 14, 14, 48)).astype(np.float32)
    w = RNG.standard_normal((size, size, 48, 112)).astype(np.float32)
    func, packed = _conv_kernel(x, w, 8, pad=pad)
    target = tvm.target.Target(TARGETS[8])
    with target:
        sch = PackedDot().apply(func, target, False)
    update = sch.get_sblock("aotc_fp32x8_contract_update")
    assert [int(iv.dom.extent) for iv in sch.get(update).iter_vars][:2] == [196, 112]
    loops = sch.get_loops(update)
    assert [int(sch.get(loop).extent) for loop in loops[-3:]] == [4, 2, 8]
    # the write-back under a tile covers that tile's 4 pixels x 16 channels, whatever row they
    # are on (run one tile after another, a write-back of the rectangle around a wrapping
    # tile would still give the right output; in parallel it races)
    write_back, = sch.get_consumers(update)
    extents = [sch.get(loop).extent for loop in sch.get_loops(write_back)[1:]]
    assert all(isinstance(e, tvm.tirx.IntImm) for e in extents)
    assert np.prod([int(e) for e in extents]) == 4 * 16
    lib = _build(func, 8)
    assert loops_spilling_vectors(lib.mod.inspect_source("asm")) == []
    if size == 1:
        want = x.astype(np.float64) @ w[0, 0]
    else:
        want = _numpy_conv(x, w)
    _check_run(lib, TARGETS[8], x, packed, want, atol=1e-3)


def test_avx2_convs_keep_rows_where_a_row_has_a_good_tile():
    """56-pixel rows already take a 4x2 tile: the block keeps its height and width axes."""
    x = RNG.standard_normal((1, 12, 56, 64)).astype(np.float32)
    w = RNG.standard_normal((1, 1, 64, 64)).astype(np.float32)
    func, _ = _conv_kernel(x, w, 8, pad=0)
    target = tvm.target.Target(TARGETS[8])
    with target:
        sch = PackedDot().apply(func, target, False)
    iters = sch.get(sch.get_sblock("aotc_fp32x8_contract_update")).iter_vars
    assert [int(iv.dom.extent) for iv in iters][:3] == [12, 56, 64]


def test_an_odd_block_count_gets_multi_block_tiles(tmp_path):
    """A vocabulary-like head of 17 blocks of 8 columns (GPT-2's 50,257 words are 61 x 103 such
    blocks) is packed with one zero block more, so the AVX2 tile takes more than one block a
    step (with 17, one), and the kernel crops the padding: built for x86-avx2 (on any x86
    host), against onnxruntime."""
    import onnx
    from helpers import check_against_onnxruntime
    from onnx import TensorProto, helper, numpy_helper
    w = RNG.standard_normal((64, 8 * 17 - 1)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [12, w.shape[1]])],
        [numpy_helper.from_array(w, "w")])
    path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model, _ = check_against_onnxruntime(path, tmp_path, rtol=1e-4, atol=1e-4,
                                         target="x86-avx2")
    assert any("matmul_packed" in kernel["name"] for kernel in model.metadata["kernels"])
    packed = k.pack_matmul_weight(w, k.fp32_format(8),
                                  out=np.zeros(k.matmul_packed_shape(w.shape, k.fp32_format(8),
                                                                     whole_tiles=True),
                                               np.float32))
    xt = te.placeholder((12, 64), "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    target = tvm.target.Target(TARGETS[8])
    with target:
        sch = PackedDot().apply(te.create_prim_func([xt, wt, k.matmul(xt, wt, w.shape[1], 0)]),
                                target, False)
    loops = sch.get_loops(sch.get_sblock("aotc_fp32x8_contract_update"))
    assert int(sch.get(loops[-2]).extent) > 1  # blocks a step (3 of 18 here)


def _clamped_rows_func(rows: int, k_steps: int, n: int, block: int):
    w = np.random.default_rng(1).standard_normal((k_steps, n)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.fp32_format(16))
    xt = te.placeholder((rows, k_steps), "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    out = k.matmul_clamped_rows(xt, wt, n, 0, block)
    return te.create_prim_func([xt, wt, out]), w, packed


def _clamped_rows_against_unmapped_pages(rows: int, k_steps: int, n: int, block: int):
    """Child process: the kernel on an activation whose last byte is followed by an unmapped
    page (a read of a row past the last kills the process)."""
    func, w, packed = _clamped_rows_func(rows, k_steps, n, block)
    x, mapping = against_unmapped_pages((rows, k_steps), at_end=True)
    x[...] = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    lib = _build(func, 16)
    got, whole = guarded_output((rows, n))
    lib["main"](tvm.runtime.from_dlpack(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)
    check_guard(whole, (rows, n))
    del mapping


def test_padded_rows_are_read_in_place_clamped_to_the_last():
    """ViT's 197 tokens run as one block of 200 rows: the kernel reads row min(i, 196) of the
    activation itself (its clamped-rows block inlined into the contraction), so no padded
    copy is made; the 3 extra rows' results are cropped. It reads nothing past the
    activation (which ends at an unmapped page here), writes nothing past its output, and
    matches numpy."""
    func, _, _ = _clamped_rows_func(197, 64, 48, 200)
    target = tvm.target.Target(TARGETS[16])
    with target:
        sch = PackedDot().apply(func, target, False)
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert k.CLAMPED_ROWS_BLOCK not in blocks, blocks  # inlined: no copy of the rows
    assert "T.min(" in sch.mod["main"].script()
    skip_unless_runs_here(TARGETS[16])
    exit_code = exit_code_in_child(_clamped_rows_against_unmapped_pages, 197, 64, 48, 200)
    assert exit_code == 0, f"the kernel read outside its input or got a wrong answer " \
        f"(child exit code {exit_code})"


def test_a_prime_block_count_takes_three_block_avx512_tiles(tmp_path):
    """589 columns are 37 blocks of 16 (prime): before, the AVX-512 kernel took one block a
    step. Packed with 39 blocks (dot_kernels.packed_blocks), its tiles take three, and the
    crop writes whole vectors up to the last one (WholeVectorPredicates): built for
    x86-avx512, against onnxruntime."""
    import onnx
    from helpers import check_against_onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from aotc.targets import resolve, runs_here
    w = RNG.standard_normal((320, 589)).astype(np.float32)  # K past SHORT_REDUCTION
    bias = RNG.standard_normal(589).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "bias"], ["y"])], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 320])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [24, 589])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")])
    path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    why = runs_here(resolve("x86-avx512"))
    if why is not None:
        pytest.skip(why)
    model, _ = check_against_onnxruntime(path, tmp_path, rtol=1e-4, atol=1e-4,
                                         target="x86-avx512")
    (kernel,) = [k for k in model.metadata["kernels"] if "matmul_packed" in k["name"]]
    assert [arg["shape"] for arg in kernel["args"]][1] == [39, 320, 16, 1]


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("height, width, kernel, stride, pad", [
    (1, 399, 3, 2, 0),    # 199 columns, computed as 200
    (11, 11, 3, 1, 1),    # 11 columns a row, computed as 12, rows that wrap
])
def test_a_conv_computing_a_padded_width_crops_it(lanes, height, width, kernel, stride, pad):
    """padded_width (PrepackWeights, for widths no tile divides): the kernel reads zeros past
    the input's right edge for the extra columns and writes only the real ones: against
    numpy, nothing written past the output."""
    kh = 1 if height == 1 else kernel
    x = RNG.standard_normal((1, height, width, 16)).astype(np.float32)
    w = RNG.standard_normal((kh, kernel, 16, 32)).astype(np.float32)
    packed = k.pack_conv_weight(w, k.fp32_format(lanes))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    padding = (0 if height == 1 else pad, pad) * 2
    columns = (width + 2 * pad - kernel) // stride + 1
    out = k.conv2d_nhwc(xt, wt, 32, (stride, stride), padding, (1, 1), 0,
                        padded_width=columns + 1)
    lib = _build(te.create_prim_func([xt, wt, out]), lanes)
    xp = np.pad(x.astype(np.float64), ((0, 0), (padding[0],) * 2, (pad, pad), (0, 0)))
    rows = (xp.shape[1] - kh) // stride + 1
    want = np.zeros((1, rows, columns, 32))
    for i in range(kh):
        for j in range(kernel):
            want += xp[:, i:i + rows * stride:stride, j:j + columns * stride:stride] @ w[i, j]
    _check_run(lib, TARGETS[lanes], x, packed, want)


def test_a_strided_conv1d_of_a_prime_width_is_packed(tmp_path):
    """wav2vec2's feature extractor: Conv1d(512, 512, 3, stride 2) over 399 steps gives 199,
    prime. It ran on the generic schedule (TVM's pad_einsum refuses the strided read that
    Contraction's padded tile needs), at under 1 GFLOP/s; it is now a packed kernel over 200
    columns, cropped: built for the host and for x86-avx2 (runs on any x86 host), against
    onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper
    w = (RNG.standard_normal((64, 48, 3)) / 12).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2], kernel_shape=[3]),
         helper.make_node("Relu", ["c"], ["y"])], "strided",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 48, 399])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 199])],
        [numpy_helper.from_array(w, "w")])
    _packed_against_onnxruntime(graph, tmp_path)


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("per_in, taps", [(16, 9), (4, 3)])
def test_a_grouped_conv_reads_each_blocks_group(lanes, per_in, taps):
    """groups (PrepackWeights, groups of whole blocks): 4 groups of ``per_in`` inputs and 32
    outputs over 30 steps, padded; 4 x 3 is a short reduction, read through guards instead of
    a padded copy (cpu_contraction.INLINE_PRODUCERS_MAX_REDUCTION); against numpy, nothing
    written past the output."""
    groups, channels = 4, 128
    x = RNG.standard_normal((1, 1, 30, groups * per_in)).astype(np.float32)
    w = (RNG.standard_normal((1, taps, per_in, channels)) / 8).astype(np.float32)
    packed = k.pack_conv_weight(w, k.fp32_format(lanes))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    half = taps // 2
    out = k.conv2d_nhwc(xt, wt, channels, (1, 1), (0, half, 0, half), (1, 1), 0, groups=groups)
    lib = _build(te.create_prim_func([xt, wt, out]), lanes)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (half, half), (0, 0)))
    want = np.zeros((1, 1, 30, channels))
    per_out = channels // groups
    for g in range(groups):
        for j in range(taps):
            want[..., g * per_out:(g + 1) * per_out] += \
                xp[:, :, j:j + 30, g * per_in:(g + 1) * per_in] @ \
                w[0, j, :, g * per_out:(g + 1) * per_out]
    _check_run(lib, TARGETS[lanes], x, packed, want)


def test_a_grouped_conv1d_is_packed_and_matches_onnxruntime(tmp_path):
    """A wav2vec2-style positional conv (groups of 48 channels, a long kernel, same padding),
    for the host and for x86-avx2, against onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper
    w = (RNG.standard_normal((192, 48, 16)) / 24).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=4, kernel_shape=[16], pads=[8, 8])],
        "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 192, 49])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192, 50])],
        [numpy_helper.from_array(w, "w")])
    _packed_against_onnxruntime(graph, tmp_path)


@pytest.mark.parametrize("lanes", [16, 8])
def test_a_matmul_over_flattened_rows_writes_its_axes_back(lanes):
    """out_lead (PrepackWeights, windows whose rows no tile divides): 12 windows of 7 rows run
    as 84 rows and the crop block writes [12, 7, N]; against numpy, nothing written past the
    output."""
    x = RNG.standard_normal((84, 40)).astype(np.float32)
    w = RNG.standard_normal((40, 24)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.fp32_format(lanes), out=np.zeros(
        k.matmul_packed_shape(w.shape, k.fp32_format(lanes), whole_tiles=True), np.float32))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    lib = _build(te.create_prim_func([xt, wt, k.matmul(xt, wt, 24, 0, out_lead=[12, 7])]),
                 lanes)
    want = (x.astype(np.float64) @ w).reshape(12, 7, 24)
    _check_run(lib, TARGETS[lanes], x, packed, want)


@pytest.mark.parametrize("case", ["rows", "columns"])
def test_padding_is_cropped_right_after_each_tile(case):
    """Rows padded to one block (197 -> 200, PrepackWeights' single block) or columns padded
    to whole blocks (1,000 -> 1,008): the crop and its epilogue run in the tile's parallel
    task, over that tile's real rows and columns, not as a pass of their own over the whole
    output; against numpy, nothing written past the output."""
    rows, padded, n = (197, 200, 96) if case == "rows" else (8, 8, 1000)
    x = RNG.standard_normal((1, padded, 64)).astype(np.float32)
    x[:, rows:] = 0
    w = RNG.standard_normal((64, n)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.fp32_format(16))
    xt = te.placeholder((1, 1, padded, 64) if case == "rows" else x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    acc = k.matmul(xt, wt, n, 0, rows=rows if case == "rows" else None)
    out = te.compute(acc.shape, lambda *i: acc(*i) * 2.0 + 1.0, name="epilogue")
    func = te.create_prim_func([xt, wt, out])
    target = tvm.target.Target(TARGETS[16])
    with target:
        sch = PackedDot().apply(func, target, False)
    loops, tile = crop_loops(sch)
    assert loops[0].same_as(tile)
    assert int(loops[1].extent) <= 8  # the tile's rows, not all of them
    lib = _build(func, 16)
    want = (x[:, :rows].astype(np.float64) @ w) * 2 + 1
    got, whole = guarded_output(want.shape)
    skip_unless_runs_here(TARGETS[16])
    lib["main"](tvm.runtime.tensor(x.reshape([int(d) for d in xt.shape])),
                tvm.runtime.tensor(packed), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-3)
    check_guard(whole, want.shape)


def test_crops_that_no_tile_bounds_stay_a_pass_of_their_own():
    """Flattened rows given their axes back (read at i * 7 + j) and a conv over fused pixels
    whose tiles wrap to the next output row (the crop's region under a tile would be the
    rectangle around it, pixels other tasks write): the crop runs after all tiles, and the
    outputs match numpy."""
    x = RNG.standard_normal((84, 40)).astype(np.float32)
    w = RNG.standard_normal((40, 24)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.fp32_format(16), out=np.zeros(
        k.matmul_packed_shape(w.shape, k.fp32_format(16), whole_tiles=True), np.float32))
    xt = te.placeholder(x.shape, "float32", "x")
    wt = te.placeholder(packed.shape, "float32", "w")
    func = te.create_prim_func([xt, wt, k.matmul(xt, wt, 24, 0, out_lead=[12, 7])])
    target = tvm.target.Target(TARGETS[16])
    with target:
        loops, tile = crop_loops(PackedDot().apply(func, target, False))
    assert not loops[0].same_as(tile)
    _check_run(_build(func, 16), TARGETS[16], x, packed,
               (x.astype(np.float64) @ w).reshape(12, 7, 24))
    # 108 channels in 14 blocks of 8 over a 14x14 output: fused pixels on AVX2
    x = RNG.standard_normal((1, 14, 14, 48)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 48, 108)).astype(np.float32)
    func, packed = _conv_kernel(x, w, 8)
    target = tvm.target.Target(TARGETS[8])
    with target:
        sch = PackedDot().apply(func, target, False)
    update = sch.get_sblock("aotc_fp32x8_contract_update")
    assert int(sch.get(update).iter_vars[0].dom.extent) == 196  # pixels fused
    loops, tile = crop_loops(sch)
    assert not loops[0].same_as(tile)
    _check_run(_build(func, 8), TARGETS[8], x, packed, _numpy_conv(x, w), atol=1e-3)
