"""NonZero as a TIR kernel: TVM runs ``relax.nonzero`` through ``relax.run.nonzero``, a numpy
function registered by TVM's Python package, so a model using it ran only in a process that
had imported TVM's compiler.

How: the count of non-zero elements is computed first (a reduction); it becomes the output's
symbolic extent; one serial pass then writes the coordinates of each non-zero element in
row-major order, as onnxruntime and numpy give them."""

from __future__ import annotations

from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .sort_kernels import INDEX, local_scalar


def _nonzero_ir(data, out, out_count):
    shape = [tirx.Cast(INDEX, d) for d in data.shape]
    total = tirx.const(1, INDEX)
    for dim in shape:
        total = total * dim
    with IRBuilder() as ib:
        flat, out = T.buffer_proxy(data), T.buffer_proxy(out)  # flat indices
        count = tirx.Cast(INDEX, out_count)
        with T.serial(0, 1):  # one pass; the builder declares the counter inside a frame
            found = local_scalar(INDEX)
            found[0] = tirx.const(0, INDEX)
            with T.serial(0, total) as i:
                with T.If(_is_set(flat[i], data.dtype)):
                    with T.Then():
                        rest = tirx.Cast(INDEX, i)
                        for axis in reversed(range(len(shape))):
                            out[axis * count + found[0]] = tirx.floormod(rest, shape[axis])
                            rest = tirx.floordiv(rest, shape[axis])
                        found[0] = found[0] + 1
        return ib.get()


def _is_set(value, dtype: str):
    return value if dtype == "bool" else value != tirx.const(0, dtype)


def nonzero(data: te.Tensor, count) -> te.Tensor:
    """int64 [rank, count]: the coordinates of data's ``count`` non-zero elements."""
    rank = max(len(data.shape), 1)
    if not data.shape:  # a scalar is treated as a 1-element vector (numpy.atleast_1d)
        data = te.compute((1,), lambda _i: data(), name="aotc_nonzero_scalar")
    return te.extern([(rank, count)], [data], lambda ins, outs: _nonzero_ir(ins[0], outs[0], count),
                     dtype=[INDEX], name="aotc_nonzero", tag="aotc_nonzero")
