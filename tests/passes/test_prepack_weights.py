"""PrepackWeights on a small NHWC graph: a conv2d (+bias, ReLU) with 32 output channels, a
depthwise conv2d, a conv2d with 20 output channels, a matmul (+bias) with 16 rows and one
with 13 rows.

After the pass (AVX-512: 16 lanes): the 32-channel conv and the two matmuls are packed kernels
(call_tir conv2d_packed / matmul_packed / matmul_packed1) with weights [2, 3, 3, 3, 16, 1], [2,
80, 16, 1] and [1, 32, 16, 1]; the 13-row matmul (no row tile between 4 and 8) reads its rows
in place as one block of 16, rows past 13 reading row 12 (the kernel's aotc_dot_clamped_rows
block; no pad_rows kernel), and crops them in its kernel; the depthwise conv (no packed kernel)
and the 20-channel conv (32 computed: more than a third more) are still Relax ops; bias and
ReLU stay after the kernels. With 8 lanes (AVX2) the 20-channel conv is packed too (24
computed); with none (a GPU target) nothing changes. Numbers: equal to the original (same
products, same order).

An NCHW image (3 channels) transposed to NHWC for its conv: after the pass the packed conv
reads the NCHW tensor itself and the transpose is gone; a 16-channel NCHW input and a 7x7 stem
(a long reduction: the schedule copies its input anyway) keep their transpose. Numbers equal,
with and without spatial padding, unscheduled and (compiled by aotc.compile) against torch."""

import numpy as np
import pytest
import tvm
from relax_helpers import assert_lanes_keep_numbers, main_ops
from tvm import relax

from aotc.compiler import dot_kernels
from aotc.compiler.passes.layout import PrepackWeights

RNG = np.random.default_rng(0)


def _const(*shape):
    return relax.const(RNG.standard_normal(shape).astype(np.float32) * 0.3)


def _module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _const(3, 3, 3, 32), padding=[1, 1],
                                           data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, _const(32))))
            y = bb.emit(relax.op.nn.conv2d(y, _const(3, 3, 1, 32), padding=[1, 1], groups=32,
                                           data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.nn.conv2d(y, _const(1, 1, 32, 20), data_layout="NHWC",
                                           kernel_layout="HWIO"))
            y = bb.emit(relax.op.reshape(y, [16, 80]))
            y = bb.emit(relax.op.add(relax.op.matmul(y, _const(80, 32)), _const(32)))
            y = bb.emit(relax.op.strided_slice(y, axes=[0], begin=[0], end=[13]))
            out = bb.emit_output(relax.op.matmul(y, _const(32, 16)))
        bb.emit_func_output(out)
    return bb.get()


def _call_tirs(mod) -> list[relax.Call]:
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(
        e, relax.Call) and e.op.name == "relax.call_tir" else None)
    return calls


def _kernels(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_structure():
    after = PrepackWeights(16)(_module())
    ops = main_ops(after)
    assert ops.count("relax.nn.conv2d") == 2   # depthwise and the 20-channel one
    assert ops.count("relax.matmul") == 0
    kernels = _kernels(after)
    assert sorted(kernels) == ["conv2d_packed", "matmul_packed", "matmul_packed1"]
    calls = {call.args[0].name_hint: call for call in _call_tirs(after)}
    shapes = {name: [int(d) for d in call.args[1].fields[1].value.shape]
              for name, call in calls.items() if "packed" in name}
    assert shapes == {"conv2d_packed": [2, 3, 3, 3, 16, 1], "matmul_packed": [2, 80, 16, 1],
                      "matmul_packed1": [1, 32, 16, 1]}
    rows = calls["matmul_packed1"].args[1].fields[0].ty.shape
    assert [int(d) for d in rows] == [13, 32]  # read in place
    sch = tvm.s_tir.Schedule(kernels["matmul_packed1"])
    block = sch.get(sch.get_sblock(dot_kernels.CLAMPED_ROWS_BLOCK))
    assert [int(d) for d in block.writes[0].source.shape] == [1, 16, 32]  # one block of 16
    assert [int(d) for d in calls["matmul_packed1"].ty.shape] == [13, 16]
    assert ops.count("relax.add") == 2 and ops.count("relax.nn.relu") == 1


def test_lanes_follow_the_target():
    assert sorted(_kernels(PrepackWeights(8)(_module()))) == \
        ["conv2d_packed", "conv2d_packed1", "matmul_packed", "matmul_packed1"]
    before = _module()
    tvm.ir.assert_structural_equal(PrepackWeights(None)(before), before)


def test_numbers_unchanged():
    before = _module()
    x = RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    assert_lanes_keep_numbers(PrepackWeights, before, x, (16, 8, 4), 1e-5)


def _nchw_module(channels: int, padding: int, kernel: int = 3):
    """NCHW input -> permute_dims to NHWC -> conv2d kernel x kernel /2 (32 outputs), as
    ConvertLayoutNHWC leaves a model's stem."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, 10, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
            y = bb.emit(relax.op.nn.conv2d(y, _const(kernel, kernel, channels, 32),
                                           strides=[2, 2],
                                           padding=[padding] * 2, data_layout="NHWC",
                                           kernel_layout="HWIO"))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _packed_conv_input(mod) -> relax.Expr:
    (call,) = _call_tirs(mod)
    return call.args[1].fields[0]


def test_an_image_stem_reads_the_nchw_input_in_place():
    before = _nchw_module(3, 1)
    assert "relax.permute_dims" in main_ops(before)
    after = PrepackWeights(16)(before)
    assert "relax.permute_dims" not in main_ops(after)
    assert _packed_conv_input(after).same_as(after["main"].params[0])


@pytest.mark.parametrize("channels,kernel", [(16, 3), (3, 7)])
def test_a_wide_or_long_nchw_conv_keeps_its_transpose(channels, kernel):
    """16 channels: too many planes; 7x7x3 = 147 products: the schedule copies the input
    into a padded buffer anyway (reads_nchw_in_place)."""
    after = PrepackWeights(16)(_nchw_module(channels, 1, kernel))
    assert "relax.permute_dims" in main_ops(after)
    assert not _packed_conv_input(after).same_as(after["main"].params[0])


def test_nchw_stem_numbers_unchanged():
    for channels, padding in ((3, 1), (3, 0), (1, 1), (16, 1)):
        x = RNG.standard_normal((1, channels, 10, 12)).astype(np.float32)
        assert_lanes_keep_numbers(PrepackWeights, _nchw_module(channels, padding), x,
                                  (16, 8, 4), 1e-5)


@pytest.mark.parametrize("channels", [1, 3])
def test_a_compiled_nchw_stem_matches_torch_without_a_transpose_kernel(channels, tmp_path):
    """The scheduled kernel (guarded reads of the NCHW planes, odd image sizes, stride 2)
    against torch; in the built library the packed stem itself reads the NCHW image (no
    kernel transposes it first)."""
    import torch
    from helpers import check_against_torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(channels, 32, 3, stride=2, padding=1),
                              torch.nn.ReLU6(), torch.nn.Conv2d(32, 16, 1))
    model = check_against_torch(net, (torch.randn(1, channels, 37, 29),), tmp_path)
    image = {"dtype": "float32", "shape": [1, channels, 37, 29]}
    readers = [k["name"] for k in model.metadata["kernels"] if image in k["args"]]
    assert len(readers) == 1 and "conv2d_packed" in readers[0], readers


def _symbolic_rows_module():
    """[batch, seq, 64] @ [64, 48] + bias, batch and seq symbolic (a dynamic-axes export)."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, seq, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, _const(64, 48)), _const(48)))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_rows_are_padded_to_blocks_and_packed():
    """Before: the matmul stayed a Relax op (Contraction scheduled it unpacked, about half the
    speed of a fixed-length build). After: rows padded to blocks of 8 ([batch, (seq + 7) // 8,
    8, 64]), the packed kernel, the blocks joined and the padded rows sliced off; the same
    numbers at lengths that are and are not multiples of 8."""
    before = _symbolic_rows_module()
    after = PrepackWeights(16)(before)
    assert "relax.matmul" in main_ops(before) and "relax.matmul" not in main_ops(after)
    names = [call.args[0].name_hint for call in _call_tirs(after)]
    assert names == ["pad_rows", "matmul_packed"], names
    blocks = after["main"].body.blocks[0].bindings[0].var.ty.shape.values
    assert [str(d) for d in blocks[1:]] == ["(seq + T.int64(7)) // T.int64(8)", "T.int64(8)",
                                           "T.int64(64)"]
    assert "relax.strided_slice" in main_ops(after)
    for batch, seq in [(1, 1), (2, 13), (1, 16), (3, 37)]:
        x = RNG.standard_normal((batch, seq, 64)).astype(np.float32)
        got = _run_vm(after, x)
        assert got.shape == (batch, seq, 48)
        np.testing.assert_allclose(got, _run_vm(before, x), rtol=1e-5, atol=1e-5)


def _run_vm(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("channels, packed", [(1000, True), (200, True), (40, True), (24, True),
                                              (20, False)])
def test_output_channels_short_of_whole_blocks_are_padded(channels, packed):
    """Output channels padded to whole blocks of 16 with up to a third more get the packed
    kernel, cropped back: 1,000 classes (or a 50,257-word vocabulary) for almost nothing, 40
    channels computing 48 and 24 computing 32 (MobileNets' 1x1 convs: Contraction's kernels on
    such counts ran at less than half the packed rate); 20 channels (32 computed) stay with
    Contraction."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, _const(64, channels)))
        bb.emit_func_output(out)
    before = bb.get()
    after = PrepackWeights(16)(before)
    assert ("relax.matmul" not in main_ops(after)) == packed
    if packed:
        (call,) = _call_tirs(after)
        assert [int(d) for d in call.ty.shape.values] == [16, channels]
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    np.testing.assert_allclose(_run_vm(after, x), _run_vm(before, x), rtol=1e-5, atol=1e-5)


def _strided_conv_module(height: int, width: int, stride: int, pad: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, height, width, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(
                x, _const(1 if height == 1 else 3, 3, 16, 32), strides=[stride, stride],
                padding=[0 if height == 1 else pad, pad], data_layout="NHWC",
                kernel_layout="HWIO"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("height, width, stride, pad, columns, padded", [
    (1, 399, 2, 0, 199, 200),   # wav2vec2's strided feature convs: 199 is prime
    (1, 1599, 2, 0, 799, 800),  # 17 x 47
    (11, 11, 1, 1, 11, 12),     # a 2-D image whose rows wrap
])
def test_a_conv_width_no_tile_divides_is_computed_padded_and_cropped(
        height, width, stride, pad, columns, padded):
    """Before: the conv stayed a Relax op, Contraction's padded tile was refused (TVM's
    pad_einsum takes no strided read) and the generic schedule ran it at under 1 GFLOP/s.
    After: the packed kernel computes ``padded`` columns, reading zeros past the input's
    edge, and its crop block keeps ``columns``; the kernel is dot_kernels.conv2d_nhwc with
    padded_width, and the numbers equal the original's at 16, 8 and 4 lanes."""
    from aotc.compiler.passes.layout.prepack_weights import padded_width
    assert padded_width(columns) == padded
    before = _strided_conv_module(height, width, stride, pad)
    after = PrepackWeights(8)(before)
    assert "relax.nn.conv2d" in main_ops(before) and "relax.nn.conv2d" not in main_ops(after)
    (call,) = _call_tirs(after)
    assert [int(d) for d in call.ty.shape.values] == [1, height, columns, 32]
    bb = relax.BlockBuilder()  # the expected kernel, emitted as PrepackWeights emits its own
    x = relax.Var("x", relax.TensorType((1, height, width, 16), "float32"))
    with bb.function("main", [x]):
        out = bb.emit_te(dot_kernels.conv2d_nhwc, x, call.args[1].fields[1], 32,
                         [stride, stride], [0 if height == 1 else pad, pad] * 2, [1, 1], 0,
                         "NHWC", padded, primfunc_name_hint="conv2d_packed")
        bb.emit_func_output(out)
    expected = bb.get()["conv2d_packed"]
    kernel = after[call.args[0]]
    tvm.ir.assert_structural_equal(kernel.without_attr("global_symbol"),
                                   expected.without_attr("global_symbol"), map_free_vars=True)
    sch = tvm.s_tir.Schedule(kernel)
    accumulator = sch.get(sch.get_sblock(dot_kernels.fp32_format(8).block))
    assert [int(d) for d in accumulator.writes[0].source.shape] == [1, height, padded, 32]
    x = RNG.standard_normal((1, height, width, 16)).astype(np.float32)
    assert_lanes_keep_numbers(PrepackWeights, before, x, (16, 8, 4), 1e-5)


def _grouped_conv_module(groups: int, per_group_in: int, channels: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, 30, groups * per_group_in), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(
                x, _const(1, 9, per_group_in, channels), padding=[0, 4], groups=groups,
                data_layout="NHWC", kernel_layout="HWIO"))
        bb.emit_func_output(out)
    return bb.get()


def test_a_grouped_conv_whose_groups_fill_blocks_is_packed():
    """wav2vec2's positional conv (16 groups of 48 channels, 128 taps) ran under Contraction
    at a third of the packed kernels' speed. After: conv2d_packed, its weight packed as an
    ungrouped conv of 48 inputs (blocks of 8 output channels, none padded), each block
    reading its group's inputs (dot_kernels.conv2d_nhwc(groups=)); the numbers equal the
    original's at 16, 8 and 4 lanes. Groups of 4 channels (not whole blocks of 8) and a
    depthwise conv stay Relax ops."""
    before = _grouped_conv_module(4, 16, 64)
    after = PrepackWeights(8)(before)
    assert "relax.nn.conv2d" in main_ops(before) and "relax.nn.conv2d" not in main_ops(after)
    (call,) = _call_tirs(after)
    weight = call.args[1].fields[1]
    assert [int(d) for d in weight.value.shape] == [8, 1, 9, 16, 8, 1]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, 30, 64), "float32"))
    with bb.function("main", [x]):
        out = bb.emit_te(dot_kernels.conv2d_nhwc, x, weight, 64, [1, 1], [0, 4, 0, 4], [1, 1],
                         0, "NHWC", None, 4, primfunc_name_hint="conv2d_packed")
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(after[call.args[0]].without_attr("global_symbol"),
                                   bb.get()["conv2d_packed"].without_attr("global_symbol"),
                                   map_free_vars=True)
    x = RNG.standard_normal((1, 1, 30, 64)).astype(np.float32)
    assert_lanes_keep_numbers(PrepackWeights, before, x, (16, 8, 4), 1e-5)
    narrow = _grouped_conv_module(16, 4, 64)  # 4 output channels a group
    assert "relax.nn.conv2d" in main_ops(PrepackWeights(8)(narrow))
    depthwise = _grouped_conv_module(64, 1, 64)
    assert "relax.nn.conv2d" in main_ops(PrepackWeights(8)(depthwise))


@pytest.mark.parametrize("rows, padded", [(49, True), (14, True), (48, False), (35, False)])
def test_avx2_pads_matmul_rows_that_only_seven_divides(rows, padded):
    """Where a broadcast takes a register (AVX2) a tile of two blocks has at most 6 rows, so
    49 rows (a second of wav2vec2 audio) ran 7x1 tiles, each broadcast feeding one multiply-
    add: their rows are read as a multiple of 8 (clamped rows, then 4x2 tiles). 48 and 35 rows keep
    their tiles (4..6 divides them); without broadcast_register (AVX-512) nothing changes.
    The numbers equal the original's."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, _const(64, 32)))
        bb.emit_func_output(out)
    before = bb.get()
    avx2 = PrepackWeights(8, broadcast_register=True)(before)
    names = [call.args[0].name_hint for call in _call_tirs(avx2)]
    assert names == ["matmul_packed"], names
    kernel = avx2[_call_tirs(avx2)[0].args[0]]
    assert (dot_kernels.CLAMPED_ROWS_BLOCK in kernel.script()) == padded
    names = [call.args[0].name_hint for call in _call_tirs(PrepackWeights(16)(before))]
    assert names == ["matmul_packed"], names
    x = RNG.standard_normal((rows, 64)).astype(np.float32)
    np.testing.assert_allclose(_run_vm(avx2, x), _run_vm(before, x), rtol=1e-5, atol=1e-5)


def test_windowed_rows_are_flattened_instead_of_padded():
    """Swin's window attention projects [64 windows, 49 tokens, C]: on AVX2 49 rows take no
    two-block tile, and padding each window to 56 computes a seventh more. Flattened, the
    3,136 rows take 4x2 tiles with no padding: the kernel reads x as [3136, C] and its crop
    block writes [64, 49, N]. AVX-512 (7-row tiles of three blocks) keeps the windows. The
    numbers equal the original's."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 49, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, _const(32, 48)), _const(48)))
        bb.emit_func_output(out)
    before = bb.get()
    avx2 = PrepackWeights(8, broadcast_register=True)(before)
    (call,) = _call_tirs(avx2)
    assert call.args[0].name_hint == "matmul_packed"
    assert [int(d) for d in call.args[1].fields[0].ty.shape.values] == [3136, 32]
    assert [int(d) for d in call.ty.shape.values] == [64, 49, 48]
    sch = tvm.s_tir.Schedule(avx2[call.args[0]])
    accumulator = sch.get(sch.get_sblock(dot_kernels.fp32_format(8).block))
    assert [int(d) for d in accumulator.writes[0].source.shape] == [3136, 48]
    (call,) = _call_tirs(PrepackWeights(16)(before))
    assert [int(d) for d in call.args[1].fields[0].ty.shape.values] == [64, 49, 32]
    x = RNG.standard_normal((64, 49, 32)).astype(np.float32)
    np.testing.assert_allclose(_run_vm(avx2, x), _run_vm(before, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lead, flattened_avx2, flattened_avx512", [
    ((4, 197), True, False),   # 788 = 4 x 197: 4-row tiles, as deep as AVX2's padded blocks
    ((8, 197), True, True),    # 1,576 = 8 x 197: deep enough for AVX-512's 8-row blocks
    ((3, 197), False, False),  # 591: no tile divides it, padded
])
def test_rows_flatten_only_into_tiles_as_deep_as_padding_gives(lead, flattened_avx2,
                                                               flattened_avx512):
    """A batch of ViT's 197 tokens: rows padded to a multiple of 8 run 4-row tiles on AVX2 and
    8-row ones on AVX-512, so the flattened rows are taken only where they tile as deep."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*lead, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, _const(32, 48)))
        bb.emit_func_output(out)
    before = bb.get()
    for after, flattened in ((PrepackWeights(8, broadcast_register=True)(before), flattened_avx2),
                             (PrepackWeights(16)(before), flattened_avx512)):
        names = [call.args[0].name_hint for call in _call_tirs(after)]
        assert names == ["matmul_packed"], names
        kernel = after[_call_tirs(after)[0].args[0]]
        assert (dot_kernels.CLAMPED_ROWS_BLOCK in kernel.script()) == (not flattened)


@pytest.mark.parametrize("rows, lanes, broadcast_register, blocks", [
    (32, 16, False, 39),  # AVX-512: 37 blocks of 16 (prime) -> 39 (3 a tile: 8x3)
    (32, 8, True, 74),    # AVX2: 74 blocks of 8 (2 x 37) already take its 4x2 tile
    (1, 16, False, 38),   # one row: bound by reading the weight, one block more as before
])
def test_column_blocks_are_counted_for_the_register_tile(rows, lanes, broadcast_register,
                                                         blocks):
    """589 output columns: PrepackWeights packs the weight with the count of blocks whose
    register tile does the most work per real column (dot_kernels.packed_blocks), the extra
    columns zero and cropped. The numbers equal the original's."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, _const(64, 589)),
                                              _const(589)))
        bb.emit_func_output(out)
    before = bb.get()
    after = PrepackWeights(lanes, broadcast_register=broadcast_register,
                           registers=16 if broadcast_register else 32)(before)
    (call,) = [c for c in _call_tirs(after) if c.args[0].name_hint == "matmul_packed"]
    weight = call.args[1].fields[1]
    assert [int(d) for d in weight.ty.shape.values] == [blocks, 64, lanes, 1]
    x = RNG.standard_normal((rows, 64)).astype(np.float32)
    np.testing.assert_allclose(_run_vm(after, x), _run_vm(before, x), rtol=1e-5, atol=1e-5)
