"""ONNX ``Loop``: the body becomes a Relax function of one step, which the runtime calls until
the loop ends. TVM 0.27 has no converter for Loop.

Why a host loop: Relax has no loop construct. A tail-recursive Relax function works in the VM
but each step is a C++ call frame and keeps its storage until the loop ends: a few thousand
steps overflow the stack, and memory grows with every step. A step function called from a loop
in the runtime uses one frame and frees each step's values when the next begins.

How: the body becomes ``step(i, cond, v..., captured...) -> (cond', v'..., elem...)``, a
dataflow function that fuses and schedules like any other. ``captured`` are the outer tensors
the body reads (ONNX lets a subgraph name outer values; a Relax function may not, so they are
passed); constants stay constants. The graph calls ``aotc.run_loop`` (runtime/loops.py, also in
the C++ runtime) through a small force-pure wrapper function, with the step function as a VM
closure, the numbers of carried values and scan outputs, the trip count, the condition, the
initial values, an empty tensor per scan output (its element shape, for a loop that runs no
step) and the captured tensors. ``aotc.run_loop``
runs ``while i < trip and cond``, threading the carried values, and stacks the scan elements
once at the end.

Shapes: a carried value keeps the static dims the body leaves unchanged (its kernels are built
for them) and gets a symbolic dim where the body changes it (a decoder's growing token list):
the body is converted with every dim as given, then again with the dims it changed made
symbolic, until nothing changes. A scan output's element has one shape on every step, as ONNX
requires; where that shape is known only while the loop runs, a loop that runs no step returns
the scan output with 0 for those dims.
"""

from __future__ import annotations

import onnx
import tvm
from tvm import relax, tirx
from tvm.relax import op as R
from tvm.sym import Analyzer

from aotc.errors import UnsupportedModelError
from aotc.runtime.loops import RUN_LOOP  # registered by the runtimes (also runtime/cpp)

from .onnx_graph import name_hint

INT64_MAX = (1 << 63) - 1
MAX_SHAPE_ROUNDS = 8


def subgraph_reads(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads from outside itself (nested subgraphs included), in first-use
    order."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    reads: list[str] = []

    def read(name: str) -> None:
        if name and name not in defined and name not in reads:
            reads.append(name)

    for node in graph.node:
        for name in node.input:
            read(name)
        for attr in node.attribute:
            subs = ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                    list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else [])
            for sub in subs:
                for name in subgraph_reads(sub):
                    if name not in defined:
                        read(name)
        defined.update(o for o in node.output if o)
    for out in graph.output:
        read(out.name)
    return reads


def _tensor_type(value, what: str) -> relax.TensorType:
    ty = getattr(value, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise UnsupportedModelError(
            f"Loop: {what} is not a tensor of known rank and shape ({ty}), which aotc's Loop "
            "converter needs")
    return ty


def _scalar(bb, value, dtype: str) -> relax.Expr:
    """A rank-0 tensor of ``dtype`` (exporters give trip counts and conditions as shape [1])."""
    ty = _tensor_type(value, "a trip count or condition")
    if ty.dtype != dtype:
        value = bb.emit(R.astype(value, dtype))
    if len(ty.shape.values) != 0:
        value = bb.emit(R.reshape(value, ()))
    return value


def _static(dim) -> bool:
    return isinstance(dim, (int, tirx.IntImm))


def _hint(name: str) -> str:
    return name_hint(name, 16, "loop")


def convert_loop(importer, inputs: list, attrs: dict, name: str) -> relax.Expr:
    """The Loop node's outputs (final carried values, then stacked scan outputs) as a Relax
    tuple; ``importer`` is the AotcImporter converting the graph."""
    bb = importer.bb
    body: onnx.GraphProto = attrs["body"]
    initial = list(inputs[2:])
    n_carried = len(initial)
    n_scan = len(body.output) - 1 - n_carried
    if len(body.input) != 2 + n_carried or n_scan < 0:
        raise UnsupportedModelError(
            f"Loop node {name!r}: its body has {len(body.input)} inputs and "
            f"{len(body.output)} outputs for {n_carried} carried values (ONNX wants "
            f"2 + carried inputs and 1 + carried + scan outputs)")
    trip = (_scalar(bb, inputs[0], "int64") if inputs[0] is not None
            else relax.const(INT64_MAX, "int64"))
    cond = (_scalar(bb, inputs[1], "bool") if inputs[1] is not None
            else relax.const(True, "bool"))
    for k, value in enumerate(initial):
        _tensor_type(value, f"carried value {k} of node {name!r}")
    captured_names, captured = [], []
    for outer in subgraph_reads(body):
        value = importer._nodes.get(outer)
        if value is None:
            raise UnsupportedModelError(
                f"Loop node {name!r}: its body reads {outer!r}, which is not defined")
        if isinstance(value, tvm.ir.expr.Constant) or (
                isinstance(value, relax.ShapeExpr) and all(map(_static, value.values))):
            continue  # constants are legal in any function
        _tensor_type(value, f"{outer!r}, which the body of node {name!r} reads")
        captured_names.append(outer)
        captured.append(value)

    loop = _StepFunction(importer, body, name, initial, captured_names, captured)
    step = loop.build()
    empties = [bb.emit(R.zeros(relax.ShapeExpr([0, *shape]), dtype))
               for shape, dtype in loop.scan_elements_outside()]
    args = [trip, cond, *initial, *empties, *captured]
    results = loop.result_types()
    runner = _runner(bb, name, step, (n_carried, n_scan), [_tensor_type(a, "") for a in args],
                     results)
    result = bb.emit(relax.Call(runner, args))
    outputs = []
    for k, ty in enumerate(results):
        item = bb.emit(relax.TupleGetItem(result, k))
        dims = [d if d is not None else tirx.Var(f"loop_{_hint(name)}_{k}_{a}", "int64")
                for a, d in enumerate(loop.outside_dims(k))]
        outputs.append(bb.match_cast(item, relax.TensorType(dims, ty.dtype)))
    return relax.Tuple(outputs)


def _runner(bb, name: str, step: relax.GlobalVar, counts: tuple, arg_types: list,
            results: list) -> relax.GlobalVar:
    """``runner(trip, cond, initial..., empties..., captured...)``: the call of RUN_LOOP, in a
    function of its own marked force-pure (the call hands the VM's context to the runtime,
    which Relax counts as impure; the loop itself changes nothing it is given), so the graph
    around it stays one dataflow block."""
    params = []
    for k, ty in enumerate(arg_types):
        dims = [tirx.Var(f"run_{k}_{a}", "int64") for a in range(ty.ndim)]
        params.append(relax.Var(f"arg{k}", relax.TensorType(dims, ty.dtype)))
    ret = relax.TupleType(results)
    bb.begin_scope(params)
    bb._begin_binding_block()
    call = relax.op.call_builtin_with_ctx(
        RUN_LOOP, [step, *(relax.prim_value(tirx.IntImm("int64", n)) for n in counts), *params],
        ty_args=[ret])
    out = bb.emit(call)
    block = bb._end_block()
    bb.end_scope()
    func = relax.Function(params, relax.SeqExpr([block], out), ret, is_pure=True,
                          attrs=tvm.ir.make_node("ir.DictAttrs", **{"relax.force_pure": True}))
    return bb.add_func(func, bb.get_unique_name(f"run_{_hint(name)}"))


class _Dims:
    """The step function's own symbolic dims, created once so that every conversion round
    names them alike. A dim the loop keeps gets one var per dim of the caller's (the batch of
    a carried value and of a captured input stay one dim, and the kernels know they agree); a
    dim the loop changes gets a var of its own."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.vars: dict[tuple, tirx.Var] = {}
        self.outside: dict[tirx.Var, object] = {}  # var -> the caller's dim it stands for

    def changing(self, k: int, axis: int) -> tirx.Var:
        return self._var(("changing", k, axis), f"v{k}_{axis}")

    def kept(self, outer) -> tirx.Var:
        var = self._var(("kept", str(outer)), f"d{len(self.outside)}")
        self.outside[var] = outer
        return var

    def _var(self, key: tuple, suffix: str) -> tirx.Var:
        if key not in self.vars:
            self.vars[key] = tirx.Var(f"{self.prefix}_{suffix}", "int64")
        return self.vars[key]


class _StepFunction:
    """Builds the step function of one Loop node, converting the body until the carried shapes
    settle."""

    def __init__(self, importer, body, name, initial, captured_names, captured):
        self.importer, self.body, self.name = importer, body, name
        self.initial, self.captured_names, self.captured = initial, captured_names, captured
        self.dims = _Dims(f"step_{_hint(name)}")
        self.init_shapes = [list(_tensor_type(v, "").shape.values) for v in initial]
        # per carried value and axis: True where the body changes the dim
        self.varying = [[False] * len(s) for s in self.init_shapes]
        self.elements: list[tuple[list, str]] = []  # scan elements' shapes, in step dims

    # -- types ------------------------------------------------------------------------------
    def _carried_param(self, k: int) -> relax.TensorType:
        dims = [self.dims.changing(k, a) if vary else dim if _static(dim) else self.dims.kept(dim)
                for a, (dim, vary) in enumerate(zip(self.init_shapes[k], self.varying[k]))]
        return relax.TensorType(dims, _tensor_type(self.initial[k], "").dtype)

    def _captured_param(self, k: int) -> relax.TensorType:
        ty = _tensor_type(self.captured[k], "")
        dims = [dim if _static(dim) else self.dims.kept(dim) for dim in ty.shape.values]
        return relax.TensorType(dims, ty.dtype)

    def result_types(self) -> list[relax.TensorType]:
        """The loop's outputs as the runner returns them: a carried value with its static
        dims where the body keeps them all, else only its rank; a stacked scan output with
        its rank."""
        types = []
        for k in range(len(self.initial)):
            ty = self._carried_param(k)
            static = all(map(_static, ty.shape.values))
            types.append(ty if static else relax.TensorType(ndim=ty.ndim, dtype=ty.dtype))
        types += [relax.TensorType(ndim=len(shape) + 1, dtype=dtype)
                  for shape, dtype in self.elements]
        return types

    # -- conversion -------------------------------------------------------------------------
    def build(self) -> relax.GlobalVar:
        for _ in range(MAX_SHAPE_ROUNDS):
            func = self._convert()
            if func is not None:
                bb = self.importer.bb
                name = bb.get_unique_name(f"step_{_hint(self.name)}")
                # public: the runtime calls it by name, with the parameters it was built with
                # (passes may drop unused parameters of private functions)
                return bb.add_func(func.with_attr("global_symbol", name), name)
        raise UnsupportedModelError(
            f"Loop node {self.name!r}: the shapes its body carries did not settle after "
            f"{MAX_SHAPE_ROUNDS} rounds")

    def _convert(self) -> relax.Function | None:
        """This round's step function, or None when the body changed what the round assumed
        (the next round uses what it learned)."""
        importer, bb = self.importer, self.importer.bb
        n_carried = len(self.initial)
        params = [relax.Var("iter", relax.TensorType((), "int64")),
                  relax.Var("cond", relax.TensorType((), "bool"))]
        params += [relax.Var(f"carried{k}", self._carried_param(k)) for k in range(n_carried)]
        params += [relax.Var(f"outer{k}", self._captured_param(k))
                   for k in range(len(self.captured))]
        bb.begin_scope(params)
        bb._begin_dataflow_block()
        saved = importer._nodes
        nodes = dict(saved)
        nodes.update(zip(self.captured_names, params[2 + n_carried:]))
        nodes.update(zip((x.name for x in self.body.input), params[:2 + n_carried]))
        importer._nodes = type(saved)(nodes, bb) if hasattr(saved, "bb") else nodes
        try:
            result = importer._convert_subgraph(bb, self.body)
        finally:
            importer._nodes = saved
        outs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
        outs = [bb.normalize(o) for o in outs]
        outs[0] = _scalar(bb, outs[0], "bool")
        if self._learn(outs[1:1 + n_carried], outs[1 + n_carried:]):
            bb._end_block()
            bb.end_scope()
            return None
        out = bb.emit_output(relax.Tuple(outs))
        block = bb._end_block()
        bb.end_scope()
        return relax.Function(params, relax.SeqExpr([block], out), out.ty, is_pure=True)

    def _learn(self, v_out: list, elems: list) -> bool:
        """Marks the carried dims this round's body changed and records the scan elements'
        shapes; True if either differs from what the round assumed."""
        changed = False
        analyzer = Analyzer()
        for k, value in enumerate(v_out):
            assumed = self._carried_param(k)
            ty = getattr(value, "ty", None)
            if not isinstance(ty, relax.TensorType) or ty.ndim != assumed.ndim or \
                    ty.dtype != assumed.dtype:
                raise UnsupportedModelError(
                    f"Loop node {self.name!r}: carried value {k} changes rank or dtype in "
                    f"the body ({assumed} -> {ty})")
            got = ty.shape.values if ty.shape is not None else [None] * ty.ndim
            for a, (want, have) in enumerate(zip(assumed.shape.values, got)):
                if not self.varying[k][a] and (
                        have is None or not analyzer.can_prove_equal(want, have)):
                    self.varying[k][a] = True
                    changed = True
        self.elements = [
            (list(_tensor_type(value, f"scan output {k} of node {self.name!r}").shape.values),
             value.ty.dtype) for k, value in enumerate(elems)]
        return changed

    # -- shapes outside the step function ---------------------------------------------------
    def _outside(self, dim):
        """``dim`` (over the step function's dims) in the caller's terms, or None when it
        depends on a dim the loop changes."""
        if _static(dim):
            return dim
        analyzer = Analyzer()
        for var, outer in self.dims.outside.items():
            analyzer.bind(var, outer)
        expr = analyzer.simplify(dim)
        callers = {v for outer in self.dims.outside.values() if not _static(outer)
                   for v in tirx.analysis.undefined_vars(outer)}
        if any(v not in callers for v in tirx.analysis.undefined_vars(expr)):
            return None
        return expr

    def scan_elements_outside(self) -> list:
        """Shape and dtype of each scan output's element, in the caller's terms: the empty
        tensor a loop that runs no step returns. A dim only the steps know (it depends on the
        values the loop carries) is 0 there."""
        return [([0 if d is None else d for d in map(self._outside, shape)], dtype)
                for shape, dtype in self.elements]

    def outside_dims(self, k: int) -> list:
        """The caller's view of output k's dims; None where only the run knows it."""
        n_carried = len(self.initial)
        if k < n_carried:
            return [None if self.varying[k][a] else self._outside(dim)
                    for a, dim in enumerate(self._carried_param(k).shape.values)]
        return [None] + [self._outside(d) for d in self.elements[k - n_carried][0]]
