"""Padding an axis of symbolic length (a sequence) up to a multiple, for kernels that want
whole register tiles: attention's keys and query rows (FuseAttention), the rows of a packed
matmul (PrepackWeights, as blocks of rows).

The padded extent is written ``(n + 7) // 8 * 8``. Relax's own ops cannot give that type:
nn.pad and slice_scatter take constant widths, and a concat's shape simplifies to
``n + 7 - (n + 7) % 8``, whose divisibility neither the analyzer nor TVM's reshape rewriting
can prove (the kernels' splits would get bounds checks). So the padding is a TE compute (a
copy with ``value`` past the end) whose output has that shape."""

from __future__ import annotations

from tvm import te, tirx
from tvm.sym import Analyzer

_ANALYZER = Analyzer()

# PrimFunc attribute of a kernel that is pad_axis_to_blocks with zeros and nothing else (the
# packed matmuls' row padding, prepack_weights.row_blocks_packed): the axis it pads.
# passes/lowering/padded_rows_in_producer.py has such a pad's producer write the padded rows.
PAD_ROWS = "aotc.pad_rows"


def round_up(extent, multiple: int):
    """``extent`` rounded up to a multiple (an int, or the form above for a PrimExpr)."""
    if isinstance(extent, int):
        return -(-extent // multiple) * multiple
    return tirx.floordiv(extent + (multiple - 1), multiple) * multiple


def multiple_of(extent, multiple: int) -> bool:
    """Whether ``extent`` (an int or a PrimExpr) is provably a multiple."""
    if isinstance(extent, (int, tirx.IntImm)):
        return int(extent) % multiple == 0
    return _ANALYZER.can_prove_equal(tirx.floormod(extent, multiple), 0)


def pad_axis(x: te.Tensor, axis: int, multiple: int, value: float = 0.0) -> te.Tensor:
    """``x`` with ``value`` after the end of ``axis`` up to round_up(extent, multiple)."""
    extent = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = round_up(extent, multiple)
    return te.compute(shape, lambda *i: tirx.if_then_else(
        i[axis] < extent, x(*i), tirx.const(value, x.dtype)), name="padded")



def pad_axis_to_blocks(x: te.Tensor, axis: int, multiple: int,
                       value: float = 0.0) -> te.Tensor:
    """``x`` padded as pad_axis does, with the padded axis split into (blocks, ``multiple``):
    a kernel tiled along it then has a static row axis and a symbolic one of blocks. (Tiled
    along one padded axis, the tile's position came out of divisions by symbolic extents and
    its accumulator buffer kept offsets the compaction did not cancel.)"""
    extent = x.shape[axis]
    blocks = tirx.floordiv(extent + (multiple - 1), multiple)
    shape = list(x.shape[:axis]) + [blocks, multiple] + list(x.shape[axis + 1:])

    def value_at(*i):
        row = i[axis] * multiple + i[axis + 1]
        source = list(i[:axis]) + [row] + list(i[axis + 2:])
        return tirx.if_then_else(row < extent, x(*source), tirx.const(value, x.dtype))
    return te.compute(shape, value_at, name="padded_blocks")
