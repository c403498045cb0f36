"""Default CPU schedules: which rule takes which kernel, and that results stay right."""

import re
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import tvm
from helpers import check_against_onnxruntime
from kernel_helpers import (
    against_unmapped_pages,
    build_scheduled,
    exit_code_in_child,
    skip_unless_runs_here,
)
from onnx import TensorProto, helper
from tvm import te, topi
from tvm.script import tirx as T

from aotc.compiler import dot_kernels, symbolic_padding
from aotc.compiler.default_schedules import cpu_rows, first_schedule_that_works
from aotc.compiler.default_schedules.cpu_rules import Contraction, Generic, RowReduction, RowWise
from aotc.compiler.default_schedules.vector_allocations import allocated_in_vectorized_loops
from aotc.targets import resolve

TARGET = tvm.target.Target(resolve("x86").tvm_target)
# tests of a tile's shape build for a fixed ISA, not for whichever host runs them
AVX512 = tvm.target.Target(resolve("x86-avx512").tvm_target)


def _softmax_func(shape):
    x = te.placeholder(shape, name="x")
    return te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])


def test_row_reduction_takes_batched_rows_but_not_one_long_row():
    # [1, 1000]: dlight's Reduction recomputed max and sum for every output (O(n^2)).
    assert RowReduction().apply(_softmax_func((1, 1000)), TARGET, False) is None
    assert RowReduction().apply(_softmax_func((12, 128)), TARGET, False) is not None


def test_contraction_takes_matmul_not_softmax():
    a, b = te.placeholder((7, 13), name="a"), te.placeholder((13, 40), name="b")
    matmul = te.create_prim_func([a, b, topi.matmul(a, b)])
    assert Contraction().apply(matmul, TARGET, False) is not None
    assert Contraction().apply(_softmax_func((12, 128)), TARGET, False) is None


# rows of 96 and 48: the elementwise passes take 4 and 2 vectors a step on AVX2 (2 and 1 on
# AVX-512), 1000 and 129 one or none
@pytest.mark.parametrize("shape", [[1, 1000], [3, 12, 129], [4, 16, 96], [2, 3, 48]])
def test_softmax_matches_onnxruntime(shape, tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    path = tmp_path / "softmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("m, k, n", [(1, 512, 1000), (7, 13, 40), (128, 768, 96)])
def test_odd_matmul_shapes_match_onnxruntime(m, k, n, tmp_path):
    w = onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path, rtol=1e-4, atol=1e-4)


def test_bool_kernels_are_not_vectorized_and_compute_right(tmp_path):
    """A vectorized logical_not(x > 0) came out all True (TVM's LLVM codegen and bool
    vectors); torch's _safe_softmax returned NaN rows instead of zeros because of it."""
    import torch
    from helpers import check_against_torch

    class Masking(torch.nn.Module):
        def forward(self, x):
            keep = torch.logical_not(torch.eq(x, float("-inf")))
            return torch.ops.aten._safe_softmax(x, 1), keep, torch.logical_not(x > 0)

    x = torch.full((2, 3, 8), float("-inf"))
    x[0] = torch.randn(3, 8)
    check_against_torch(Masking(), (x,), tmp_path)


def test_every_kernel_of_a_cnn_gets_a_schedule(tmp_path):
    """A Python error inside a rule used to be swallowed like a shape TVM rejects: every conv
    of ResNet-18 then ran unscheduled, 3.8 s instead of 20 ms, with no error anywhere."""
    from onnx_builders import tiny_cnn

    import aotc
    metadata = aotc.compile(tiny_cnn(), target="x86", output=tmp_path / "cnn.so")
    assert metadata["unscheduled_kernels"] == []


def test_a_bug_in_a_rule_fails_the_compile_by_name():
    from aotc.compiler.default_schedules import ApplyRulesSafely

    class Broken:
        def apply(self, func, target, tunable):
            raise AttributeError("'TensorRegion' object has no attribute 'buffer'")

    mod = tvm.IRModule({"softmax": _softmax_func((2, 8))})
    # raised inside a TVM pass, it crosses TVM's FFI as RuntimeError with the message kept
    with tvm.target.Target({"kind": "llvm"}), pytest.raises(RuntimeError,
                                                            match="schedule rule Broken failed"):
        ApplyRulesSafely([Broken()])(mod)


def _update_loop_kinds(sch) -> list:
    """Loop kinds of the contraction's update block (after decompose_reduction)."""
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
              if sch.get(b).name_hint.endswith("_update")]
    assert len(blocks) == 1
    return [sch.get(loop).kind for loop in sch.get_loops(blocks[0])]


def test_ragged_contraction_is_padded_to_whole_vectors():
    # 197 tokens (ViT): prime, so no register tile divides it; the scores ran as scalar code.
    a, b = te.placeholder((3, 197, 64), name="a"), te.placeholder((3, 64, 197), name="b")
    func = te.create_prim_func([a, b, topi.nn.batch_matmul(a, b, transpose_b=False)])
    with TARGET:
        sch = Contraction().apply(func, TARGET, False)
    assert _update_loop_kinds(sch)[-1] == tvm.tirx.ForKind.VECTORIZED
    padded = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
              if sch.get(b).name_hint in ("a_pad", "b_pad")]
    assert len(padded) == 2  # both operands copied into buffers padded to whole tiles


def test_a_strided_ragged_conv_keeps_contraction_without_its_padded_tile():
    """TVM's pad_einsum refuses a strided read as an einsum: a stride-2 conv over 199 output
    columns (prime) with 36 channels (as Contraction gets convs PrepackWeights leaves) lost
    Contraction altogether and ran on the generic schedule, unvectorized (1.2 GFLOP/s where
    Contraction's ragged tile runs 11-12, one thread, AVX2). Contraction now keeps it."""
    x = te.placeholder((1, 1, 399, 48), name="x")
    w = te.placeholder((1, 3, 48, 36), name="w")
    func = te.create_prim_func([x, w, topi.nn.conv2d_nhwc(x, w, (1, 2), 0, 1)])
    with TARGET:
        sch = Contraction().apply(func, TARGET, False)
    assert sch is not None
    assert tvm.tirx.ForKind.VECTORIZED in _update_loop_kinds(sch)


@pytest.mark.parametrize("case", ["scores", "dense_bias_gelu", "strided_conv"])
def test_ragged_contractions_match_onnxruntime(case, tmp_path):
    """The padded result is copied back within bounds, with the epilogue applied there (an
    inlined copy once wrote the padded tile past the end of the output)."""
    rng = np.random.default_rng(0)
    if case == "scores":
        nodes = [helper.make_node("MatMul", ["x", "k"], ["y"])]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 197, 64]),
                  helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 3, 64, 197])]
        out, inits = [1, 3, 197, 197], []
    elif case == "strided_conv":  # 36 channels: left to Contraction, 199 columns: ragged
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2], kernel_shape=[3])]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 48, 399])]
        out = [1, 36, 199]
        inits = [onnx.numpy_helper.from_array(
            (rng.standard_normal((36, 48, 3)) / 12).astype(np.float32), "w")]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
                 helper.make_node("Add", ["h", "b"], ["hb"]),
                 helper.make_node("Erf", ["hb"], ["y"])]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [197, 192])]
        out = [197, 770]
        inits = [onnx.numpy_helper.from_array(rng.standard_normal((192, 770)).astype(np.float32),
                                              "w"),
                 onnx.numpy_helper.from_array(rng.standard_normal(770).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "ragged", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    path = tmp_path / f"{case}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path, rtol=1e-4, atol=1e-4)


def test_sinh_and_cosh_stay_scalar_and_compile(tmp_path):
    """TVM 0.27 has no vector lowering for sinh/cosh ("unknown intrinsic tirx.sinh")."""
    import torch
    from helpers import check_against_torch

    class SinhCosh(torch.nn.Module):
        def forward(self, x):
            return torch.sinh(x) + torch.cosh(x)

    check_against_torch(SinhCosh(), (torch.randn(4, 32),), tmp_path)


def test_depthwise_conv_reads_its_input_without_a_padded_copy(tmp_path):
    """A padded copy of the input cost a depthwise conv as much traffic as the conv itself."""
    x = te.placeholder((1, 16, 16, 32), name="x")
    w = te.placeholder((3, 3, 32, 1), name="w")
    conv = topi.nn.depthwise_conv2d_nhwc(x, w, [2, 2], [1, 1], [1, 1])
    with TARGET:
        sch = Contraction().apply(te.create_prim_func([x, w, conv]), TARGET, False)
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert not any("pad" in n.lower() for n in names), names
    assert _update_loop_kinds(sch)[-1] == tvm.tirx.ForKind.VECTORIZED


def _update_bindings(sch, fused: int) -> dict[str, int]:
    """The update block's spatial iterators at parallel iteration ``fused`` (every other loop at
    0), read from the printed schedule: s_tir has no Python visitor for block bindings."""
    script = sch.mod.script()
    block = script[script.index('T.sblock("group_conv2d_nhwc_update")'):]
    namespace = {"T": SimpleNamespace(int=int, int64=int)}
    values = {}
    for name, expr in re.findall(r"(v\w+) = T\.axis\.spatial\([^,]+, (.+)\)\n", block)[:4]:
        loops = set(re.findall(r"[a-z_][a-z0-9_]*", expr)) - {"T", "int64", "int"}
        scope = {loop: (fused if loop.endswith("_fused") else 0) for loop in loops}
        values[name] = eval(expr, {**namespace, **scope})  # noqa: S307 (our own printed TIR)
    return values


def test_depthwise_tile_keeps_accumulators_in_registers_and_runs_pixels_first():
    """Guarded taps (inlined padding) are branches: LLVM spilled a 16-accumulator tile (8 rows
    x 32 channels) at every tap. And each core reads the rows the 1x1 conv before wrote on it
    when the parallel tiles run pixels first (MobileNetV2 0.88x end to end)."""
    x = te.placeholder((1, 112, 112, 96), name="x")
    w = te.placeholder((3, 3, 1, 96), name="w")
    conv = topi.nn.group_conv2d_nhwc(x, w, 2, 1, 1, 96, "float32")
    with AVX512:
        sch = Contraction().apply(te.create_prim_func([x, w, conv]), AVX512, False)
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
              if sch.get(b).name_hint.endswith("_update")]
    loops = [sch.get(loop) for loop in sch.get_loops(blocks[0])]
    rows, columns = int(loops[-2].extent), int(loops[-1].extent)
    assert loops[-2].kind == tvm.tirx.ForKind.UNROLLED and columns == 32
    assert rows * columns // 16 <= 14, (rows, columns)
    first, second = _update_bindings(sch, 0), _update_bindings(sch, 1)
    channel = list(first)[-1]
    assert (first[channel], second[channel]) == (0, 32), (first, second)  # channel blocks inside


def test_depthwise_strided_conv_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((32, 1, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=32, strides=[2, 2],
                          pads=[1, 1, 1, 1])], "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 15, 15])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])], [w])
    path = tmp_path / "dw.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path, rtol=1e-5, atol=1e-5)


def test_narrow_columns_use_half_vectors_not_one_odd_vector():
    """24 output channels: three 8-lane vectors per row (one 24-lane vector, or 8-column
    tiles that re-read the input three times, ran MobileNetV2's projections at ~34 GFLOP/s)."""
    a, b = te.placeholder((3136, 144), name="a"), te.placeholder((144, 24), name="b")
    with AVX512:
        sch = Contraction().apply(te.create_prim_func([a, b, topi.matmul(a, b)]), AVX512, False)
    kinds = _update_loop_kinds(sch)
    assert kinds[-2:] == [tvm.tirx.ForKind.UNROLLED, tvm.tirx.ForKind.VECTORIZED]
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
              if sch.get(b).name_hint.endswith("_update")]
    assert int(sch.get(sch.get_loops(blocks[0])[-1]).extent) == 8
    assert int(sch.get(sch.get_loops(blocks[0])[-2]).extent) == 3


def _layer_norm_func(shape):
    x = te.placeholder(shape, name="x")
    gamma, beta = te.placeholder(shape[-1:], name="gamma"), te.placeholder(shape[-1:], name="beta")
    return te.create_prim_func([x, gamma, beta,
                                topi.nn.layer_norm(x, gamma, beta, axis=[-1], epsilon=1e-5)])


def test_row_wise_vectorizes_the_reductions_of_a_layer_norm():
    """BERT's layer norm ran its row sums as scalar chains (0.10 ms, 10 GFLOP/s); RowWise
    splits each into a vector of partial sums (rfactor) under one parallel loop over rows."""
    with TARGET:
        sch = RowWise().apply(_layer_norm_func((128, 768)), TARGET, False)
    assert sch is not None
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(sch.get_sblock("root"))}
    partials = [name for name in blocks if name.endswith("_rf_update")]
    assert len(partials) >= 1, list(blocks)
    for name in partials:
        assert sch.get(sch.get_loops(blocks[name])[-1]).kind == tvm.tirx.ForKind.VECTORIZED
    assert all(sch.get(sch.get_loops(b)[0]).kind == tvm.tirx.ForKind.PARALLEL
               for b in blocks.values())


@pytest.mark.parametrize("row, width", [(128, 64), (96, 32), (48, 16), (40, None)])
def test_row_wise_elementwise_passes_take_up_to_four_vectors_a_step(row, width):
    """An exp is one chain of about 25 dependent operations: one vector a step left AVX2 cores
    waiting on its latency (cpu_blocks.WIDE_VECTORS). Rows of 8, 6 and 3 vectors of 16 lanes
    take 4, 2 and 1 a step; a row of 40 is no whole number of vectors and stays scalar."""
    with AVX512:
        sch = RowWise().apply(_softmax_func((12, row)), AVX512, False)
    steps = {}
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loop = sch.get(sch.get_loops(block)[-1])
        steps[sch.get(block).name_hint] = (
            int(loop.extent) if loop.kind == tvm.tirx.ForKind.VECTORIZED else None)
    assert steps["T_softmax_exp"] == width and steps["T_softmax_norm"] == width, steps
    if width is not None:  # the partial max and sum stay one vector of 16
        assert steps["T_softmax_maxelem_rf_update"] == steps["T_softmax_expsum_rf_update"] == 16


@T.prim_func(s_tir=True)
def _padded_96_channels(x: T.Buffer((1, 6, 6, 96), "uint16"),
                        PadInput: T.Buffer((1, 8, 8, 96), "uint16")):
    T.func_attr({"tirx.noalias": True})
    for i0_i1_i2_i3_0_fused in T.parallel(192):
        for i3_1 in T.vectorized(32):
            with T.sblock("PadInput"):
                v_i0 = T.axis.spatial(1, 0)
                v_i1 = T.axis.spatial(8, i0_i1_i2_i3_0_fused // 24)
                v_i2 = T.axis.spatial(8, i0_i1_i2_i3_0_fused % 24 // 3)
                v_i3 = T.axis.spatial(96, i0_i1_i2_i3_0_fused % 3 * 32 + i3_1)
                T.reads(x[v_i0, v_i1 - 1, v_i2 - 1, v_i3])
                T.writes(PadInput[v_i0, v_i1, v_i2, v_i3])
                PadInput[v_i0, v_i1, v_i2, v_i3] = T.if_then_else(
                    1 <= v_i1 and v_i1 < 7 and 1 <= v_i2 and v_i2 < 7,
                    x[v_i0, v_i1 - 1, v_i2 - 1, v_i3], T.uint16(0))


@pytest.mark.parametrize("channels, dtype, width", [
    (96, "uint16", 32), (192, "uint16", 64), (48, "uint16", 16), (40, "float32", 8),
    (128, "uint16", 64), (64, "float32", 64)])
def test_a_zero_padded_copy_takes_power_of_two_vectors(channels, dtype, width):
    """The zero-padded copy before a conv reads under an if_then_else; LLVM scalarizes such a
    vector of 96 uint16 lanes (VGG's 112x112 stage, bf16: one vpinsrw and vpextrw per lane).
    Guarded copies take the largest power-of-two vector that divides the channels, up to four
    vectors of the lanes the rule was given; the other blocks keep their vectors
    (test_row_wise_elementwise_passes_take_up_to_four_vectors_a_step)."""
    x = te.placeholder((1, 6, 6, channels), dtype, name="x")
    func = te.create_prim_func([x, topi.nn.pad(x, [0, 1, 1, 0], [0, 1, 1, 0])])
    with AVX512:
        sch = Generic().apply(func, AVX512, False)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    loop = sch.get(sch.get_loops(block)[-1])
    assert loop.kind == tvm.tirx.ForKind.VECTORIZED and int(loop.extent) == width
    if channels == 96:
        tvm.ir.assert_structural_equal(sch.mod["main"],
                                       _padded_96_channels.with_attr("global_symbol", "main"))
    lib = tvm.compile(sch.mod, target=AVX512)
    # the kernel's functions (not the runtime's float16 helpers, __truncsfhf2 and the like)
    kernel = [f for f in lib.mod.inspect_source("asm").split(".type\t")[1:]
              if not f.startswith("__")]
    assert kernel and not any("vpinsrw" in f for f in kernel)
    skip_unless_runs_here(AVX512)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 60000, (1, 6, 6, channels)).astype(dtype)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full((1, 8, 8, channels), 7, dtype), dev)
    lib["main"](tvm.runtime.tensor(data, dev), out)
    np.testing.assert_array_equal(out.numpy(), np.pad(data, ((0, 0), (1, 1), (1, 1), (0, 0))))


def _transposing_copy_func(shape, perm, pad=0):
    """A copy that transposes ``x`` by ``perm`` and scales it as one block (the head split of
    an attention's Kt, a NCHW -> NHWC layout change), then with ``pad`` a second block that
    pads its last axis."""
    x = te.placeholder(shape, name="x")
    scaled = topi.multiply(topi.transpose(x, perm), tvm.tirx.const(0.125, "float32"))
    out = topi.nn.pad(scaled, [0] * len(shape), [0] * (len(shape) - 1) + [pad]) if pad else scaled
    return te.create_prim_func([x, out])


@pytest.mark.parametrize("shape, perm, pad, fused", [
    # Kt of 2 heads of 64 over 1,500 tokens: the token tiles go outside the head dim
    # (the pad's block, the scaled transpose inlined into it)
    ((1, 1500, 2, 64), (0, 2, 3, 1), 4, "i0_i1_i3_0_i2_fused"),
    # NCHW -> NHWC: channel tiles outside the image's columns
    ((1, 64, 56, 56), (0, 2, 3, 1), 0, "ax0_ax1_ax3_0_ax2_fused"),
    # the heads of V: the head dim stays innermost in both, nothing to reorder
    ((1, 1500, 2, 64), (0, 2, 1, 3), 0, "ax0_ax1_ax2_ax3_0_fused"),
])
def test_a_transposing_copy_reads_a_tile_of_rows_at_a_time(shape, perm, pad, fused):
    """Whisper's Kt copy gathered each vector from 32 token rows, and the next vector that
    used those rows' cache lines (the next of the 64 head dims) came 1,500 tokens later, after
    they were evicted: 4 GB/s. With the vectorized loop's outer part outside the loop that reads
    contiguously, a tile of rows is read whole while its lines are in L1."""
    func = _transposing_copy_func(shape, perm, pad)
    with AVX512:
        sch = Generic().apply(func, AVX512, False)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    assert len(blocks) == 1  # the pad, where there is one, computes the transpose itself
    loops = [sch.get(loop) for loop in sch.get_loops(blocks[0])]
    assert [loop.kind for loop in loops] == [tvm.tirx.ForKind.PARALLEL,
                                             tvm.tirx.ForKind.VECTORIZED]
    assert loops[0].loop_var.name == fused, sch.mod["main"]


@pytest.mark.parametrize("shape, perm", [((1, 300, 6, 64), [0, 2, 3, 1]),
                                         ((1, 64, 28, 28), [0, 2, 3, 1]),
                                         ((2, 7, 96, 5), [0, 3, 1, 2])])
def test_transposing_copies_match_onnxruntime(shape, perm, tmp_path):
    out_shape = [shape[p] for p in perm]
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
         helper.make_node("Mul", ["t", "c"], ["y"])], "transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [onnx.numpy_helper.from_array(np.array(0.125, np.float32), "c")])
    path = tmp_path / "transpose.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path, rtol=0, atol=0)


def test_a_row_reduction_of_a_ragged_length_runs_over_whole_vectors():
    """A sum over 37 with 16 lanes: 48 steps. The third vector reads the row's last 16
    elements (21..36, one load inside the row) and adds zero for the five (21..31) the second
    vector took. The loads are bound outside the select, where the simplifier cannot rewrite
    their index from its condition."""
    x = te.placeholder((4, 37), name="x")
    before = te.create_prim_func([x, topi.sum(x, axis=1)])

    @T.prim_func(s_tir=True)
    def expected(x: T.Buffer((4, 37), "float32"), x_red: T.Buffer((4,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for ax0, k1 in T.grid(4, 48):
            with T.sblock("x_red"):
                v_ax0, v_k1 = T.axis.remap("SR", [ax0, k1])
                T.reads(x[v_ax0, T.min(v_k1 - v_k1 % 16, 21) + v_k1 % 16])
                T.writes(x_red[v_ax0])
                with T.init():
                    x_red[v_ax0] = T.float32(0.0)
                step0 = T.float32()
                x_red[v_ax0] = x_red[v_ax0] + T.Let(
                    T.Select(T.min(v_k1 - v_k1 % 16, 21) + v_k1 % 16 >= v_k1 - v_k1 % 16,
                             step0, T.float32(0.0)),
                    where={step0: x[v_ax0, T.min(v_k1 - v_k1 % 16, 21) + v_k1 % 16]})

    after = cpu_rows.pad_row_reductions(before, lambda dtype: 16)
    tvm.ir.assert_structural_equal(after, expected.with_attr("global_symbol", "main"))
    # whole vectors already, or shorter than one: unchanged
    assert cpu_rows.pad_row_reductions(before, lambda dtype: 37).same_as(before)
    assert cpu_rows.pad_row_reductions(before, lambda dtype: 64).same_as(before)
    lib = tvm.compile(after, target=TARGET)
    data = np.random.default_rng(0).standard_normal((4, 37)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(4, np.float32))
    lib["main"](tvm.runtime.tensor(data), out)
    np.testing.assert_allclose(out.numpy(), data.astype(np.float64).sum(axis=1), rtol=1e-5)


def _variance_func(length: int):
    """Mean, then the variance about it (GroupNorm's statistics) of 64 rows of ``length``."""
    x = te.placeholder((1, 64, length), name="x")
    mean = topi.sum(x, axis=2, keepdims=True)
    centred = te.compute(x.shape, lambda a, b, c: x[a, b, c] - mean[a, b, 0] / float(length))
    var = topi.sum(centred * centred, axis=2, keepdims=True)
    return te.create_prim_func([x, te.compute(
        var.shape, lambda a, b, c: te.sqrt(var[a, b, c] / float(length)), name="std")])


def _variance_against_unmapped_pages(length: int):
    """Child process: the scheduled kernel on an input whose last byte is followed by an
    unmapped page (a read past a row's end at the last row kills the process)."""
    x, mapping = against_unmapped_pages((1, 64, length), at_end=True)
    x[...] = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32) + 5
    lib = build_scheduled(RowWise(), _variance_func(length), TARGET)
    out = tvm.runtime.tensor(np.zeros((1, 64, 1), np.float32))
    lib["main"](tvm.runtime.from_dlpack(x), out)
    np.testing.assert_allclose(out.numpy()[..., 0], x.astype(np.float64).std(axis=2),
                               rtol=1e-4)
    del mapping


@pytest.mark.parametrize("length", [3199, 197])
def test_a_ragged_row_reduction_is_vectorized_reads_inside_and_matches_numpy(length):
    """wav2vec2's GroupNorm over 3,199 steps: its reductions were scalar chains, a tenth of
    the rate of the same over 3,200. Padded to whole vectors they run as a vector of partial
    results; what they read stays inside the input (3,184 and 3,200 floats are whole 64-byte
    lines, so the input can end at an unmapped page)."""
    with TARGET:
        sch = RowWise().apply(_variance_func(length), TARGET, False)
    script = sch.mod["main"].script()
    # both reductions split into vectors of partial sums (cpu_rows.vectorize_partial)
    assert script.count('_rf_update")') == 2, script
    exit_code = exit_code_in_child(_variance_against_unmapped_pages, length)
    assert exit_code == 0, f"the kernel read outside its input or got a wrong answer " \
        f"(child exit code {exit_code})"


def test_row_wise_leaves_channel_means_to_generic():
    """A sum over H and W in NHWC (a global pool) reduces across the contiguous channels."""
    x = te.placeholder((1, 7, 7, 64), name="x")
    mean = te.create_prim_func([x, topi.sum(x, axis=[1, 2], keepdims=True)])
    assert RowWise().apply(mean, TARGET, False) is None


@pytest.mark.parametrize("shape", [[2, 50, 96], [3, 7, 13], [2, 5, 197]])
def test_layer_norm_matches_onnxruntime(shape, tmp_path):
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape[-1:]).astype(np.float32), n)
             for n in ("g", "b")]
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    path = tmp_path / "ln.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("after_conv", [False, True])
def test_a_long_elementwise_chain_compiles_in_seconds_and_matches_torch(after_conv, tmp_path):
    """45 alternating sigmoid-scale and multiply-add-relu layers fuse into one kernel (after a
    conv: its epilogue). Inlining every block of it multiplied the expression by the number of
    times each reader loads its producer: 8 layers took 25 s to compile, 10 took 560 s and
    9 GB, 45 were killed for memory; 10 after a conv ran past 100 s
    (cpu_blocks.MAX_INLINED_NODES): without the bound this test does not finish."""
    import torch
    from helpers import check_against_torch

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 16, 3, padding=1) if after_conv else None

        def forward(self, x):
            x = self.conv(x) if self.conv is not None else x
            for i in range(45):
                x = torch.relu(x * 1.01 + 0.5) if i % 2 else torch.sigmoid(x) * 2
            return x

    x = torch.randn(1, 8, 16, 16) if after_conv else torch.randn(1, 64)
    check_against_torch(Chain().eval(), (x,), tmp_path, rtol=1e-5, atol=1e-5)



def _parallel_loops(sch) -> int:
    return sum(sch.get(loop).kind == tvm.tirx.ForKind.PARALLEL
               for block in sch.get_child_blocks(sch.get_sblock("root"))
               for loop in sch.get_loops(block))


def _elementwise_func(shape):
    x = te.placeholder(shape, name="x")
    return te.create_prim_func([x, topi.add(topi.exp(x), 1.0)])


def _matmul_func(shape):
    a, b = te.placeholder(shape[:2], name="a"), te.placeholder(shape[1:], name="b")
    return te.create_prim_func([a, b, topi.matmul(a, b)])


@pytest.mark.parametrize("rule, func", [(Generic, _elementwise_func),
                                        (Contraction, _matmul_func),
                                        (RowWise, lambda shape: _layer_norm_func(shape[:2]))])
@pytest.mark.parametrize("shape, small", [((3, 12, 5), True), ((64, 96, 40), False)])
def test_small_kernels_run_on_the_calling_thread(rule, func, shape, small):
    """A loop nest under MIN_PARALLEL_WORK iterations gets no parallel loop (a pool launch
    costs more than the split saves: bench/parallel_grain.py); a larger one does."""
    from aotc.compiler.default_schedules.cpu_blocks import MIN_PARALLEL_WORK
    assert (int(np.prod(shape)) < MIN_PARALLEL_WORK) == small
    with TARGET:
        sch = rule().apply(func(shape), TARGET, False)
    assert sch is not None
    assert (_parallel_loops(sch) == 0) == small


def test_rules_for_reductions_refuse_kernels_without_one_before_their_analysis(monkeypatch):
    """Contraction, PackedDot, RowWise, Attention and RowReduction take only kernels with a
    reduction block; an elementwise kernel is refused by has_reduction, without the rule's
    own analysis (normalize_prim_func on a fresh schedule, once per rule)."""
    from aotc.compiler.default_schedules import cpu_blocks, cpu_contraction
    from aotc.compiler.default_schedules.cpu_blocks import has_reduction
    elementwise = _elementwise_func((4, 5))
    assert not has_reduction(elementwise)
    assert has_reduction(_matmul_func((4, 5, 6))) and has_reduction(_softmax_func((2, 8)))

    def analysis(*_args):
        raise AssertionError("the rule analysed a kernel without a reduction")
    monkeypatch.setattr(cpu_contraction, "normalize_prim_func", analysis)
    assert Contraction().apply(elementwise, TARGET, False) is None
    assert RowReduction().apply(elementwise, TARGET, False) is None
    assert Generic().apply(elementwise, TARGET, False) is not None
    assert cpu_blocks.CpuRule.needs_reduction is False


AVX2 = tvm.target.Target(resolve("x86-avx2").tvm_target)


def _argmax_func(shape):
    x = te.placeholder(shape, name="x")
    return te.create_prim_func([x, topi.argmax(x, axis=-1)])


def _rows_vectorized_over_their_reduction(func):
    """The schedule RowWise made before it checked which blocks a loop holds: the rows fused,
    four to a vector, with each row's reduction computed under the vectorized loop."""
    sch = tvm.s_tir.Schedule(func)
    reduction, copy_out = sch.get_child_blocks(sch.get_sblock("root"))
    rows = sch.fuse(*sch.get_loops(copy_out))
    _, lanes = sch.split(rows, factors=[None, 4])
    sch.compute_at(reduction, lanes, preserve_unit_loops=True)
    sch.vectorize(lanes)
    return sch


def test_a_loop_over_rows_with_their_reduction_under_it_is_not_vectorized():
    """An argmax over rows of 5: with AVX2's 8 int32 lanes, RowWise vectorized the loop over
    rows (16 = 2 x 8) that the argmax reduction is computed under. TVM gives the accumulators
    allocated inside that loop one element for all lanes, and every row got a wrong index."""
    func = _argmax_func((4, 4, 5))
    with AVX2:
        sch = RowWise().apply(func, AVX2, False)
    assert sch is not None
    assert allocated_in_vectorized_loops(sch.mod["main"]) == []
    kinds = [sch.get(loop).kind for block in sch.get_child_blocks(sch.get_sblock("root"))
             for loop in sch.get_loops(block)]
    assert tvm.tirx.ForKind.VECTORIZED not in kinds


def test_a_schedule_that_allocates_inside_a_vectorized_loop_is_refused():
    func = _argmax_func((3, 4, 5))
    bad = _rows_vectorized_over_their_reduction(func)
    assert allocated_in_vectorized_loops(bad.mod["main"]) == ["x_red_temp.v0", "x_red_temp.v1"]

    class Unsafe:
        def apply(self, func, target, tunable):
            return _rows_vectorized_over_their_reduction(func)

    with AVX2:
        chosen = first_schedule_that_works([Unsafe(), RowWise()], func, AVX2)
    assert chosen is not None
    assert allocated_in_vectorized_loops(chosen.mod["main"]) == []
    expected = RowWise().apply(func, AVX2, False)
    tvm.ir.assert_structural_equal(chosen.mod, expected.mod)


def _single_node_model(path, node, shape, outputs, inits=()):
    graph = helper.make_graph(
        [node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        outputs, list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("case", ["hardmax", "argmax", "layer_norm_with_mean"])
def test_short_row_reductions_match_onnxruntime_on_avx2(case, tmp_path):
    """Reductions over rows shorter than a vector, built for AVX2 (which every x86 host of
    these tests runs): the kernels that were wrong when AVX2 was the host."""
    shape = [2, 3, 4, 5]
    if case == "hardmax":
        node = helper.make_node("Hardmax", ["x"], ["y"], axis=-1)
        outputs, inits = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], []
    elif case == "argmax":
        node = helper.make_node("ArgMax", ["x"], ["y"], axis=-1, keepdims=0)
        outputs, inits = [helper.make_tensor_value_info("y", TensorProto.INT64, shape[:-1])], []
    else:
        rng = np.random.default_rng(0)
        inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape[-1:]).astype(np.float32),
                                              n) for n in ("g", "b")]
        node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"],
                                axis=-1)
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape),
                   helper.make_tensor_value_info("mean", TensorProto.FLOAT, shape[:-1] + [1]),
                   helper.make_tensor_value_info("inv", TensorProto.FLOAT, shape[:-1] + [1])]
    path = _single_node_model(tmp_path / f"{case}.onnx", node, shape, outputs, inits)
    check_against_onnxruntime(path, tmp_path, rtol=1e-5, atol=1e-5, target="x86-avx2")


POOL_INPUT = (1, 13, 13, 32)  # odd sides: the last window of each row is cut by the padding


def _max_pool_func(bits: bool):
    """A 3x3, stride-2 max pool padded by 1 of POOL_INPUT (NHWC), as LegalizeOps writes it;
    ``bits``: of the float32 values of bfloat16 bits (MaxPoolBF16's kernel)."""
    x = te.placeholder(POOL_INPUT, "uint16" if bits else "float32", name="x")
    values = dot_kernels.from_bf16_bits(x) if bits else x
    pool = topi.nn.pool2d(values, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], "max", layout="NHWC")
    return te.create_prim_func([x, pool])


def _max_pool_reference(x: np.ndarray) -> np.ndarray:
    padded = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=-np.inf)
    out = np.full((1, 7, 7, x.shape[-1]), -np.inf, np.float32)
    for dy in range(3):
        for dx in range(3):
            out = np.maximum(out, padded[:, dy:dy + 13:2, dx:dx + 13:2])
    return out


def _max_pool_against_unmapped_pages(bits: bool, at_end: bool):
    """Child process: the scheduled pool on an input that ends (or starts) at an unmapped page;
    a padding tap read from memory kills the process. Checks the numbers too."""
    x, mapping = against_unmapped_pages(POOL_INPUT, at_end, np.uint16 if bits else np.float32)
    values = np.random.default_rng(0).standard_normal(POOL_INPUT).astype(np.float32) - 3
    if bits:
        x[...] = dot_kernels.bf16_bits(values)
        values = (x.astype(np.uint32) << 16).view(np.float32)
    else:
        x[...] = values
    lib = build_scheduled(Generic(), _max_pool_func(bits), TARGET)
    out = tvm.runtime.tensor(np.zeros((1, 7, 7, 32), np.float32))
    lib["main"](tvm.runtime.from_dlpack(x), out)
    np.testing.assert_array_equal(out.numpy(), _max_pool_reference(values))
    del mapping


@pytest.mark.parametrize("bits", [False, True], ids=["float32", "bf16"])
def test_a_max_pool_reads_its_input_in_place(bits):
    """Before, the padded copy of the input (and MaxPoolBF16's widened one) were written whole
    and read again by the pool: now the pool is the only block, its padding a condition on
    the position."""
    func = _max_pool_func(bits)
    before = {b.name_hint for b in _blocks(tvm.s_tir.Schedule(func))}
    assert "pad_temp" in before and ("aotc_from_bf16" in before) == bits
    with TARGET:
        sch = Generic().apply(func, TARGET, False)
    assert {b.name_hint for b in _blocks(sch)} == {"pool_max_init", "pool_max_update"}


@pytest.mark.parametrize("at_end", [False, True], ids=["start", "end"])
@pytest.mark.parametrize("bits", [False, True], ids=["float32", "bf16"])
def test_a_max_pool_reads_nothing_outside_its_input_and_matches_numpy(bits, at_end):
    """Negative inputs (-3 on average): a padding tap read as 0 would show in the maximum."""
    exit_code = exit_code_in_child(_max_pool_against_unmapped_pages, bits, at_end)
    assert exit_code == 0, f"the pool read outside its input or got a wrong answer " \
        f"(child exit code {exit_code})"


def test_a_producer_that_computes_is_not_inlined_into_a_reduction():
    """exp before a spatial sum: inlined, it would be recomputed for each reader."""
    x = te.placeholder((1, 7, 7, 64), name="x")
    e = te.compute(x.shape, lambda *i: te.exp(x(*i)), name="e")
    func = te.create_prim_func([x, topi.sum(e, axis=[1, 2], keepdims=True)])
    with TARGET:
        sch = Generic().apply(func, TARGET, False)
    assert "e" in {b.name_hint for b in _blocks(sch)}


@pytest.mark.parametrize("before, inlined", [(0, True), (2, False)])
def test_a_pad_computes_what_it_pads_in_the_same_pass(before, inlined):
    """A head split (transpose and scale) then padded to whole vectors, as ViT's 197 tokens
    are for the attention kernel: two passes, the second reading the first's result back.
    A pad that reads each element once at its own index (padding after the end) computes the
    producer in place; one that shifts its reads (padding before) keeps the producer."""
    x = te.placeholder((1, 197, 2, 64), name="x")
    scaled = topi.multiply(topi.transpose(x, (0, 2, 3, 1)), tvm.tirx.const(0.125, "float32"))
    padded = topi.nn.pad(scaled, [0, 0, 0, before], [0, 0, 0, 11])
    func = te.create_prim_func([x, padded])
    with TARGET:
        sch = Generic().apply(func, TARGET, False)
    assert len(_blocks(sch)) == (1 if inlined else 2)
    lib = tvm.compile(sch.mod, target=TARGET)
    data = np.random.default_rng(0).standard_normal((1, 197, 2, 64)).astype(np.float32)
    out = tvm.runtime.tensor(np.full([int(d) for d in padded.shape], np.nan, np.float32))
    lib["main"](tvm.runtime.tensor(data), out)
    expected = np.pad(data.transpose(0, 2, 3, 1) * 0.125,
                      [(0, 0), (0, 0), (0, 0), (before, 11)])
    np.testing.assert_array_equal(out.numpy(), expected)


def test_rows_padded_to_one_block_compute_what_they_pad_in_the_same_pass():
    """The heads joined back ([12, 197, 64] -> [197, 768]) and padded as one block of 200 rows
    for the next matmul (PrepackWeights.row_blocks_packed), ViT's attention output: the pad
    reads row ``b * 200 + i`` of a block axis of one element, each element once."""
    x = te.placeholder((1, 12, 197, 64), name="x")
    joined = topi.reshape(topi.transpose(x, (0, 2, 1, 3)), (1, 197, 768))
    padded = symbolic_padding.pad_axis_to_blocks(joined, 1, 200)
    func = te.create_prim_func([x, padded])
    with TARGET:
        sch = Generic().apply(func, TARGET, False)
    assert len(_blocks(sch)) == 1
    lib = tvm.compile(sch.mod, target=TARGET)
    data = np.random.default_rng(0).standard_normal((1, 12, 197, 64)).astype(np.float32)
    out = tvm.runtime.tensor(np.full((1, 1, 200, 768), np.nan, np.float32))
    lib["main"](tvm.runtime.tensor(data), out)
    expected = np.pad(data.transpose(0, 2, 1, 3).reshape(1, 197, 768), [(0, 0), (0, 3), (0, 0)])
    np.testing.assert_array_equal(out.numpy(), expected[:, None])


def _blocks(sch) -> list:
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
