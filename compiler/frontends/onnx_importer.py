"""TVM's ONNX importer, with aotc's own Relax converters tried first.

Why: a few ONNX features cannot be rewritten at the ONNX level (onnx_rewrites.py) because
their result's shape depends on run-time values, and TVM's converters refuse them (reductions
over run-time axes). A converter here sees the node's Relax inputs and returns a Relax
expression, or None to leave the node to TVM's converter. The installed TVM is not modified:
the importer class is subclassed.
"""

from __future__ import annotations

from functools import partial

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from .onnx_bitcast import bitcast
from .onnx_graph import name_hint
from .onnx_loop import convert_loop
from .onnx_ops import model_opset
from .onnx_pad import convert_pad
from .onnx_runtime_axes import REDUCTIONS, convert_reduction
from .onnx_runtime_params import CONVERTERS as RUNTIME_PARAM_CONVERTERS
from .onnx_symbolic import SymbolicShapes

# op -> converter(bb, inputs, attrs, opset, params) returning a Relax expr, or None
OWN_RELAX_CONVERTERS = {**{op: partial(convert_reduction, op) for op in REDUCTIONS},
                        **RUNTIME_PARAM_CONVERTERS, "BitCast": bitcast, "Pad": convert_pad}
# Ops TVM has no converter for at all: only OWN_RELAX_CONVERTERS handle them.
RELAX_ONLY = frozenset({"CumProd", "BitCast", "Loop"})


class AotcImporter(onnx_frontend.ONNXGraphImporter):
    """ONNXGraphImporter whose operator conversion asks the symbolic shape converters
    (onnx_symbolic.py), then OWN_RELAX_CONVERTERS, then TVM's."""

    given_ranges: dict = {}

    def _check_for_unsupported_ops(self, graph):
        """TVM's up-front check, without the ops only aotc converts (aotc's own op check has
        already listed every unsupported op of the user's graph)."""
        if not any(n.op_type in RELAX_ONLY for n in graph.node):
            return super()._check_for_unsupported_ops(graph)
        nodes_only = onnx.GraphProto()  # the check reads only the nodes; weights stay behind
        nodes_only.node.extend(n for n in graph.node if n.op_type not in RELAX_ONLY)
        return super()._check_for_unsupported_ops(nodes_only)

    def _parse_graph_input(self, graph):
        super()._parse_graph_input(graph)
        self._nodes = _ShapedNodes(self._nodes, self.bb)
        self.symbolic = SymbolicShapes(self.bb)
        for value in self._inputs.values():
            shape = getattr(value.ty, "shape", None)
            if isinstance(shape, relax.ShapeExpr):
                self.symbolic.bound_dims(shape.values)
                for dim in shape.values:
                    if isinstance(dim, tvm.tirx.Var) and dim.name in self.given_ranges:
                        low, high = self.given_ranges[dim.name]
                        self.symbolic.limit(dim, low, high, "--input-range")

    def _convert_subgraph(self, bb, graph):
        result = super()._convert_subgraph(bb, graph)
        self._nodes = _ShapedNodes(self._nodes, self.bb)  # TVM restores a plain dict
        return result

    def _convert_operator(self, op_name, inputs, attrs, opset):
        if op_name == "Loop":
            return convert_loop(self, list(inputs), attrs, attrs["tvm_custom"]["name"])
        symbolic = getattr(self, "symbolic", None)
        result = symbolic.convert(op_name, inputs, attrs) if symbolic is not None else None
        if result is not None:
            return self.bb.normalize(result)
        own = OWN_RELAX_CONVERTERS.get(op_name)
        params = [self._nodes, self._params]
        result = own(self.bb, inputs, attrs, opset, params) if own else None
        if result is None:
            return super()._convert_operator(op_name, inputs, attrs, opset)
        return self.bb.normalize(result)


class _ShapedNodes(dict):
    """The importer's table of ONNX names to Relax values. A tensor stored with a known rank
    and an unknown shape (the result of an ``If`` whose branches give different shapes) gets
    fresh symbolic dims through a match_cast: LegalizeOps turns only ops of known shape into
    kernels ("CodeGenVM cannot emit R.nn.relu" on the If's result)."""

    def __init__(self, nodes: dict, bb):
        super().__init__(nodes)
        self.bb = bb

    def __setitem__(self, name, value):
        ty = getattr(value, "ty", None)
        if isinstance(value, relax.Var) and isinstance(ty, relax.TensorType) and \
                ty.shape is None and ty.ndim >= 0:
            hint = name_hint(name, 24, "dim")
            dims = [tvm.tirx.Var(f"{hint}_{k}", "int64") for k in range(ty.ndim)]
            value = self.bb.match_cast(value, relax.TensorType(dims, ty.dtype))
        super().__setitem__(name, value)


def import_graph(model: onnx.ModelProto, shape_dict: dict, dtype_dict: dict,
                 dim_ranges: dict | None = None) -> tuple[tvm.IRModule, dict]:
    """What ``tvm.relax.frontend.onnx.from_onnx`` does, through AotcImporter (weights become
    constants; input names are sanitized as TVM does). Returns the module and the ranges of
    the symbolic dims: ``dim_ranges`` as given, narrowed by what the graph needs."""
    if model.ir_version < 3:
        raise ValueError(f"ONNX IR version {model.ir_version} is older than 3 (ONNX 1.1), "
                         "which TVM's importer does not read")
    importer = AotcImporter(shape_dict, dtype_dict, keep_params_in_input=False, sanitize=True)
    importer.given_ranges = dict(dim_ranges or {})
    mod = importer.from_onnx(model.graph, model_opset(model))
    symbolic = getattr(importer, "symbolic", None)
    return mod, dict(symbolic.ranges) if symbolic is not None else {}
