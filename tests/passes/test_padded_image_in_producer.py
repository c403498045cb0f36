"""PaddedImageInProducer on a module whose ``main`` doubles a 1 x 4 x 5 x 3 image and runs a
"taps" kernel on the result: it pads the image (dot_kernels' PAD_BLOCK: a row above and below,
two columns left and one right) and sums two of its taps; the same taps kernel also runs on
the input itself, which no kernel produced.

After: the doubling kernel writes into the padded buffer (``double_padded_out``: its output a
view at offset (1, 2) of a 6 x 8 parameter, the border stored by four loop nests), and the taps
kernel reads that buffer as its input, its pad block gone (``taps_padded_in``); the call on the
input keeps ``taps``. Numbers: equal to the original's, the border included (a pad value of 0.5
as well as 0). Left alone: a producer something else reads too, a pad that pads the channels,
and one whose test is not the image's box (its first row replaced too). End to end: a chain of
3x3 convs with a max pool between them, float32 and bf16, compiled, loaded in a fresh process
and checked against onnxruntime, with convs reading their padded input from the kernel before
them."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from relax_helpers import assert_matches, kernel_into, run_main_outputs
from tvm import relax, te, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import aotc
from aotc.compiler.dot_kernels import PAD_BLOCK
from aotc.compiler.passes.lowering import PaddedImageInProducer
from aotc.targets import x86

RNG = np.random.default_rng(0)


def _double(x):
    return te.compute(x.shape, lambda *i: x(*i) * 2.0, name="double")


def _taps(x, value=0.0, channels=0, first_row=1):
    """x padded by PAD_BLOCK (1 row above and below, 2 columns left, 1 right, ``channels``
    more channels), then two of its taps summed; ``first_row`` 2: the image's first row is
    replaced by the pad value too (not a pad of the image alone)."""
    n, h, w, c = (int(d) for d in x.shape)

    def padded(b, i, j, k):
        inside = tirx.all(i >= first_row, i < h + 1, j >= 2, j < w + 2, k < c)
        return tirx.if_then_else(inside, x[b, i - 1, j - 2, k], tirx.const(value, "float32"))
    p = te.compute((n, h + 2, w + 3, c + channels), padded, name=PAD_BLOCK)
    return te.compute((n, h, w, c), lambda b, i, j, k: p[b, i, j, k] + 3.0 * p[b, i + 2, j + 3, k],
                      name="taps")


def _module(value=0.0, channels=0, producer_read_twice=False, first_row=1) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_te(_double, x, primfunc_name_hint="double")
            z = bb.emit_te(_taps, y, value, channels, first_row, primfunc_name_hint="taps")
            other = y if producer_read_twice else bb.emit_te(
                _taps, x, value, channels, first_row, primfunc_name_hint="taps")
            out = bb.emit_output(relax.Tuple([z, other]))
        bb.emit_func_output(out)
    return bb.get()


@I.ir_module
class Expected:
    @T.prim_func(private=True, s_tir=True)
    def double_padded_out(
            x: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(3)), "float32"),
            double: T.Buffer((T.int64(1), T.int64(6), T.int64(8), T.int64(3)), "float32")):
        T.func_attr({"tirx.noalias": True})
        with T.sblock("root"):
            T.reads()
            T.writes()
            double_inside = T.match_buffer(
                double[0, 1:5, 2:7, 0:3], (T.int64(1), T.int64(4), T.int64(5), T.int64(3)),
                strides=("s0", "s1", "s2", "s3"), offset_factor=1)
            for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(4), T.int64(5), T.int64(3)):
                with T.sblock("double"):
                    v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
                    T.reads(x[v_i0, v_i1, v_i2, v_i3])
                    T.writes(double_inside[v_i0, v_i1, v_i2, v_i3])
                    double_inside[v_i0, v_i1, v_i2, v_i3] = \
                        x[v_i0, v_i1, v_i2, v_i3] * T.float32(2.0)
            # the rows above and below, then the columns left and right of the image's rows
            for b0, b1, b2, b3 in T.grid(T.int64(1), T.int64(1), T.int64(8), T.int64(3)):
                with T.sblock("padded_image_border"):
                    v_b0, v_b1, v_b2, v_b3 = T.axis.remap("SSSS", [b0, b1, b2, b3])
                    T.reads()
                    T.writes(double[v_b0, v_b1, v_b2, v_b3])
                    double[v_b0, v_b1, v_b2, v_b3] = T.float32(0.0)
            for b0, b1, b2, b3 in T.grid(T.int64(1), T.int64(1), T.int64(8), T.int64(3)):
                with T.sblock("padded_image_border"):
                    v_b0, v_b1, v_b2, v_b3 = T.axis.remap("SSSS", [b0, b1, b2, b3])
                    T.reads()
                    T.writes(double[v_b0, v_b1 + T.int64(5), v_b2, v_b3])
                    double[v_b0, v_b1 + T.int64(5), v_b2, v_b3] = T.float32(0.0)
            for b0, b1, b2, b3 in T.grid(T.int64(1), T.int64(4), T.int64(2), T.int64(3)):
                with T.sblock("padded_image_border"):
                    v_b0, v_b1, v_b2, v_b3 = T.axis.remap("SSSS", [b0, b1, b2, b3])
                    T.reads()
                    T.writes(double[v_b0, v_b1 + T.int64(1), v_b2, v_b3])
                    double[v_b0, v_b1 + T.int64(1), v_b2, v_b3] = T.float32(0.0)
            for b0, b1, b2, b3 in T.grid(T.int64(1), T.int64(4), T.int64(1), T.int64(3)):
                with T.sblock("padded_image_border"):
                    v_b0, v_b1, v_b2, v_b3 = T.axis.remap("SSSS", [b0, b1, b2, b3])
                    T.reads()
                    T.writes(double[v_b0, v_b1 + T.int64(1), v_b2 + T.int64(7), v_b3])
                    double[v_b0, v_b1 + T.int64(1), v_b2 + T.int64(7), v_b3] = T.float32(0.0)

    @T.prim_func(private=True, s_tir=True)
    def taps(lv: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(3)), "float32"),
             taps: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(3)), "float32")):
        T.func_attr({"tirx.noalias": True})
        aotc_dot_pad = T.sblock_alloc_buffer((T.int64(1), T.int64(6), T.int64(8), T.int64(3)))
        for b, i, j, k in T.grid(T.int64(1), T.int64(6), T.int64(8), T.int64(3)):
            with T.sblock("aotc_dot_pad"):
                v_b, v_i, v_j, v_k = T.axis.remap("SSSS", [b, i, j, k])
                T.reads(lv[v_b, v_i - T.int64(1), v_j - T.int64(2), v_k])
                T.writes(aotc_dot_pad[v_b, v_i, v_j, v_k])
                aotc_dot_pad[v_b, v_i, v_j, v_k] = T.if_then_else(
                    T.int64(1) <= v_i and v_i < T.int64(5) and T.int64(2) <= v_j and
                    v_j < T.int64(7) and v_k < T.int64(3),
                    lv[v_b, v_i - T.int64(1), v_j - T.int64(2), v_k], T.float32(0.0))
        for b, i, j, k in T.grid(T.int64(1), T.int64(4), T.int64(5), T.int64(3)):
            with T.sblock("taps"):
                v_b, v_i, v_j, v_k = T.axis.remap("SSSS", [b, i, j, k])
                T.reads(aotc_dot_pad[v_b, v_i:v_i + T.int64(3), v_j:v_j + T.int64(4), v_k])
                T.writes(taps[v_b, v_i, v_j, v_k])
                taps[v_b, v_i, v_j, v_k] = aotc_dot_pad[v_b, v_i, v_j, v_k] + \
                    T.float32(3.0) * aotc_dot_pad[v_b, v_i + T.int64(2), v_j + T.int64(3), v_k]

    @T.prim_func(private=True, s_tir=True)
    def taps_padded_in(
            aotc_dot_pad: T.Buffer((T.int64(1), T.int64(6), T.int64(8), T.int64(3)), "float32"),
            taps: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(3)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for b, i, j, k in T.grid(T.int64(1), T.int64(4), T.int64(5), T.int64(3)):
            with T.sblock("taps"):
                v_b, v_i, v_j, v_k = T.axis.remap("SSSS", [b, i, j, k])
                T.reads(aotc_dot_pad[v_b, v_i:v_i + T.int64(3), v_j:v_j + T.int64(4), v_k])
                T.writes(taps[v_b, v_i, v_j, v_k])
                taps[v_b, v_i, v_j, v_k] = aotc_dot_pad[v_b, v_i, v_j, v_k] + \
                    T.float32(3.0) * aotc_dot_pad[v_b, v_i + T.int64(2), v_j + T.int64(3), v_k]

    @R.function
    def main(x: R.Tensor((1, 4, 5, 3), dtype="float32")
             ) -> R.Tuple(R.Tensor((1, 4, 5, 3), dtype="float32"),
                          R.Tensor((1, 4, 5, 3), dtype="float32")):
        cls = Expected
        with R.dataflow():
            lv = R.call_tir(cls.double_padded_out, (x,),
                            out_ty=R.Tensor((1, 6, 8, 3), dtype="float32"))
            lv1 = R.call_tir(cls.taps_padded_in, (lv,),
                             out_ty=R.Tensor((1, 4, 5, 3), dtype="float32"))
            lv2 = R.call_tir(cls.taps, (x,), out_ty=R.Tensor((1, 4, 5, 3), dtype="float32"))
            gv: R.Tuple(R.Tensor((1, 4, 5, 3), dtype="float32"),
                        R.Tensor((1, 4, 5, 3), dtype="float32")) = lv1, lv2
            R.output(gv)
        return gv


def test_the_producer_writes_the_padded_image():
    tvm.ir.assert_structural_equal(PaddedImageInProducer()(_module()), Expected)


@pytest.mark.parametrize("value", [0.0, 0.5])
def test_numbers_match_the_original(value):
    x = RNG.standard_normal((1, 4, 5, 3)).astype(np.float32) + 10.0
    before = _module(value)
    after = PaddedImageInProducer()(before)
    assert "taps_padded_in" in [gv.name_hint for gv in after.get_global_vars()]
    for got, want in zip(run_main_outputs(after, x), run_main_outputs(before, x)):
        np.testing.assert_array_equal(got, want)
    # the kernel alone, into a buffer that holds NaN first: it stores the border itself
    got = kernel_into(after, "double_padded_out", x, np.full((1, 6, 8, 3), np.nan, np.float32))
    want = np.pad(2 * x, ((0, 0), (1, 1), (2, 1), (0, 0)), constant_values=value)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("module", [_module(producer_read_twice=True), _module(channels=1),
                                    _module(first_row=2)],
                         ids=["producer-read-twice", "channels-padded", "not-the-image-box"])
def test_left_alone(module):
    tvm.ir.assert_structural_equal(PaddedImageInProducer()(module), module)


def _conv_chain(path, c: int, h: int, w: int):
    """3x3 convs (pad 1) with ReLU: 3 -> c, max pool, c -> 2c, 2c -> 2c, on a 1 x 3 x h x w
    image."""
    shapes = {"w0": (c, 3, 3, 3), "w1": (2 * c, c, 3, 3), "w2": (2 * c, 2 * c, 3, 3)}
    inits = [numpy_helper.from_array(
        (RNG.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32), k)
        for k, s in shapes.items()]
    inits += [numpy_helper.from_array((0.1 * RNG.standard_normal(s[0])).astype(np.float32),
                                      f"b{k[1]}") for k, s in shapes.items()]
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], **conv),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p0", "w1", "b1"], ["c1"], **conv),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], **conv),
             helper.make_node("Relu", ["c2"], ["y"])]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2 * c, h // 2, w // 2])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


# float32: 24 and 48 channels (more take Winograd forms, which read no padded copy); bf16:
# rows of 32 after the pool, two AMX tiles side by side (the per-row kernel, whose pad block
# this is; 16 or fewer go over the flattened image)
@pytest.mark.parametrize("precision, c, h, w, cosine, atol", [
    ("fp32", 24, 20, 28, 0.99999, 1e-4), ("bf16", 48, 40, 64, 0.999, 0.02)])
def test_conv_chain_against_onnxruntime(tmp_path, precision, c, h, w, cosine, atol):
    if precision == "bf16" and not x86._BF16_FLAGS <= x86.cpu_flags():
        pytest.skip("this CPU has no AVX512-BF16 to run the model on")
    model = _conv_chain(tmp_path / "chain.onnx", c, h, w)
    out = tmp_path / f"chain_{precision}.so"
    aotc.compile(model, output=out, precision=precision)
    loaded = aotc.load(out)
    names = [k["name"] for k in loaded.metadata["kernels"]]
    assert any(n.endswith("_padded_in") for n in names), names
    assert any(n.endswith("_padded_out") for n in names), names
    x = RNG.standard_normal((1, 3, h, w)).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    assert_matches(loaded.run({"x": x})["y"], want, cosine, atol)
