"""The packed bf16 and int8 contractions on AMX tiles (compiler/default_schedules/
amx_intrinsics.py, chosen by PackedDot and Attention for targets with AMX) against numpy on the
same bfloat16-rounded operands or integers: matmuls with 2x2, 2x1 and 1x1 tiles of 16, 8 and 12
rows, reductions whose step is under a tile row, column tiles grouped over K blocks, a batch
axis, padded output channels cropped in the kernel, an epilogue; convs (3x3, strided,
dilated, 1x1, 1 x k, a 3-channel stem and a patch embedding with taps merged into the
reduction); the attention kernel; guard elements past every output left untouched. Shapes
without a tile keep the vector kernel."""

import ml_dtypes
import numpy as np
import pytest
import tvm
import tvm_ffi
from kernel_helpers import (
    bf16_attention_kernel,
    build_scheduled,
    check_guard,
    conv_reference,
    crop_loops,
    guarded_output,
)
from tvm import s_tir, te
from tvm.s_tir.dlight.analysis import normalize_prim_func

from aotc.compiler import dot_kernels as k
from aotc.compiler.default_schedules import amx_intrinsics, cpu_dot
from aotc.compiler.default_schedules.cpu_dot import PackedDot
from aotc.compiler.passes.lowering import hoisted_tile_configs
from aotc.compiler.passes.lowering.overwritten_inits import drop_overwritten_inits
from aotc.targets import amx_bf16, x86

AMX_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
RNG = np.random.default_rng(0)
runs_amx = pytest.mark.skipif(not {"amx_tile", "amx_bf16"} <= x86.cpu_flags(),
                              reason="this CPU has no AMX-BF16 to run the kernels on")


def _skip_unless_amx(kind: str) -> None:
    """Skip the rest of a test (its run) on a CPU without AMX for ``kind`` ("bf16", "int8");
    else ask Linux for this process's AMX state."""
    if not {"amx_tile", f"amx_{kind}"} <= x86.cpu_flags():
        pytest.skip(f"this CPU has no AMX-{kind.upper()} to run the kernel on")
    assert x86.request_amx()


def _check_run(lib, inputs, want) -> None:
    """Run ``lib`` on ``inputs`` into an output with guard elements behind it: float32 sums
    within 1e-5 relative (1e-4 absolute) of ``want``, int32 ones equal; the guard untouched."""
    integer = np.issubdtype(want.dtype, np.integer)
    got, whole = guarded_output(want.shape, "int32" if integer else "float32")
    lib["main"](*[tvm.runtime.tensor(a) for a in inputs], got)
    if integer:
        np.testing.assert_array_equal(got.numpy(), want)
    else:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-4)
    check_guard(whole, want.shape)


def _rounded(values):
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


def _matmul_func(lead, m, kdim, n):
    xt = te.placeholder((*lead, m, kdim), "float32", "x")
    w = RNG.standard_normal((kdim, n)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    acc = k.matmul(k.to_bf16_bits(xt), wt, n, 0)
    out = te.compute(acc.shape, lambda *i: acc(*i) * 2.0 + 1.0, name="epilogue")
    return te.create_prim_func([xt, wt, out]), w, packed


@pytest.mark.parametrize("lead,m,kdim,n", [((), 32, 64, 64), ((2,), 16, 96, 48),
                                           ((), 24, 40, 32), ((), 8, 256, 1000),
                                           ((), 64, 24, 16),
                                           # 4 column tiles a call taking turns on 2 K blocks
                                           ((), 32, 512, 256)])
def test_amx_matmul_matches_numpy(lead, m, kdim, n):
    func, w, packed = _matmul_func(lead, m, kdim, n)
    lib = build_scheduled(PackedDot(), func, AMX_TARGET, "tdpbf16ps")
    asm = lib.mod.inspect_source("asm")
    assert "ldtilecfg" in asm and "tilestored" in asm
    _skip_unless_amx("bf16")
    x = RNG.standard_normal((*lead, m, kdim)).astype(np.float32)
    want = (_rounded(x).astype(np.float64) @ _rounded(w)) * 2 + 1
    _check_run(lib, [x, packed], want)


def _assert_column_groups(func) -> None:
    """PackedDot schedules ``func`` with the tile's column block taken as its group (fused
    index // (row tiles x group)) and its place in the group (fused index % group)."""
    with AMX_TARGET:
        sch = PackedDot().apply(func, AMX_TARGET, False)
    column = next(line for line in str(sch.mod["main"]).splitlines()
                  if "v1_o = T.axis.spatial(" in line)
    assert column.count("//") == 1 and column.count("%") == 1, column


@pytest.mark.parametrize("m,kdim,n", [(640, 2048, 512), (600, 1024, 1536)])
def test_amx_matmul_in_column_groups_matches_numpy(m, kdim, n):
    """An activation past AMX_PANEL_GROUP_BYTES and weights past pixels_first's budget: each
    tile of rows takes a group of column blocks in turn (the parallel loop: groups, rows,
    blocks of the group)."""
    func, w, packed = _matmul_func((), m, kdim, n)
    _assert_column_groups(func)
    lib = build_scheduled(PackedDot(), func, AMX_TARGET, "tdpbf16ps")
    _skip_unless_amx("bf16")
    x = RNG.standard_normal((m, kdim)).astype(np.float32)
    want = (_rounded(x).astype(np.float64) @ _rounded(w)) * 2 + 1
    _check_run(lib, [x, packed], want)


def test_amx_int8_matmul_in_column_groups_matches_integers():
    """The int8 form of the grouping above: 608 rows of 2,048 bytes, 640 columns."""
    m, kdim, n = 608, 2048, 640
    x = RNG.integers(0, 256, (m, kdim)).astype(np.uint8)
    w = RNG.integers(-127, 128, (kdim, n)).astype(np.int8)
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_matmul_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    acc = k.matmul(xt, wt, n, 3)
    func = te.create_prim_func([xt, wt, acc])
    _assert_column_groups(func)
    lib = build_scheduled(PackedDot(), func, AMX_TARGET, "tdpbusd")
    _skip_unless_amx("int8")
    # exact in float64: each sum is below 2^53
    want = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.int64)
    _check_run(lib, [x, packed], want)


def test_column_groups_only_for_long_activations():
    tile = cpu_dot._AmxTile("bf16", 16, 2, 2, 32, 2048)  # 32 rows x 32 columns, K 2,048
    # 4 row tiles: 512 KB of activation, in L2 whole
    assert cpu_dot._amx_column_group(tile, 4, 16) is None
    # 47 row tiles (Whisper's 1,500 frames): panels of 128 KB, 8 of them a group
    assert cpu_dot._amx_column_group(tile, 47, 16) == 8
    # 6 blocks: the largest divisor within the budget
    assert cpu_dot._amx_column_group(tile, 47, 6) == 3
    # a single block, or a conv: no groups
    assert cpu_dot._amx_column_group(tile, 47, 1) is None
    conv = cpu_dot._AmxTile("bf16", 16, 2, 2, 32, 2048, conv=(3, 3, 1, 1, 1))
    assert cpu_dot._amx_column_group(conv, 47, 16) is None


def _row_padded_matmul_func(rows: int, blocks: int, per_block: int, kdim: int, n: int):
    """x: ``rows`` rows held in ``blocks`` padded blocks of ``per_block`` (ConvertBF16's AMX
    padding: one block, ViT's 197 tokens in 224), cropped back in the kernel, then an
    epilogue."""
    xt = te.placeholder((blocks, per_block, kdim), "uint16", "x")
    w = RNG.standard_normal((kdim, n)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    acc = k.matmul(xt, wt, n, 0, rows=rows)
    out = te.compute(acc.shape, lambda *i: acc(*i) * 2.0 + 1.0, name="epilogue")
    return te.create_prim_func([xt, wt, out]), w, packed


@pytest.mark.parametrize("case", ["columns", "rows"])
def test_padding_is_cropped_right_after_each_tile(case):
    """Padded columns (1,000 in 63 blocks of 16) or rows (197 in one block of 224): the crop
    and its epilogue run in the tile's parallel task, over that tile's real part (32 rows at
    most), while its sums are in cache; not as a pass of their own over the whole output."""
    if case == "columns":
        func, w, packed = _matmul_func((), 8, 256, 1000)
    else:
        func, w, packed = _row_padded_matmul_func(197, 1, 224, 64, 96)
    with AMX_TARGET:
        sch = PackedDot().apply(func, AMX_TARGET, False)
    loops, tile = crop_loops(sch)
    assert loops[0].same_as(tile) and tile.kind == tvm.tirx.ForKind.PARALLEL
    assert int(loops[1].extent) <= 32  # the tile's rows, not all of them
    if case == "rows":
        lib = tvm.compile(sch.mod, target=AMX_TARGET)
        _skip_unless_amx("bf16")
        x = RNG.standard_normal((1, 224, 64)).astype(np.float32)
        want = (_rounded(x[0, :197]).astype(np.float64) @ _rounded(w)) * 2 + 1
        _check_run(lib, [k.bf16_bits(x), packed], want)


def test_rows_of_several_padded_blocks_keep_the_crop_as_a_pass_of_its_own():
    """Rows in 4 blocks of 8 (read at i // 8, i % 8): reverse_compute_at could not bound the
    crop to a tile's rows and made every tile crop all of them."""
    func, w, packed = _row_padded_matmul_func(29, 4, 8, 64, 96)
    with AMX_TARGET:
        sch = PackedDot().apply(func, AMX_TARGET, False)
    loops, tile = crop_loops(sch)
    assert not loops[0].same_as(tile)
    lib = tvm.compile(sch.mod, target=AMX_TARGET)
    _skip_unless_amx("bf16")
    x = RNG.standard_normal((4, 8, 64)).astype(np.float32)
    want = (_rounded(x.reshape(32, 64)[:29]).astype(np.float64) @ _rounded(w)) * 2 + 1
    _check_run(lib, [k.bf16_bits(x), packed], want)


# (input NHWC, kernel, output channels, stride, padding, dilation): 3x3 (2x2 and 1x2 tiles
# of 16 and 14 pixels), strided, dilated, 1x1 (no tap loops), a 1 x k Conv1d, padded
# output channels
@pytest.mark.parametrize("shape,kernel,oc,stride,pad,dilation", [
    ((1, 6, 32, 32), (3, 3), 64, 1, (1, 1), 1),
    ((1, 5, 29, 48), (3, 3), 32, 2, (1, 1), 1),
    ((1, 4, 18, 16), (3, 3), 16, 1, (1, 1), 2),
    ((2, 3, 28, 64), (1, 1), 64, 1, (0, 0), 1),
    ((1, 1, 43, 32), (1, 5), 48, 2, (0, 2), 1),
    ((1, 4, 16, 32), (3, 3), 40, 1, (1, 1), 1),
    # 3 channels (padded to 4): each row of taps and its channels one reduction
    ((1, 23, 39, 3), (7, 7), 64, 2, (3, 3), 1),
    ((1, 32, 224, 3), (16, 16), 48, 16, (0, 0), 1),
])
def test_amx_conv_matches_numpy(shape, kernel, oc, stride, pad, dilation):
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((*kernel, shape[-1], oc)).astype(np.float32)
    xt = te.placeholder(x.shape, "float32", "x")
    packed = k.pack_conv_weight(w, k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    acc = k.conv2d_nhwc(k.to_bf16_bits(xt), wt, oc, (stride, stride),
                        (pad[0], pad[1], pad[0], pad[1]), (dilation, dilation), 0)
    out = te.compute(acc.shape, lambda *i: tvm.te.max(acc(*i), 0.0), name="relu")
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, out]), AMX_TARGET,
                          "tdpbf16ps")
    _skip_unless_amx("bf16")
    want = np.maximum(conv_reference(_rounded(x), _rounded(w), stride, pad, dilation), 0)
    _check_run(lib, [x, packed], want)


# (input NHWC, kernel, output channels, padding (top, left, bottom, right), dilation,
# positions): ResNet's 7x7 and 14x14 stages (61 and 222 positions, computed 64 and 224),
# a non-square image with dilation 2, a batch of two, asymmetric padding, padded output
# channels (40), a 1x1 kernel over a padded image
@pytest.mark.parametrize("shape,kernel,oc,pad,dilation,positions", [
    ((1, 7, 7, 64), (3, 3), 64, (1, 1, 1, 1), 1, 64),
    ((1, 14, 14, 32), (3, 3), 32, (1, 1, 1, 1), 1, 224),
    ((1, 5, 11, 32), (3, 3), 48, (2, 2, 2, 2), 2, 96),
    ((2, 6, 6, 32), (3, 3), 32, (1, 1, 1, 1), 1, 64),
    ((1, 7, 9, 32), (3, 2), 40, (1, 0, 1, 1), 1, 96),
    ((1, 6, 6, 32), (1, 1), 32, (1, 1, 1, 1), 1, 64),
])
def test_amx_flat_conv_matches_numpy(shape, kernel, oc, pad, dilation, positions):
    """dot_kernels.conv2d_flat on AMX tiles of 16 consecutive positions of the flattened
    padded image (amx_intrinsics.register_conv's row_step): its real outputs, ReLU applied, against
    numpy's conv of the bf16-rounded operands; the output's guard elements untouched."""
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((*kernel, shape[-1], oc)).astype(np.float32)
    xt = te.placeholder(x.shape, "float32", "x")
    packed = k.pack_conv_weight(w, k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    acc = k.conv2d_flat(k.to_bf16_bits(xt), wt, oc, pad, (dilation, dilation), 0, positions)
    out = te.compute(acc.shape, lambda *i: tvm.te.max(acc(*i), 0.0), name="relu")
    sch = s_tir.Schedule(te.create_prim_func([xt, wt, out]))
    main = next(info for info in normalize_prim_func(sch)
                if sch.get(info.block_rv).name_hint == "aotc_bf16_contract")
    tile = cpu_dot._amx_tile(sch, main, k.BF16)
    row_step = dilation * (shape[2] + pad[1] + pad[3]) if kernel[0] > 1 else 0
    assert (tile.conv, tile.row_step) == ((*kernel, 1, 0, dilation), row_step) and \
        (tile.a_tiles, tile.rows) == (2, 16)
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, out]), AMX_TARGET,
                          "tdpbf16ps")
    _skip_unless_amx("bf16")
    want = np.maximum(_flat_reference(_rounded(x), _rounded(w), pad, dilation), 0)
    _check_run(lib, [x, packed], want)


def _flat_reference(x, w, pad, dilation):
    """NHWC stride-1 conv of ``x`` and HWIO ``w`` with padding (top, left, bottom, right)."""
    top, left, bottom, right = pad
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    kh, kw, _, oc = w.shape
    oh = xp.shape[1] - (kh - 1) * dilation
    ow = xp.shape[2] - (kw - 1) * dilation
    out = np.zeros((x.shape[0], oh, ow, oc))
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i * dilation:i * dilation + oh, j * dilation:j * dilation + ow] @ \
                w[i, j].astype(np.float64)
    return out


def _inits(func) -> dict[str, bool]:
    """{block name: whether it has an init} for the blocks marked SUMS_FROM_ZERO."""
    marked = {}

    def visit(block):
        if amx_intrinsics.SUMS_FROM_ZERO in block.annotations:
            marked[block.name_hint] = block.init is not None
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit))
    return marked


def test_tile_blocks_are_marked_and_lose_their_init():
    """The tensorized tile of a matmul and of a conv keeps the init tensorize made it with
    (zeros the tile's sums overwrite); marked SUMS_FROM_ZERO, DropOverwrittenInits drops it
    (the matmul and conv tests above run the kernels without it)."""
    matmul, _w, _packed = _matmul_func((), 32, 64, 64)
    xt = te.placeholder((1, 6, 32, 32), "float32", "x")
    wt = te.placeholder(k.pack_conv_weight(np.ones((3, 3, 32, 64), np.float32), k.BF16).shape,
                        "uint16", "w")
    conv = te.create_prim_func([xt, wt, k.conv2d_nhwc(k.to_bf16_bits(xt), wt, 64, (1, 1),
                                                      (1, 1, 1, 1), (1, 1), 0)])
    for func in (matmul, conv):
        with AMX_TARGET:
            scheduled = PackedDot().apply(func, AMX_TARGET, False).mod["main"]
        assert list(_inits(scheduled).values()) == [True]
        dropped = drop_overwritten_inits(scheduled)
        assert _inits(dropped) == {}
        assert not any(_with_init(dropped))


def _parallel_loops(func) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, lambda loop: found.append(loop)
                                        if loop.kind == tvm.tirx.ForKind.PARALLEL else None))
    return found


def _with_init(func) -> list[bool]:
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: found.append(b.init is not None)))
    return found


@pytest.mark.parametrize("m,kdim", [(6, 64), (16, 6), (5, 31)])
def test_shapes_without_a_tile_keep_the_vector_kernel(m, kdim):
    func, _w, _packed = _matmul_func((), m, kdim, 32)
    lib = build_scheduled(PackedDot(), func, AMX_TARGET, "vdpbf16ps")
    assert "tdpbf16ps" not in lib.mod.inspect_source("asm")


def test_amx_targets():
    assert amx_bf16(AMX_TARGET) == "amx-bf16"
    for mcpu in ("cooperlake", "znver4", "icelake-server"):
        assert amx_bf16(tvm.target.Target({"kind": "llvm", "mcpu": mcpu})) is None
    assert {"amx_tile", "amx_bf16"} <= x86.flags_needed({"mcpu": "sapphirerapids"})
    assert not {"amx_tile", "amx_bf16"} & x86.flags_needed({"mcpu": "cooperlake"})


def test_tile_config_words():
    words = amx_intrinsics._tile_config(12, 32, 8)
    raw = b"".join(w.to_bytes(4, "little") for w in words)
    assert raw[0] == 1
    colsb = [int.from_bytes(raw[16 + 2 * t:18 + 2 * t], "little") for t in range(8)]
    assert colsb == [64, 64, 64, 64, 32, 32, 64, 64]
    assert list(raw[48:56]) == [12, 12, 12, 12, 12, 12, 8, 8]


@pytest.mark.parametrize("rows, keys, depth", [(128, 128, 64), (200, 208, 64), (80, 80, 80)])
def test_amx_attention_matches_the_unscheduled_kernel(rows, keys, depth):
    """The bf16 attention kernel (compiler/attention_kernels.py) on AMX: both products as rows
    of AMX tiles (16-row tasks, or 8 where the padded rows are not a multiple of 16), the same
    numbers as the unscheduled kernel on the same bf16 operands. Each product loads its tile
    configuration once per task (HoistTileConfigs, as compile runs it), not once per step: a
    load before its loop, or one first in the task where both products share it (a reduction
    step of 32 keys in both)."""
    from tvm import s_tir

    from aotc.compiler.default_schedules.cpu_attention import Attention
    func, shapes = bf16_attention_kernel(rows, keys, depth)
    with AMX_TARGET:
        sch = Attention().schedule(s_tir.Schedule(func), AMX_TARGET)
    assert sch is not None
    scheduled = sch.mod["main"]
    configs = hoisted_tile_configs._configs(scheduled.body)
    assert len(configs) == 2  # one per product, in its loop
    hoisted = hoisted_tile_configs.hoist_tile_configs(scheduled)
    [task] = _parallel_loops(hoisted)
    loads = [s for s in task.body.seq if isinstance(s, tvm.tirx.AttrStmt)]
    assert [s.attr_key for s in loads] == [amx_intrinsics.TILE_CONFIG] * len(loads)
    assert len(loads) == len({str(c.value) for c in configs})
    assert len(hoisted_tile_configs._configs(hoisted.body)) == len(loads)
    lib = tvm.compile(tvm.IRModule({"main": hoisted}), target=AMX_TARGET)
    assert lib.mod.inspect_source("asm").count("tdpbf16ps") >= 2
    _skip_unless_amx("bf16")
    arrays = [k.bf16_bits(RNG.standard_normal(shape).astype(np.float32))
              for shape in shapes[:3]] + [RNG.standard_normal(shapes[3]).astype(np.float32)]
    results = []
    for built in (lib, tvm.compile(tvm.IRModule({"main": func}),
                                   target=tvm.target.Target({"kind": "llvm"}))):
        result = tvm.runtime.empty((1, 2, rows, depth), "float32")
        built["main"](*[tvm.runtime.tensor(a) for a in arrays], result)
        results.append(result.numpy())
    # the same sums in another order: a probability next to a bf16 rounding boundary may round
    # the other way (2^-8 of it)
    np.testing.assert_allclose(results[0], results[1], rtol=0.02, atol=0.02)
    cosine = float(np.sum(results[0] * results[1]) / np.linalg.norm(results[0]) /
                   np.linalg.norm(results[1]))
    assert cosine > 0.99999


# int8 (u8 activations, s8 weights, int32 sums: tdpbusd): 3x3 with the zero point as padding,
# strided, 1x1, a 3-channel stem (taps merged with channels), a matmul with an epilogue
@pytest.mark.parametrize("shape,kernel,oc,stride,pad,dilation", [
    ((1, 6, 32, 64), (3, 3), 64, 1, (1, 1), 1),
    ((1, 5, 29, 48), (3, 3), 32, 2, (1, 1), 1),
    ((2, 3, 28, 128), (1, 1), 48, 1, (0, 0), 1),
    ((1, 23, 39, 3), (7, 7), 64, 2, (3, 3), 1),
])
def test_amx_int8_conv_matches_integers(shape, kernel, oc, stride, pad, dilation):
    x = RNG.integers(0, 256, shape).astype(np.uint8)
    w = RNG.integers(-127, 128, (*kernel, shape[-1], oc)).astype(np.int8)
    zero = 7
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_conv_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    out = k.conv2d_nhwc(xt, wt, oc, (stride, stride), (pad[0], pad[1], pad[0], pad[1]),
                        (dilation, dilation), zero)
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, out]), AMX_TARGET,
                          "tdpbusd")
    _skip_unless_amx("int8")
    want = conv_reference(x, w, stride, pad, dilation, zero, np.int64)
    _check_run(lib, [x, packed], want)


@pytest.mark.parametrize("lead,m,kdim,n", [((), 32, 256, 64), ((2,), 16, 96, 1000)])
def test_amx_int8_matmul_matches_integers(lead, m, kdim, n):
    x = RNG.integers(0, 256, (*lead, m, kdim)).astype(np.uint8)
    w = RNG.integers(-127, 128, (kdim, n)).astype(np.int8)
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_matmul_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    offset = te.placeholder((n,), "int32", "offset")
    acc = k.matmul(xt, wt, n, 3)
    out = te.compute(acc.shape, lambda *i: (acc(*i) + offset[i[-1]]) * 2, name="epilogue")
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, offset, out]), AMX_TARGET,
                          "tdpbusd")
    _skip_unless_amx("int8")
    offsets = RNG.integers(-100, 100, n).astype(np.int32)
    want = (x.astype(np.int64) @ w.astype(np.int64) + offsets) * 2
    _check_run(lib, [x, packed, offsets], want)


def test_amx_matmul_over_symbolic_row_blocks():
    """A sequence of symbolic length arrives as symbolic blocks of 8 static rows
    (PrepackWeights, ConvertBF16): the tiles take the static rows, the blocks are an outer
    axis of the parallel loop; 1 and 5 blocks against numpy, with guard elements."""
    blocks = te.var("blocks", "int64")
    kdim, n = 96, 64
    xt = te.placeholder((blocks, 8, kdim), "float32", "x")
    w = RNG.standard_normal((kdim, n)).astype(np.float32)
    packed = k.pack_matmul_weight(w, k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    acc = k.matmul(k.to_bf16_bits(xt), wt, n, 0)
    out = te.compute(acc.shape, lambda *i: acc(*i) + 1.0, name="epilogue")
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, out]), AMX_TARGET,
                          "tdpbf16ps")
    _skip_unless_amx("bf16")
    for count in (1, 5):
        x = RNG.standard_normal((count, 8, kdim)).astype(np.float32)
        want = _rounded(x).astype(np.float64) @ _rounded(w) + 1
        _check_run(lib, [x, packed], want)


# run in a TVM worker (exec: a builtin, which the worker unpickles without this test module)
_RUN_LIBRARY = """
import numpy as np, tvm
module = tvm.runtime.load_module(LIBRARY)
out = tvm.runtime.empty((32, 64), "float32")
module["main"](tvm.runtime.tensor(np.full((32, 64), 0x3F80, np.uint16)),
               tvm.runtime.tensor(np.load(WEIGHT)), out)
np.save(RESULT, out.numpy())
"""


def test_tvm_workers_may_run_amx_kernels(tmp_path):
    """The tuner times kernels in TVM's worker processes, which export the kernel without
    aotc's load-time request for AMX state: a fresh process running one dies with SIGILL.
    aotc's workers (aotc.popen_worker) ask for the state when they start."""
    _skip_unless_amx("bf16")
    from tvm.support.popen_pool import PopenWorker

    from aotc.popen_worker import start_tvm_workers_here
    xt = te.placeholder((32, 64), "uint16", "x")
    packed = k.pack_matmul_weight(np.ones((64, 64), np.float32), k.BF16)
    wt = te.placeholder(packed.shape, "uint16", "w")
    lib = build_scheduled(PackedDot(), te.create_prim_func([xt, wt, k.matmul(xt, wt, 64, 0)]),
                          AMX_TARGET, "tdpbf16ps")
    library, weight = tmp_path / "amx.so", tmp_path / "w.npy"
    lib.export_library(str(library))
    np.save(weight, packed)
    start_tvm_workers_here()
    result = tmp_path / "out.npy"
    code = _RUN_LIBRARY.replace("LIBRARY", repr(str(library))).replace(
        "WEIGHT", repr(str(weight))).replace("RESULT", repr(str(result)))
    worker = PopenWorker()
    try:
        worker.send(exec, [code])
        worker.recv()
    finally:
        worker.kill()
    np.testing.assert_array_equal(np.load(result), 64.0)  # 64 products of ones each
