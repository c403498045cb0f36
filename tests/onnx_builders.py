"""Small ONNX graphs built with onnx.helper, for fast tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _const(name: str, shape, seed: int) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)


def tiny_cnn(opset: int = 17) -> onnx.ModelProto:
    """conv3x3(8->16)+relu -> maxpool -> global avg pool -> flatten -> gemm(16->10)."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [_const("w", (16, 8, 3, 3), 0), _const("b", (16,), 1),
         _const("fc_w", (10, 16), 2), _const("fc_b", (10,), 3)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def two_matmuls(opset: int = 17) -> onnx.ModelProto:
    """x[8,32] -> matmul(32->48)+relu -> matmul(48->16): two kernels to tune, for tests that
    check a tuner's mechanics, where every task costs reference timings (on a farm: remote
    sessions) that a six-kernel model pays six times."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "two_matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
        [_const("w1", (32, 48), 4), _const("w2", (48, 16), 5)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def single_op(op_type: str, domain: str = "", opset: int = 17, name: str = "the_node"):
    """x -> op -> y on a [2, 3] float tensor; for op-support checks."""
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain, name=name)
    graph = helper.make_graph(
        [node], "single",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets)


def if_on_an_input() -> onnx.ModelProto:
    """A voice-activity-style switch: at 16 kHz one frame layout, else another (the branches
    give different shapes, so both cannot be computed and selected)."""
    then_graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape16"], ["frames"])],
                                   "then",
                              [], [helper.make_tensor_value_info("frames", TensorProto.FLOAT,
                                                                 None)],
                              [numpy_helper.from_array(np.array([4, 8], np.int64), "shape16")])
    else_graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape8"], ["frames"])],
                                   "else",
                              [], [helper.make_tensor_value_info("frames", TensorProto.FLOAT,
                                                                 None)],
                              [numpy_helper.from_array(np.array([2, 16], np.int64), "shape8")])
    nodes = [helper.make_node("Equal", ["sr", "sixteen"], ["is16"]),
             helper.make_node("If", ["is16"], ["frames"], then_branch=then_graph,
                         else_branch=else_graph),
             helper.make_node("Relu", ["frames"], ["y"])]
    graph = helper.make_graph(
        nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32]),
                       helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(16000, np.int64), "sixteen")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def greedy_decoder_loop(hidden: int = 16, vocab: int = 11, eos: int = 3,
                        opset: int = 17) -> onnx.ModelProto:
    """An autoregressive decoder as exporters write one: a ``Loop`` of at most ``max_steps``
    steps that stops early when it emits ``eos``. Each step updates a hidden state (carried,
    fixed shape), appends its token to a growing list (carried, one longer each step: a
    symbolic dim), stacks its logits (a scan output) and reads ``context``, a tensor the main
    graph computes (the body names it from the outer scope)."""
    t = TensorProto
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
         helper.make_node("Add", ["hw", "context"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("MatMul", ["h_out", "head"], ["logits"]),
         helper.make_node("ArgMax", ["logits"], ["token"], axis=1, keepdims=1),
         helper.make_node("Concat", ["tokens_in", "token"], ["tokens_out"], axis=1),
         helper.make_node("Equal", ["token", "eos"], ["is_eos"]),
         helper.make_node("Not", ["is_eos"], ["go_on"]),
         helper.make_node("Reshape", ["go_on", "scalar"], ["cond_out"])],
        "step",
        [helper.make_tensor_value_info("i", t.INT64, []),
         helper.make_tensor_value_info("cond_in", t.BOOL, []),
         helper.make_tensor_value_info("h_in", t.FLOAT, [1, hidden]),
         helper.make_tensor_value_info("tokens_in", t.INT64, [1, None])],
        [helper.make_tensor_value_info("cond_out", t.BOOL, []),
         helper.make_tensor_value_info("h_out", t.FLOAT, [1, hidden]),
         helper.make_tensor_value_info("tokens_out", t.INT64, [1, None]),
         helper.make_tensor_value_info("logits", t.FLOAT, [1, vocab])],
        [numpy_helper.from_array(np.array([eos], np.int64).reshape(1, 1), "eos"),
         numpy_helper.from_array(np.zeros((0,), np.int64), "scalar")])
    nodes = [helper.make_node("Mul", ["x", "half"], ["context"]),
             helper.make_node("Loop", ["max_steps", "start", "x", "no_tokens"],
                              ["h_final", "tokens", "all_logits"], body=body)]
    graph = helper.make_graph(
        nodes, "greedy_decoder",
        [helper.make_tensor_value_info("x", t.FLOAT, [1, hidden]),
         helper.make_tensor_value_info("max_steps", t.INT64, [])],
        [helper.make_tensor_value_info("h_final", t.FLOAT, [1, hidden]),
         helper.make_tensor_value_info("tokens", t.INT64, [1, None]),
         helper.make_tensor_value_info("all_logits", t.FLOAT, [None, 1, vocab])],
        [numpy_helper.from_array(np.random.default_rng(1).standard_normal(
            (hidden, hidden)).astype(np.float32), "w"),
         numpy_helper.from_array(np.random.default_rng(2).standard_normal(
             (hidden, vocab)).astype(np.float32), "head"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(True), "start"),
         numpy_helper.from_array(np.zeros((1, 0), np.int64), "no_tokens")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def running_sum_loop(trip_count: bool = True, condition: bool = True) -> onnx.ModelProto:
    """A Loop over an input with a symbolic batch: ``acc += x * i`` for i < 3, each step's
    ``acc`` stacked (a scan output whose element has the batch dim). The body reads ``x`` from
    the outer scope. Without ``trip_count`` the loop stops when the body's condition turns
    false (sum(acc) > limit, or after 5 steps); without ``condition`` only the count ends it."""
    t = TensorProto
    body_nodes = [helper.make_node("Cast", ["i"], ["i_float"], to=t.FLOAT),
                  helper.make_node("Mul", ["x", "i_float"], ["scaled"]),
                  helper.make_node("Add", ["acc_in", "scaled"], ["acc_out"]),
                  helper.make_node("Identity", ["acc_out"], ["step_acc"]),
                  helper.make_node("Less", ["i", "five"], ["more"])]
    cond_out = "more" if not trip_count else "cond_in"
    body_nodes.append(helper.make_node("Identity", [cond_out], ["cond_out"]))
    body = helper.make_graph(
        body_nodes, "sum_step",
        [helper.make_tensor_value_info("i", t.INT64, []),
         helper.make_tensor_value_info("cond_in", t.BOOL, []),
         helper.make_tensor_value_info("acc_in", t.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("cond_out", t.BOOL, []),
         helper.make_tensor_value_info("acc_out", t.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("step_acc", t.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.array(5, np.int64), "five")])
    nodes = [helper.make_node("Mul", ["x", "zero"], ["start"]),
             helper.make_node("Loop", ["three" if trip_count else "",
                                       "yes" if condition else "", "start"],
                              ["total", "partials"], body=body)]
    graph = helper.make_graph(
        nodes, "running_sum", [helper.make_tensor_value_info("x", t.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("total", t.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("partials", t.FLOAT, [None, "batch", 4])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
         numpy_helper.from_array(np.array(3, np.int64), "three"),
         numpy_helper.from_array(np.array(True), "yes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
