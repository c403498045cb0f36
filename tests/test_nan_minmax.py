"""NaN through Relu, Max, Min, Clip and the activations built from them comes out NaN, as in
onnxruntime, torch and numpy (TVM's TIR max/min dropped it: Relu(NaN) was 0). The IR shows
the kernels' select form; the compiled models run in a fresh process."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import tvm
from helpers import run_in_fresh_process
from onnx import TensorProto, helper
from tvm import relax
from tvm.script import relax as R

import aotc
from aotc.compiler.default_schedules.nan_minmax import LEGALIZE_MAP

X = np.array([[np.nan, -1, 1, np.inf, -np.inf, 0, np.nan, 2.5]] * 2, np.float32)
Y = np.array([[1, np.nan, np.nan, 0, 5, np.nan, -1, 3]] * 2, np.float32)

ONNX_CASES = {  # op: (inputs, attributes); ClipRange: Clip with bounds 0 and 1
    "Relu": (1, {}), "Max": (2, {}), "Min": (2, {}), "Elu": (1, {}), "HardSigmoid": (1, {}),
    "LeakyRelu": (1, {}), "Clip": (1, {}), "ClipRange": (1, {}),
}


def _onnx_model(op: str, inputs: int):
    names = ["x", "y"][:inputs]
    node_inputs = names + (["lo", "hi"] if op == "ClipRange" else [])
    initializers = [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
                    helper.make_tensor("hi", TensorProto.FLOAT, [], [1.0])] \
        if op == "ClipRange" else []
    node = helper.make_node(op.replace("Range", ""), node_inputs, ["out"])
    graph = helper.make_graph(
        [node], op.lower(), [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8])
                             for n in names],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("op", sorted(ONNX_CASES))
def test_nan_comes_out_as_onnxruntime_gives_it(op, tmp_path):
    path, out = tmp_path / f"{op}.onnx", tmp_path / f"{op}.so"
    onnx.save(_onnx_model(op, ONNX_CASES[op][0]), path)
    aotc.compile(path, output=out)
    feed = {"x": X, "y": Y} if ONNX_CASES[op][0] == 2 else {"x": X}
    got = run_in_fresh_process(out, feed, tmp_path)["out"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # onnxruntime's unbounded Clip maps +-inf to +-3.4e38 (its default bounds), TVM's importer
    # keeps them: compared where the input is finite
    finite = np.isfinite(want) & np.isfinite(X)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)


def test_torch_maximum_and_relu_keep_nan(tmp_path):
    class Net(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x) + torch.maximum(x, y[:1]) + torch.clamp(y, -1.0, 1.0)

    x, y = torch.from_numpy(X), torch.from_numpy(Y)
    out = tmp_path / "net.so"
    aotc.compile(Net(), output=out, example_inputs=(x, y))
    model = aotc.load(out)
    names = [spec.name for spec in model.signature.inputs]
    got = next(iter(run_in_fresh_process(out, dict(zip(names, (X, Y))), tmp_path).values()))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(Net()(x, y).numpy()))


def test_relu_legalizes_to_a_select_that_lets_nan_through():
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            y = R.nn.relu(x)
            R.output(y)
        return y

    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(tvm.IRModule({"main": main}))
    value = _store(next(f for gv, f in after.functions.items() if gv.name_hint != "main")).value
    # select(x < 0, 0, x): NaN < 0 is false, so NaN is stored
    assert isinstance(value, tvm.tirx.Select) and isinstance(value.condition, tvm.tirx.LT)
    assert isinstance(value.true_value, tvm.tirx.FloatImm) and value.true_value.value == 0
    assert type(value.false_value).__name__ in ("BufferLoad", "TensorLoad")  # reads x


def _store(func) -> "tvm.tirx.BufferStore":
    """The one store of a single-op kernel (blocks and loops walked down)."""
    node = func.body
    while not isinstance(node, tvm.tirx.BufferStore):
        node = node.block if hasattr(node, "block") else node.body
    return node


def test_integer_maximum_keeps_topi_max():
    @R.function
    def main(a: R.Tensor((4,), "int32"), b: R.Tensor((4,), "int32")):
        with R.dataflow():
            y = R.maximum(a, b)
            R.output(y)
        return y

    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(tvm.IRModule({"main": main}))
    value = _store(next(f for gv, f in after.functions.items() if gv.name_hint != "main")).value
    assert isinstance(value, tvm.tirx.Max)


def test_maximum_and_minimum_by_constants_stay_elementwise():
    """ReLU6 imported as maximum(x, 0) / minimum(x, 6): the kernels must be elementwise (op
    pattern 0) for FuseOps to put them into the convolution before them; read as broadcast,
    they ran as separate kernels (MobileNetV2 32 -> 44 kernels)."""
    @R.function
    def main(x: R.Tensor((1, 8, 8, 16), "float32")):
        with R.dataflow():
            y = R.maximum(x, R.const(0, "float32"))
            z = R.minimum(y, R.const(6, "float32"))
            R.output(z)
        return z

    legalized = relax.transform.LegalizeOps(LEGALIZE_MAP)(tvm.IRModule({"main": main}))
    annotated = relax.transform.AnnotateTIROpPattern()(legalized)
    patterns = {gv.name_hint: int(f.attrs["op_pattern"])
                for gv, f in annotated.functions.items() if gv.name_hint != "main"}
    assert patterns == {"maximum": 0, "minimum": 0}
