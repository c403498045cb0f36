"""ONNX ``Scan`` unrolled into straight-line ops: TVM 0.27 has no converter for it.

Scan runs its body once per position of the scan inputs, threading state through. With the
input shapes fixed the number of steps is known at compile time, so the body is inlined once
per step (onnx_control.inline_branch: fresh names, initializers as Constants): each step reads
its slice of every scan input (forward or reverse, on any axis), the states flow from step to
step, and each per-step output is stacked along its axis (in reverse for reverse outputs).
Code size grows with the sequence length; exported linear-attention and recurrence blocks scan
over short fixed lengths. Scan-8 (batched, with sequence_lens) and scan lengths unknown at
compile time are refused by name.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotc.errors import UnsupportedModelError

from .onnx_control import inline_branch
from .onnx_graph import GraphInfo, node_attrs


class _Steps:
    """Emits Slice/Squeeze/Unsqueeze in the form of the model's opset (axes as an input from
    opset 13 on, an attribute before)."""

    def __init__(self, info: GraphInfo):
        self.info, self.nodes = info, []

    def _ints(self, values) -> str:
        name = self.info.fresh("scan_ints")
        self.nodes.append(helper.make_node(
            "Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64))))
        return name

    def element(self, x: str, axis: int, index: int) -> str:
        """x[..., index, ...] on ``axis``, that axis removed."""
        cut, out = self.info.fresh("scan_cut"), self.info.fresh("scan_elem")
        self.nodes.append(helper.make_node(
            "Slice", [x, self._ints([index]), self._ints([index + 1]), self._ints([axis])],
            [cut]))
        self.nodes.append(self._axes_node("Squeeze", cut, out, axis))
        return out

    def stacked(self, parts: list[str], axis: int, out: str) -> None:
        lifted = []
        for part in parts:
            lifted.append(self.info.fresh("scan_step"))
            self.nodes.append(self._axes_node("Unsqueeze", part, lifted[-1], axis))
        self.nodes.append(helper.make_node("Concat", lifted, [out], axis=axis))

    def _axes_node(self, op: str, x: str, out: str, axis: int) -> onnx.NodeProto:
        if self.info.opset >= 13:
            return helper.make_node(op, [x, self._ints([axis])], [out])
        return helper.make_node(op, [x], [out], axes=[axis])


def unroll_scan(node: onnx.NodeProto, info: GraphInfo) -> list[onnx.NodeProto]:
    if info.opset < 9:
        raise UnsupportedModelError(f"Scan node {node.name!r}: Scan-8 (batched, with "
                                    "sequence_lens) is not supported; use opset 9 or newer")
    attrs = node_attrs(node)
    body, m = attrs["body"], attrs["num_scan_inputs"]
    n_state = len(node.input) - m
    k = len(body.output) - n_state
    in_axes = list(attrs.get("scan_input_axes", [0] * m))
    in_dirs = list(attrs.get("scan_input_directions", [0] * m))
    out_axes = list(attrs.get("scan_output_axes", [0] * k))
    out_dirs = list(attrs.get("scan_output_directions", [0] * k))
    scan_inputs = list(node.input[n_state:])
    ranks, lengths = [], set()
    for j, x in enumerate(scan_inputs):
        shape = info.shape(x)
        axis = in_axes[j] % len(shape) if shape else None
        if shape is None or shape[axis] is None:
            raise UnsupportedModelError(
                f"Scan node {node.name!r}: scan input {x!r} has no static length; fix the "
                "input shapes (--input-shape) so that the scan can be unrolled")
        ranks.append(len(shape))
        in_axes[j] = axis
        lengths.add(shape[axis])
    if len(lengths) != 1:
        raise UnsupportedModelError(f"Scan node {node.name!r}: scan inputs of different "
                                    f"lengths {sorted(lengths)}")
    steps_count = lengths.pop()
    steps = _Steps(info)
    states = list(node.input[:n_state])
    per_step: list[list[str]] = [[] for _ in range(k)]
    for t in range(steps_count):
        elements = [steps.element(x, in_axes[j], steps_count - 1 - t if in_dirs[j] else t)
                    for j, x in enumerate(scan_inputs)]
        bindings = {body.input[i].name: states[i] for i in range(n_state)}
        bindings.update({body.input[n_state + j].name: e for j, e in enumerate(elements)})
        inlined, outs = inline_branch(body, info, node, bindings)
        steps.nodes.extend(inlined)
        states = outs[:n_state]
        for q in range(k):
            per_step[q].append(outs[n_state + q])
    for i in range(n_state):
        steps.nodes.append(helper.make_node("Identity", [states[i]], [node.output[i]]))
    for q in range(k):
        parts = per_step[q][::-1] if out_dirs[q] else per_step[q]
        rank = len(body.output[n_state + q].type.tensor_type.shape.dim) + 1
        steps.stacked(parts, out_axes[q] % rank, node.output[n_state + q])
    return steps.nodes
