"""LSTM / GRU / RNN through ONNX: TVM 0.27 has no converter for them; aotc unrolls the
recurrence (compiler/frontends/onnx_rnn.py). Models exported from torch are compared with
torch, hand-built graphs with onnxruntime (directions, layouts, states, sequence_lens)."""

import warnings

import numpy as np
import onnx
import pytest
import torch
from helpers import check_against_onnxruntime, compile_and_load
from onnx import TensorProto, helper, numpy_helper
from test_torch_frontend import ConvGRU, LSTMTagger


def _export(module, example, path):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example, str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    assert any(n.op_type in ("GRU", "LSTM") for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("make, example", [
    (ConvGRU, lambda: torch.randn(2, 8, 20)),
    (LSTMTagger, lambda: torch.randint(0, 50, (2, 12))),
])
def test_torch_exported_rnn_matches_torch(make, example, tmp_path):
    torch.manual_seed(0)
    module, x = make().eval(), example()
    _export(module, (x,), tmp_path / "rnn.onnx")
    got = list(compile_and_load(tmp_path / "rnn.onnx", tmp_path)(x.numpy()).values())[0]
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _rnn_model(op, direction="forward", layout=0, seq_lens=False, hidden=4):
    seq, batch, feat = 5, 3, 6
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n)
               for n, s in (("W", (dirs, gates * hidden, feat)),
                            ("R", (dirs, gates * hidden, hidden)),
                            ("B", (dirs, 2 * gates * hidden)))]
    inputs = ["x", "W", "R", "B"] + (["lens"] if seq_lens else [])
    x_shape = [batch, seq, feat] if layout else [seq, batch, feat]
    node = helper.make_node(op, inputs, ["y", "y_h"], hidden_size=hidden, direction=direction,
                            layout=layout)
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if seq_lens:
        graph_inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
    graph = helper.make_graph([node], op.lower(), graph_inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y_h", TensorProto.FLOAT, None)],
                              weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), x_shape


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_recurrent_ops_match_onnxruntime(op, direction, tmp_path):
    """onnxruntime has no layout=1 kernels: the node suite's batchwise cases cover that."""
    model, x_shape = _rnn_model(op, direction)
    onnx.save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    check_against_onnxruntime(tmp_path / "m.onnx", tmp_path, feed={"x": x}, atol=1e-5)


def test_sequence_lens_mask_finished_sequences(tmp_path):
    model, x_shape = _rnn_model("GRU", seq_lens=True)
    onnx.save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    feed = {"x": x, "lens": np.array([5, 2, 3], np.int32)}
    check_against_onnxruntime(tmp_path / "m.onnx", tmp_path, feed=feed, atol=1e-5)


def test_reverse_with_run_time_lengths_is_refused(tmp_path):
    from aotc.errors import UnsupportedModelError
    model, _ = _rnn_model("LSTM", "reverse", seq_lens=True)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(UnsupportedModelError, match="sequence_lens .* reverse direction"):
        compile_and_load(tmp_path / "m.onnx", tmp_path)
