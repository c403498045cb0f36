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
from tvm import relax, tirx

from ...default_schedules.cpu_blocks import renew_definitions
from ...frontends.relax_shapes import static_shape
from ...relax_walk import mutate_functions, value_uses
from ...symbolic_padding import PAD_ROWS
from .producer_rewrites import (
    call_tir_parts,
    fill,
    renamed,
    root_block,
    statements,
    static_buffer_shape,
    with_root_block,
    with_shape,
)


def writes_padded(func: tirx.PrimFunc, axis: int, padded: int) -> tirx.PrimFunc | None:
    """``func`` (a kernel whose last parameter is its output) writing into an output whose
    ``axis`` has ``padded`` rows, the rows past its own extent zero; None where its output
    shape is not static or its strides are explicit (they would no longer match)."""
    out = func.params[-1]
    shape = static_buffer_shape(out)
    if shape is None or not 0 <= axis < len(shape) or shape[axis] >= padded or \
            len(out.ty.strides):
        return None
    rows = shape[axis]
    dtype = str(out.ty.shape[axis].ty)
    new_shape = [padded if k == axis else e for k, e in enumerate(shape)]
    new_out = with_shape(out, new_shape, dtype)
    # a copy: the original stays in the module for its other call sites
    func = renew_definitions(func, {out: new_out})
    zeros = fill(new_out, [rows if k == axis else 0 for k in range(len(shape))],
                 [e - rows if k == axis else e for k, e in enumerate(new_shape)], 0, dtype,
                 "padded_rows_zero", "z")
    root = root_block(func)
    if root is not None:
        return with_root_block(func, body=[*statements(root.body), zeros])
    return func.with_body(tirx.SeqStmt([func.body, zeros]))


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
        pad = call_tir_parts(binding.value)
        if pad is None or len(pad[1]) != 1 or not isinstance(pad[1][0], relax.DataflowVar):
            return None
        pad_func = self.mod[pad[0]]
        if not isinstance(pad_func, tirx.PrimFunc) or pad_func.attrs is None or \
                PAD_ROWS not in pad_func.attrs:
            return None
        source = pad[1][0]
        producer_value = self.values.get(source)
        producer = call_tir_parts(producer_value)
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
            self.made[key] = self.builder_.add_func(renamed(new_func, name), name)
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
