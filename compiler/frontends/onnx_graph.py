"""What the ONNX-level rewrites need to know about a graph: constant values, inferred shapes and
element types, fresh names, and the opset. Built once per import, after input shapes are fixed."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import numpy_helper


class GraphInfo:
    """Read-only facts about a model's main graph, plus a fresh-name source for new nodes."""

    def __init__(self, model: onnx.ModelProto, opset: int):
        self.opset = opset
        self.constants = constant_values(model)
        self._types = _inferred_types(model)
        self._counter = itertools.count()
        self._used = {n for node in model.graph.node for n in [*node.input, *node.output]}

    def shape(self, name: str) -> list[int | None] | None:
        """Static dims (None where unknown), or None if even the rank is unknown."""
        if name in self.constants:
            return list(self.constants[name].shape)
        ttype = self._types.get(name)
        if ttype is None or not ttype.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]

    def elem_type(self, name: str) -> int | None:
        if name in self.constants:
            return onnx.helper.np_dtype_to_tensor_dtype(self.constants[name].dtype)
        ttype = self._types.get(name)
        return ttype.elem_type if ttype is not None and ttype.elem_type else None

    def fresh(self, hint: str) -> str:
        while True:
            name = f"aotc_{hint}_{next(self._counter)}"
            if name not in self._used:
                self._used.add(name)
                return name


def name_hint(name: str, length: int, fallback: str) -> str:
    """The last ``length`` characters of an ONNX name as an identifier (for the names of
    symbolic dims and functions made from it)."""
    return "".join(c if c.isalnum() else "_" for c in name)[-length:] or fallback


def node_attrs(node: onnx.NodeProto) -> dict:
    """The node's attributes as Python values, by name."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs of the main graph, as numpy."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = _constant_node_value(node)
            if value is not None:
                values[node.output[0]] = value
    return values


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    attr = node.attribute[0] if node.attribute else None
    if attr is None:
        return None
    value = onnx.helper.get_attribute_value(attr)
    if attr.name == "value":
        return numpy_helper.to_array(value)
    if attr.name in ("value_float", "value_int"):
        return np.array(value, dtype=np.float32 if attr.name == "value_float" else np.int64)
    if attr.name in ("value_floats", "value_ints"):
        return np.array(value, dtype=np.float32 if attr.name == "value_floats" else np.int64)
    return None


def _inferred_types(model: onnx.ModelProto) -> dict:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = model
    types = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type
    return types


def with_fixed_inputs(model: onnx.ModelProto, shapes: dict[str, tuple]) -> onnx.ModelProto:
    """A copy whose graph inputs carry the fixed shapes (so that shape inference sees them)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        dims = shapes.get(value.name)
        if dims is None or not value.type.HasField("tensor_type"):
            continue
        shape = value.type.tensor_type.shape
        if len(shape.dim) != len(dims):
            continue
        for dim, want in zip(shape.dim, dims):
            if isinstance(want, int):
                dim.Clear()
                dim.dim_value = want
    return fixed
