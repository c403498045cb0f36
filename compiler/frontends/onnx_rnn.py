"""LSTM, GRU and RNN as ONNX ops TVM converts: the recurrence unrolled over a static sequence.

Why: TVM 0.27 has no converter for any of the three (nor for Loop or Scan, which a loop form
would need), so every exported speech, tagging or time-series model was refused. Once input
shapes are fixed the sequence length is a constant, and the recurrence is plain MatMul / Add /
activation per step: the input projection for all steps is one MatMul, each step one MatMul
with the recurrent weights.

Follows the ONNX spec (LSTM/GRU/RNN-22): forward, reverse and bidirectional; layout 0 and 1;
bias, initial states, peepholes, input_forget, clip, linear_before_reset, custom activations
with alpha/beta; sequence_lens masks finished sequences (state kept, output zero) in the
forward direction. Refused with a clear error: a run-time sequence length, and sequence_lens
that are not all full-length in a reverse direction (each sequence would start elsewhere).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotc.errors import UnsupportedModelError

from .onnx_graph import GraphInfo, node_attrs

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"],
                       "RNN": ["Tanh"]}


class _Emitter:
    """Appends nodes; each call returns the new output's name."""

    def __init__(self, info: GraphInfo, dtype):
        self.info, self.dtype, self.nodes = info, dtype, []

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        out = out or self.info.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=None) -> str:
        name = self.info.fresh("c")
        array = np.asarray(value, dtype=dtype or self.dtype)
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=numpy_helper.from_array(array)))
        return name

    def take(self, data: str, index: int, axis: int = 0) -> str:
        return self.op("Gather", data, self.const(index, np.int64), axis=axis)

    def slice_last(self, data: str, start: int, size: int) -> str:
        return self.op("Slice", data, self.const([start], np.int64),
                       self.const([start + size], np.int64), self.const([-1], np.int64))

    def unsqueeze(self, data: str, axis: int) -> str:
        if self.info.opset >= 13:
            return self.op("Unsqueeze", data, self.const([axis], np.int64))
        return self.op("Unsqueeze", data, axes=[axis])

    def activation(self, name: str, x: str, alpha, beta) -> str:
        simple = {"Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"}
        if name in simple:
            return self.op(name, x)
        if name in ("LeakyRelu", "ThresholdedRelu", "Elu"):
            return self.op(name, x, alpha=alpha)
        if name == "HardSigmoid":
            return self.op(name, x, alpha=alpha, beta=beta)
        if name == "ScaledTanh":
            return self.op("Mul", self.const(alpha),
                           self.op("Tanh", self.op("Mul", self.const(beta), x)))
        if name == "Affine":
            return self.op("Add", self.op("Mul", self.const(alpha), x), self.const(beta))
        raise UnsupportedModelError(f"RNN activation {name!r} is not an ONNX RNN activation")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def expand_recurrent(node: onnx.NodeProto, info: GraphInfo) -> list[onnx.NodeProto]:
    kind, attrs = node.op_type, node_attrs(node)
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x_shape = info.shape(inputs[0])
    elem = info.elem_type(inputs[0])
    layout = attrs.get("layout", 0)
    if not x_shape or len(x_shape) != 3 or None in x_shape or elem is None:
        raise UnsupportedModelError(
            f"{kind} node {node.name!r}: needs a static input shape (sequence, batch, features) "
            "to unroll; fix it with --input-shape")
    seq, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    direction = _text(attrs.get("direction", "forward"))
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    e = _Emitter(info, helper.tensor_dtype_to_np_dtype(elem))
    _check_sequence_lens(node, inputs[4], info, seq, dirs)
    x = e.op("Transpose", inputs[0], perm=[1, 0, 2]) if layout else inputs[0]
    hidden = attrs["hidden_size"]
    acts = [_text(a) for a in attrs.get("activations", [])] or DEFAULT_ACTIVATIONS[kind] * len(dirs)
    per_dir = len(acts) // len(dirs)
    alphas = list(attrs.get("activation_alpha", [])) + [None] * len(acts)
    betas = list(attrs.get("activation_beta", [])) + [None] * len(acts)
    ys, hs, cs = [], [], []
    for d, name in enumerate(dirs):
        span = slice(d * per_dir, (d + 1) * per_dir)
        cell = _Cell(e, kind, attrs, inputs, d, hidden, batch, layout,
                     list(zip(acts[span], alphas[span], betas[span])))
        steps = range(seq - 1, -1, -1) if name == "reverse" else range(seq)
        y, h, c = cell.run(x, steps, seq)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    _outputs(e, node, ys, hs, cs, layout)
    return e.nodes


def _check_sequence_lens(node, name: str, info: GraphInfo, seq: int, dirs: list[str]) -> None:
    if not name or "reverse" not in dirs:
        return
    lens = info.constants.get(name)
    if lens is None or not np.all(lens == seq):
        raise UnsupportedModelError(
            f"{node.op_type} node {node.name!r}: sequence_lens shorter than the sequence in a "
            "reverse direction is not supported (each sequence would start at its own end)")


class _Cell:
    """One direction of one recurrent op: weights sliced out, the recurrence emitted."""

    def __init__(self, e: _Emitter, kind, attrs, inputs, d, hidden, batch, layout, acts):
        self.e, self.kind, self.hidden, self.acts = e, kind, hidden, acts
        gates = GATES[kind] * hidden
        self.w_t = e.op("Transpose", e.take(inputs[1], d), perm=[1, 0])       # [I, G*H]
        self.r_t = e.op("Transpose", e.take(inputs[2], d), perm=[1, 0])       # [H, G*H]
        bias = e.take(inputs[3], d) if inputs[3] else None                     # [2*G*H]
        self.wb = e.slice_last(bias, 0, gates) if bias else None
        self.rb = e.slice_last(bias, gates, gates) if bias else None
        self.h0 = self._state(inputs[5], d, batch, layout)
        self.c0 = self._state(inputs[6], d, batch, layout) if kind == "LSTM" else None
        self.peep = e.take(inputs[7], d) if kind == "LSTM" and inputs[7] else None
        self.lens = inputs[4] or None
        self.clip = attrs.get("clip")
        self.input_forget = attrs.get("input_forget", 0)
        self.linear_before_reset = attrs.get("linear_before_reset", 0)

    def _state(self, name: str, d: int, batch: int, layout: int) -> str:
        if not name:
            return self.e.const(np.zeros((batch, self.hidden)))
        return self.e.take(name, d, axis=1 if layout else 0)

    def run(self, x: str, steps, seq: int):
        e = self.e
        proj = e.op("MatMul", x, self.w_t)                                     # [S, B, G*H]
        if self.wb:
            proj = e.op("Add", proj, self.wb)
        h, c, outputs = self.h0, self.c0, {}
        for t in steps:
            h_new, c_new = self._step(e.take(proj, t), h, c)
            if self.lens:
                alive = e.unsqueeze(e.op("Less", e.const(t, np.int32),
                                         e.op("Cast", self.lens, to=6)), 1)
                outputs[t] = e.op("Where", alive, h_new, e.const(np.zeros(1)))
                h = e.op("Where", alive, h_new, h)
                c = e.op("Where", alive, c_new, c) if c_new else None
            else:
                outputs[t], h, c = h_new, h_new, c_new
        y = e.op("Concat", *[e.unsqueeze(outputs[t], 0) for t in range(seq)], axis=0)
        return y, h, c

    def _gates(self, x_t: str, h: str, count: int):
        """x-part and h-part of the first ``count`` gates (each [B, H])."""
        e, size = self.e, self.hidden
        rec = e.op("MatMul", h, self.r_t)
        if self.rb:
            rec = e.op("Add", rec, self.rb)
        return ([e.slice_last(x_t, k * size, size) for k in range(count)],
                [e.slice_last(rec, k * size, size) for k in range(count)])

    def _act(self, index: int, value: str) -> str:
        name, alpha, beta = self.acts[index]
        if self.clip is not None:
            value = self.e.op("Clip", value, self.e.const(-self.clip), self.e.const(self.clip))
        return self.e.activation(name, value, alpha, beta)

    def _step(self, x_t: str, h: str, c: str | None):
        return {"LSTM": self._lstm, "GRU": self._gru, "RNN": self._rnn}[self.kind](x_t, h, c)

    def _rnn(self, x_t, h, _c):
        xs, hs = self._gates(x_t, h, 1)
        return self._act(0, self.e.op("Add", xs[0], hs[0])), None

    def _lstm(self, x_t, h, c):
        e = self.e
        xs, hs = self._gates(x_t, h, 4)                       # i, o, f, c
        pre = [e.op("Add", a, b) for a, b in zip(xs, hs)]
        if self.peep:
            p_i, p_o, p_f = (e.slice_last(self.peep, k * self.hidden, self.hidden)
                             for k in range(3))
            pre[0] = e.op("Add", pre[0], e.op("Mul", p_i, c))
            pre[2] = e.op("Add", pre[2], e.op("Mul", p_f, c))
        i = self._act(0, pre[0])
        f = (e.op("Sub", e.const(1), i) if self.input_forget else self._act(0, pre[2]))
        c_new = e.op("Add", e.op("Mul", f, c), e.op("Mul", i, self._act(1, pre[3])))
        if self.peep:
            pre[1] = e.op("Add", pre[1], e.op("Mul", p_o, c_new))
        o = self._act(0, pre[1])
        return e.op("Mul", o, self._act(2, c_new)), c_new

    def _gru(self, x_t, h, _c):
        e, size = self.e, self.hidden
        xz, xr, xh = (e.slice_last(x_t, k * size, size) for k in range(3))
        rec = e.op("MatMul", h, self.r_t)
        rz, rr = (e.slice_last(rec, k * size, size) for k in range(2))
        rbz, rbr, rbh = ((e.slice_last(self.rb, k * size, size) for k in range(3))
                         if self.rb else (None, None, None))
        z = self._act(0, self._sum(xz, rz, rbz))
        r = self._act(0, self._sum(xr, rr, rbr))
        r_h_t = e.slice_last(self.r_t, 2 * size, size)                      # [H, H]
        if self.linear_before_reset:
            rec_h = self._sum(e.op("MatMul", h, r_h_t), rbh)
            cand = self._act(1, e.op("Add", xh, e.op("Mul", r, rec_h)))
        else:
            cand = self._act(1, self._sum(xh, e.op("MatMul", e.op("Mul", r, h), r_h_t), rbh))
        one_minus_z = e.op("Sub", e.const(1), z)
        return e.op("Add", e.op("Mul", one_minus_z, cand), e.op("Mul", z, h)), None

    def _sum(self, *terms):
        terms = [t for t in terms if t]
        total = terms[0]
        for term in terms[1:]:
            total = self.e.op("Add", total, term)
        return total


def _outputs(e: _Emitter, node, ys, hs, cs, layout: int) -> None:
    """Y [S, D, B, H] (layout 1: [B, S, D, H]), Y_h and Y_c [D, B, H] (layout 1: [B, D, H])."""
    outputs = list(node.output) + [""] * (3 - len(node.output))
    if outputs[0]:
        y = e.op("Concat", *[e.unsqueeze(y, 1) for y in ys], axis=1)
        _emit_layout(e, y, outputs[0], [2, 0, 1, 3] if layout else None)
    for name, states in ((outputs[1], hs), (outputs[2], cs)):
        if name and states and states[0]:
            stacked = e.op("Concat", *[e.unsqueeze(s, 0) for s in states], axis=0)
            _emit_layout(e, stacked, name, [1, 0, 2] if layout else None)


def _emit_layout(e: _Emitter, value: str, out: str, perm: list[int] | None) -> None:
    if perm:
        e.op("Transpose", value, perm=perm, out=out)
    else:
        e.op("Identity", value, out=out)
