"""ONNX If (no TVM converter): a run-time condition computes both branches and selects; a
constant one inlines its branch. A model exported from torch with data-dependent control flow
matches torch on inputs that take either branch."""

import warnings

import numpy as np
import onnx
import pytest
import torch
from helpers import check_against_onnxruntime, compile_and_load
from onnx import TensorProto, helper


class VoiceGate(torch.nn.Module):
    """A voice-activity-style gate: louder frames take another path than quiet ones."""

    def __init__(self):
        super().__init__()
        self.loud = torch.nn.Linear(16, 8)
        self.quiet = torch.nn.Linear(16, 8)

    def forward(self, x):
        if x.abs().mean() > 0.5:
            y = torch.relu(self.loud(x))
        else:
            y = torch.tanh(self.quiet(x)) * 0.5
        return y + 1


def test_torch_model_with_if_matches_torch_on_both_branches(tmp_path):
    torch.manual_seed(0)
    module = torch.jit.script(VoiceGate().eval())
    x = torch.randn(4, 16)
    path = tmp_path / "gate.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False)
    assert "If" in [n.op_type for n in onnx.load(str(path)).graph.node]
    model = compile_and_load(path, tmp_path)
    for scale in (0.1, 3.0):  # quiet, loud
        xs = x * scale
        with torch.no_grad():
            want = module(xs).numpy()
        np.testing.assert_allclose(model(xs.numpy())["y"], want, rtol=1e-5, atol=1e-6)


def _if_model(cond_input: bool, else_shape=(3,)):
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    else_out = helper.make_tensor_value_info("e", TensorProto.FLOAT, list(else_shape))
    else_nodes = [helper.make_node("Neg", ["x"], ["e"])] if else_shape == (3,) else [
        helper.make_node("Concat", ["x", "x"], ["e"], axis=0)]
    else_g = helper.make_graph(else_nodes, "else", [], [else_out])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])]
    inits = []
    if cond_input:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    else:
        inits.append(helper.make_tensor("c", TensorProto.BOOL, [], [False]))
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    graph = helper.make_graph([node], "if", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cond", [True, False])
def test_run_time_condition_matches_onnxruntime(cond, tmp_path):
    onnx.save(_if_model(True), tmp_path / "if.onnx")
    feed = {"x": np.array([1, -2, 3], np.float32), "c": np.array(cond)}
    check_against_onnxruntime(tmp_path / "if.onnx", tmp_path, feed=feed)


def test_constant_condition_inlines_one_branch(tmp_path):
    onnx.save(_if_model(False), tmp_path / "if_const.onnx")
    check_against_onnxruntime(tmp_path / "if_const.onnx", tmp_path,
                              feed={"x": np.array([1, -2, 3], np.float32)})


@pytest.mark.parametrize("cond, length", [(True, 3), (False, 6)])
def test_branches_of_different_shapes_run_one_branch(tmp_path, cond, length):
    """A Relax If in the library (it was refused): [3] from one branch, [6] from the other."""
    onnx.save(_if_model(True, else_shape=(6,)), tmp_path / "if_shapes.onnx")
    feed = {"x": np.array([1, -2, 3], np.float32), "c": np.array(cond)}
    _, got = check_against_onnxruntime(tmp_path / "if_shapes.onnx", tmp_path, feed=feed)
    assert got["y"].shape == (length,)
