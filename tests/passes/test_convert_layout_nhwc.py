"""ConvertLayoutNHWC: a clip between NHWC convs (MobileNetV3's hard-swish) becomes maximum and
minimum in NHWC, with no transposes around it (TVM 0.27 has no layout rule for clip); outputs
still match, NaN included; a one-sided clip gets one op."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from relax_helpers import main_ops, one_input_module
from tvm import relax
from tvm.script import relax as R

from aotc.compiler.passes import ConvertLayoutNHWC


def _hard_swish_after_conv():
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            a = R.add(y, R.const(3.0, "float32"))
            c = R.clip(a, 0, 6)
            d = R.divide(c, R.const(6.0, "float32"))
            out = R.multiply(y, d)
            R.output(out)
        return out

    return tvm.IRModule({"main": main})


def test_clip_stays_nhwc_as_maximum_and_minimum():
    @R.function
    def expected(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
        with R.dataflow():
            xt = R.permute_dims(x, axes=[0, 2, 3, 1])
            wt = R.permute_dims(w, axes=[2, 3, 1, 0])
            y = R.nn.conv2d(xt, wt, padding=[1, 1, 1, 1], data_layout="NHWC",
                            kernel_layout="HWIO", out_layout="NHWC")
            a = R.add(y, R.const(3.0, "float32"))
            low = R.maximum(a, R.const(0.0, "float32"))
            c = R.minimum(low, R.const(6.0, "float32"))
            d = R.divide(c, R.const(6.0, "float32"))
            m = R.multiply(y, d)
            out = R.permute_dims(m, axes=[0, 3, 1, 2])
            R.output(out)
        return out

    before = _hard_swish_after_conv()
    assert "R.clip" in before.script()
    after = ConvertLayoutNHWC()(before)
    tvm.ir.assert_structural_equal(after["main"], expected.with_attr("global_symbol", "main"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 3
    x[0, 0, 4, 4] = np.nan  # the clip passed NaN through; so do maximum and minimum
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    want, got = _run(before, x, w), _run(after, x, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any()


def _run(mod, *args):
    from aotc.compiler.default_schedules.nan_minmax import LEGALIZE_MAP
    mod = relax.transform.LegalizeOps(LEGALIZE_MAP)(mod)
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_one_sided_clip_gets_one_op():
    before = one_input_module((1, 4, 4, 2), lambda _bb, x: relax.op.clip(x, 0.0, float("inf")))
    assert main_ops(ConvertLayoutNHWC()(before)) == ["relax.maximum"]


def test_hard_swish_mobile_block_is_fused_into_the_conv_and_matches_onnxruntime(tmp_path):
    """Conv -> HardSwish -> depthwise conv -> HardSigmoid gate (MobileNetV3's pieces): each
    activation fused into the conv before it, no kernel of its own; the only transposes are
    the model's NCHW input and output; matches onnxruntime."""
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((16, 8, 1, 1)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((16, 1, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]),
             helper.make_node("HardSwish", ["c1"], ["h1"]),
             helper.make_node("Conv", ["h1", "w2"], ["c2"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("HardSigmoid", ["c2"], ["g"]),
             helper.make_node("Mul", ["c2", "g"], ["y"])]
    graph = helper.make_graph(
        nodes, "mobile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 14, 14])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    path = tmp_path / "mobile.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model, _ = check_against_onnxruntime(path, tmp_path, rtol=1e-5, atol=1e-5)
    kernels = [k["name"] for k in model.metadata["kernels"]]
    convs = [name for name in kernels if "conv2d" in name]
    assert len(convs) == 2 and all("maximum_minimum" in name for name in convs), kernels
    assert sorted(set(kernels) - set(convs)) == ["transpose", "transpose1"], kernels
