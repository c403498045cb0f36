"""ConvertBF16 on a small NHWC graph: a conv2d (+bias, ReLU), a depthwise conv2d, a matmul
with a constant weight (+bias) and a matmul of two activations.

After the pass: the conv2d and the constant-weight matmul are bf16 kernels (call_tir named
conv2d_bf16 / matmul_bf16) fed by to_bf16 conversions, their biases and ReLU still float32
ops after them; the depthwise conv and the activation-by-activation matmul are still float32
Relax ops. With a weight threshold (2 MB a row), small weights stay float32 (nothing changes
here: every weight is under 1 MB); the default converts every site. Numbers: the converted module
equals the float32 one
computed on bfloat16-rounded inputs and weights, up to float32 rounding.

3x3 convs with a Winograd form, where WinogradConv runs: F(4x4) ones left float32 for it,
F(2x2) ones as bf16 Winograd kernels; their numbers near the float32 module's."""

import ml_dtypes
import numpy as np
import pytest
import tvm
from relax_helpers import assert_matches, main_ops, one_input_module, run_main
from tvm import relax

from aotc.compiler.quantize import ConvertBF16

RNG = np.random.default_rng(0)


def _weights():
    return {"conv": RNG.standard_normal((3, 3, 3, 20)).astype(np.float32) * 0.3,
            "bias": RNG.standard_normal(20).astype(np.float32),
            "depthwise": RNG.standard_normal((3, 3, 1, 20)).astype(np.float32) * 0.3,
            "dense": RNG.standard_normal((20, 12)).astype(np.float32) * 0.3}


def _module(weights):
    c = {name: relax.const(value) for name, value in weights.items()}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, c["conv"], padding=[1, 1], data_layout="NHWC",
                                           kernel_layout="HWIO"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, c["bias"])))
            y = bb.emit(relax.op.nn.conv2d(y, c["depthwise"], padding=[1, 1], groups=20,
                                           data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.reshape(y, [64, 20]))
            y = bb.emit(relax.op.matmul(y, c["dense"]))                     # [64, 12]
            scores = bb.emit(relax.op.matmul(y, relax.op.permute_dims(y)))  # two activations
            out = bb.emit_output(relax.op.matmul(scores, y))
        bb.emit_func_output(out)
    return bb.get()


def _kernels(mod):
    return sorted(gv.name_hint for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc))


def test_structure():
    before = _module(_weights())
    after = ConvertBF16(True, bytes_per_row=0)(before)
    ops = main_ops(after)
    assert ops.count("relax.nn.conv2d") == 1  # the depthwise one
    assert ops.count("relax.matmul") == 2     # the two activation-by-activation ones
    assert _kernels(after) == ["conv2d_bf16", "matmul_bf16", "to_bf16", "to_bf161"]
    assert ops.count("relax.add") == 1 and ops.count("relax.nn.relu") == 1  # float32, after
    conv = [f for gv, f in after.functions_items() if gv.name_hint == "conv2d_bf16"][0]
    assert [str(p.ty.dtype) for p in conv.params][:2] == ["uint16", "uint16"]


def test_threshold_and_disabled_leave_the_module():
    before = _module(_weights())
    tvm.ir.assert_structural_equal(ConvertBF16(True, bytes_per_row=2 << 20)(before), before)
    tvm.ir.assert_structural_equal(ConvertBF16(False)(before), before)
    tvm.ir.assert_structural_equal(ConvertBF16(True)(before),  # the default: every site
                                   ConvertBF16(True, bytes_per_row=0)(before))


def test_rows_without_a_tile_are_padded_to_blocks():
    """197 rows (ViT's tokens): the bf16 matmul reads them padded to one block of 200 and crops
    them (its crop then reads row i as row i: cpu_dot crops right after each tile)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 197, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(
                RNG.standard_normal((64, 32)).astype(np.float32))))
        bb.emit_func_output(out)
    after = ConvertBF16(True)(bb.get())
    assert _kernels(after) == ["matmul_bf16", "pad_rows", "to_bf16"]
    padded = [f for gv, f in after.functions_items() if gv.name_hint == "pad_rows"][0]
    assert [int(d) for d in padded.params[1].ty.shape] == [1, 1, 200, 64]


def test_numbers_match_bfloat16_rounded_float32():
    weights = _weights()
    x = RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    got = run_main(ConvertBF16(True, bytes_per_row=0)(_module(weights)), x)
    # reference: what the kernels compute, float32 sums of bfloat16-rounded operands; the
    # activation matmul's input (the first dense's output) is rounded there too
    rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) if k in ("conv", "dense")
               else v for k, v in weights.items()}
    want = run_main(_module(rounded), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    exact = run_main(_module(weights), x)
    cos = float((got * exact).sum() / np.linalg.norm(got) / np.linalg.norm(exact))
    assert cos > 0.999


def _winograd_module(weights):
    """x 28x28x16 -> 3x3 conv (F(4x4): 49 tiles of 4) -> stride-2 3x3 conv to 14x14x32 (no
    Winograd form) -> 3x3 conv (F(2x2): 49 tiles of 2) -> 1x1 conv."""
    c = {name: relax.const(value) for name, value in weights.items()}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 28, 28, 16), "float32"))

    def conv(y, w, stride=1, pad=1):
        return bb.emit(relax.op.nn.conv2d(y, c[w], strides=[stride, stride], padding=[pad] * 2,
                                          data_layout="NHWC", kernel_layout="HWIO"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(conv(x, "f4")))
            y = bb.emit(relax.op.nn.relu(conv(y, "down", stride=2)))
            y = bb.emit(relax.op.nn.relu(conv(y, "f2")))
            out = bb.emit_output(relax.op.nn.conv2d(y, c["pointwise"], data_layout="NHWC",
                                                    kernel_layout="HWIO"))
        bb.emit_func_output(out)
    return bb.get()


def _winograd_weights():
    shapes = {"f4": (3, 3, 16, 16), "down": (3, 3, 16, 32), "f2": (3, 3, 32, 32),
              "pointwise": (1, 1, 32, 16)}
    return {k: (RNG.standard_normal(s) / np.sqrt(np.prod(s[:-1]))).astype(np.float32)
            for k, s in shapes.items()}


def _calls(mod):
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(
        (e.args[0].name_hint, [[int(d) for d in a.ty.shape] for a in e.args[1].fields]))
        if isinstance(e, relax.Call) and e.op.name == "relax.call_tir" else None)
    return calls


def test_winograd_sites_f4_left_float32_f2_as_bf16_winograd():
    """With WinogradConv to run (``winograd``): the F(4x4) conv stays a Relax conv2d for it;
    the F(2x2) one becomes winograd_input (bfloat16 bits out, opaque to FuseOps) ->
    winograd_matmul_bf16 (weights [16 positions, 32/16, 32/2, 16, 2]) -> winograd_output;
    the strided and the 1x1 conv are direct bf16 kernels. Without it, all four are direct."""
    weights = _winograd_weights()
    before = _winograd_module(weights)
    after = ConvertBF16(True, winograd=True)(before)
    assert main_ops(after).count("relax.nn.conv2d") == 1
    assert [name for name, _ in _calls(after)] == [
        "to_bf16", "conv2d_bf16", "winograd_input", "winograd_matmul_bf16", "winograd_output",
        "to_bf161", "conv2d_bf161"]
    shapes = dict(_calls(after))
    assert shapes["winograd_matmul_bf16"] == [[16, 49, 32], [16, 2, 16, 16, 2]]
    kernels = {gv.name_hint: f for gv, f in after.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc)}
    assert int(kernels["winograd_input"].attrs["op_pattern"]) == 8
    assert str(kernels["winograd_input"].params[1].ty.dtype) == "uint16"
    direct = ConvertBF16(True)(before)
    assert main_ops(direct).count("relax.nn.conv2d") == 0
    assert sum(name.startswith("conv2d_bf16") for name, _ in _calls(direct)) == 4
    # a module with no Winograd site: the same either way
    plain = _module(_weights())
    tvm.ir.assert_structural_equal(ConvertBF16(True, winograd=True)(plain),
                                   ConvertBF16(True)(plain))


def test_bf16_winograd_numbers_near_float32():
    """The F(2x2) bf16 kernels (and the direct bf16 ones around them) against the float32
    module: bf16's error, not a transform's error grown (cosine > 0.9999)."""
    weights = _winograd_weights()
    x = np.maximum(RNG.standard_normal((1, 28, 28, 16)), 0).astype(np.float32)
    exact = run_main(_winograd_module(weights), x)
    for winograd in (True, False):
        got = run_main(ConvertBF16(True, winograd=winograd)(_winograd_module(weights)), x)
        assert_matches(got, exact, 0.9999, 0.02)


def _padded_input(mod, kernel: str) -> list[int] | None:
    """The static shape the call of ``kernel`` reads its activation in, or None without it."""
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(
        e, relax.Call) and e.op.name == "relax.call_tir" and e.args[0].name_hint == kernel
        else None)
    return [int(d) for d in calls[0].args[1].fields[0].ty.shape] if calls else None


@pytest.mark.parametrize("rows,padded", [(49, 64), (197, 224), (1500, 1504), (100, 128),
                                         (56, None), (128, None), (14, None)])
def test_amx_pads_matmul_rows_where_whole_tiles_take_fewer(rows, padded):
    """On AMX a matmul's rows are padded to whole 16-row tiles (in pairs past 32 rows) where
    that takes fewer tiles than the deepest tile that divides the rows: 49 rows (wav2vec2's
    frames) run 4 tiles, not 7 of 7 rows; 56 keeps 4 of 14 and 128 its 16-row tiles. The
    numbers equal the unpadded build's."""
    w = relax.const(RNG.standard_normal((64, 32)).astype(np.float32))
    before = one_input_module((1, rows, 64), lambda _bb, x: relax.op.matmul(x, w))
    amx = ConvertBF16(True, amx=True)(before)
    if padded is None:
        assert "pad_rows" not in _kernels(amx)
    else:
        assert _padded_input(amx, "matmul_bf16") == [1, 1, padded, 64]
    x = RNG.standard_normal((1, rows, 64)).astype(np.float32)
    np.testing.assert_allclose(run_main(amx, x), run_main(ConvertBF16(True)(before), x),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width,computed", [(23, 32), (199, 208), (49, None), (112, None)])
def test_amx_conv_width_no_tile_divides_is_computed_padded(width, computed):
    """On AMX a conv whose output width no tile of 7 to 16 rows divides (wav2vec2's strided
    convs over 799 and 199 steps; 23 here) computes whole 16-column tiles, reading zeros past
    the input's edge, and crops them in its kernel; widths a tile divides are computed as
    they are. The numbers equal those of the vector kernel's build (its own padding)."""
    w = relax.const(RNG.standard_normal((1, 3, 32, 48)).astype(np.float32) * 0.3)
    in_width = 2 * width + 1  # a stride-2 conv of 3 taps
    before = one_input_module((1, 1, in_width, 32), lambda _bb, x: relax.op.nn.conv2d(
        x, w, strides=[1, 2], data_layout="NHWC", kernel_layout="HWIO"))
    amx = ConvertBF16(True, amx=True)(before)
    conv = next(f for gv, f in amx.functions_items() if gv.name_hint == "conv2d_bf16")
    sch = tvm.s_tir.Schedule(conv)
    sums = sch.get(sch.get_sblock("aotc_bf16_contract"))
    assert int(sums.writes[0].source.shape[2]) == (computed or width)
    assert [int(d) for d in conv.params[-1].ty.shape] == [1, 1, width, 48]
    x = RNG.standard_normal((1, 1, in_width, 32)).astype(np.float32)
    np.testing.assert_allclose(run_main(amx, x), run_main(ConvertBF16(True)(before), x),
                               rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("size,kernel,padding,strides,positions", [
    (7, 3, 1, 1, 64), (14, 3, 1, 1, 224), (6, 3, 1, 1, 64),
    (56, 3, 1, 1, None), (28, 3, 1, 1, None), (7, 1, 0, 1, None), (14, 3, 1, 2, None)])
def test_amx_padded_stride1_convs_run_over_the_flattened_image(size, kernel, padding, strides,
                                                                positions):
    """On AMX a padded stride-1 conv whose output rows take one tile each (7 and 14 pixels;
    6 pads to one 16-pixel tile) runs over its flattened padded image: its sums block is
    [1, positions, channels], 32 positions a tile pair (ResNet's 7x7 stage: 64, not 7 tiles of
    7 pixels). Wide outputs (two tiles a row), 1x1 convs and strided ones keep the per-row
    kernel. The numbers equal the per-row build's (the vector kernel's here)."""
    w = relax.const(RNG.standard_normal((kernel, kernel, 32, 48)).astype(np.float32) * 0.3)
    before = one_input_module((1, size, size, 32), lambda _bb, x: relax.op.nn.conv2d(
        x, w, strides=[strides, strides], padding=[padding] * 4, data_layout="NHWC",
        kernel_layout="HWIO"))
    amx = ConvertBF16(True, amx=True)(before)
    conv = next(f for gv, f in amx.functions_items() if gv.name_hint == "conv2d_bf16")
    sch = tvm.s_tir.Schedule(conv)
    sums = [int(d) for d in sch.get(sch.get_sblock("aotc_bf16_contract")).writes[0].source.shape]
    out = (size + 2 * padding - kernel) // strides + 1
    assert sums == ([1, positions, 48] if positions else [1, out, out, 48])
    assert [int(d) for d in conv.params[-1].ty.shape] == [1, out, out, 48]
    x = RNG.standard_normal((1, size, size, 32)).astype(np.float32)
    np.testing.assert_allclose(run_main(amx, x), run_main(ConvertBF16(True)(before), x),
                               rtol=1e-5, atol=1e-5)
