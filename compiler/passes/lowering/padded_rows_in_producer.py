"""PaddedRowsInProducer: a kernel whose only consumer pads its rows to whole blocks
(``pad_rows``: PrepackWeights' and ConvertBF16's packed matmuls over rows that are not a
multiple of their tile) writes its result straight into the padded buffer, and the pad kernel
is gone.

Why: the AMX matmuls load whole tiles of 16 rows, so their activation is copied into rows
padded to a multiple of 16 (Whisper's 1,500 frames: 1,504) before each of them: the output of
the layer norm before the attention projections and the MLP, and the MLP's first matmul's
output before its second (1,500 x 2,048). Each copy reads and writes the whole activation
once more.

How: the producer's output buffer keeps its indices and takes the padded row count as the
extent of its row axis; its rows past the old extent get zeros (a loop nest appended to the
kernel), as pad_rows wrote; the pad's output is then a reshape of that buffer ([..., rows,
...] -> [..., blocks, block, ...], a view). The values the consumer reads are the ones it read
before, bit for bit.

Which: a pad kernel marked ``PAD_ROWS`` (prepack_weights.row_blocks_packed) of a static row
count, whose input is the result of a ``call_tir`` that nothing else reads. A kernel shared
with other call sites is copied (``<name>_padded``), the others keep the original.

Where: the schedule phase's end, after the rules: the kernels tuning sees and the records it
keeps are those of the lowered module, unchanged; the appended zero rows are a few rows of
stores."""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx

from ...default_schedules.cpu_blocks import renew_definitions
from ...frontends.relax_shapes import static_shape
from ...relax_walk import mutate_functions, value_uses
from ...symbolic_padding import PAD_ROWS


def _zero_rows(out: tirx.Var, shape: list[int], axis: int, rows: int, dtype: str
               ) -> tirx.Stmt:
    """A loop nest that stores zero into ``out``'s rows ``rows``.. along ``axis`` (indices of
    type ``dtype``, as its shape's)."""
    extents = [tirx.const(e - rows if k == axis else e, dtype) for k, e in enumerate(shape)]
    loops = [tirx.Var(f"z{k}", dtype) for k in range(len(shape))]
    iters = [tirx.IterVar(tvm.ir.Range.from_min_extent(tirx.const(0, dtype), e),
                          tirx.Var(f"v_z{k}", dtype), 0) for k, e in enumerate(extents)]
    index = [it.var + tirx.const(rows, dtype) if k == axis else it.var
             for k, it in enumerate(iters)]
    block = s_tir.SBlock(iters, [], [out[tuple(slice(i, i + 1) for i in index)]],
                         "padded_rows_zero",
                         tirx.BufferStore(out, tirx.const(0, out.ty.dtype), index))
    stmt: tirx.Stmt = s_tir.SBlockRealize(loops, True, block)
    for var, extent in reversed(list(zip(loops, extents))):
        stmt = tirx.For(var, tirx.const(0, dtype), extent, tirx.ForKind.SERIAL, stmt)
    return stmt


def writes_padded(func: tirx.PrimFunc, axis: int, padded: int) -> tirx.PrimFunc | None:
    """``func`` (a kernel whose last parameter is its output) writing into an output whose
    ``axis`` has ``padded`` rows, the rows past its own extent zero; None where its output
    shape is not static or its strides are explicit (they would no longer match)."""
    out = func.params[-1]
    if not all(isinstance(d, tirx.IntImm) for d in out.ty.shape):
        return None
    shape = [int(d) for d in out.ty.shape]
    if not 0 <= axis < len(shape) or shape[axis] >= padded or len(out.ty.strides):
        return None
    rows, t = shape[axis], out.ty
    dtype = str(t.shape[axis].ty)
    new_shape = [padded if k == axis else e for k, e in enumerate(shape)]
    new_out = tirx.Var(out.name, tirx.BufferType(
        t.dtype, t.storage_scope, [tirx.const(e, dtype) for e in new_shape], t.strides,
        t.elem_offset, t.data_alignment, t.offset_factor, t.layout, t.allocated_addr))
    # a copy: the original stays in the module for its other call sites
    func = renew_definitions(func, {out: new_out})
    zeros = _zero_rows(new_out, new_shape, axis, rows, dtype)
    body = func.body
    if isinstance(body, s_tir.SBlockRealize) and not body.iter_values:
        root = body.block
        block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                             tirx.SeqStmt([root.body, zeros]), root.init, root.alloc_buffers,
                             root.match_buffers, root.annotations)
        return func.with_body(s_tir.SBlockRealize([], True, block))
    return func.with_body(tirx.SeqStmt([body, zeros]))


def _call_tir_parts(expr):
    """(global var, arguments) of a plain ``call_tir`` (no shape arguments), else None."""
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op) or \
            expr.op.name != "relax.call_tir" or len(expr.args) != 2 or \
            not isinstance(expr.args[1], relax.Tuple):
        return None
    return expr.args[0], list(expr.args[1].fields)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.single_use = {v for v, n in value_uses(mod).items() if n == 1}
        self.values: dict = {}
        self.made: dict = {}   # (producer global var name, axis, padded) -> global var

    def visit_var_binding_(self, binding):
        self.values[binding.var] = binding.value
        new = self._padded_in_producer(binding)
        if new is None:
            super().visit_var_binding_(binding)
            return
        self.set_var_remap(binding.var, new)

    def _padded_in_producer(self, binding):
        pad = _call_tir_parts(binding.value)
        if pad is None or len(pad[1]) != 1 or not isinstance(pad[1][0], relax.DataflowVar):
            return None
        pad_func = self.mod[pad[0]]
        if not isinstance(pad_func, tirx.PrimFunc) or pad_func.attrs is None or \
                PAD_ROWS not in pad_func.attrs:
            return None
        source = pad[1][0]
        producer_value = self.values.get(source)
        producer = _call_tir_parts(producer_value)
        if producer is None or producer_value not in self.single_use:
            return None
        axis = int(pad_func.attrs[PAD_ROWS])
        padded_shape = static_shape(binding.var)
        source_shape = static_shape(source)
        func = self.mod[producer[0]]
        if padded_shape is None or source_shape is None or \
                not isinstance(func, tirx.PrimFunc) or len(func.params) != len(producer[1]) + 1:
            return None
        padded = padded_shape[axis] * padded_shape[axis + 1]
        key = (producer[0].name_hint, axis, padded)
        if key not in self.made:
            new_func = writes_padded(func, axis, padded)
            if new_func is None:
                return None
            name = f"{producer[0].name_hint}_padded"
            if new_func.attrs is not None and "global_symbol" in new_func.attrs:
                new_func = new_func.with_attr("global_symbol", name)
            self.made[key] = self.builder_.add_func(new_func, name)
        written = [padded if k == axis else e for k, e in enumerate(source_shape)]
        args = [self.visit_expr(a) for a in producer[1]]
        out = self.builder_.emit(relax.call_tir(
            self.made[key], args, relax.TensorType(written, source.ty.dtype)))
        return self.builder_.emit(relax.op.reshape(out, relax.ShapeExpr(padded_shape)))


@tvm.transform.module_pass(opt_level=0, name="PaddedRowsInProducer")
class PaddedRowsInProducer:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not any(isinstance(f, tirx.PrimFunc) and f.attrs is not None and PAD_ROWS in f.attrs
                   for _, f in mod.functions_items()):
            return mod
        return relax.transform.DeadCodeElimination()(mutate_functions(mod, _Rewriter(mod)))
