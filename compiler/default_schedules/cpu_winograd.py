"""``WinogradTransform``: the default schedule of the Winograd input and output transforms
(compiler/winograd_kernels.py; their matmul is a packed contraction, PackedDot's).

Each transform is a Select over its position index of one expression per position. Unrolled
over that index, every copy keeps only its own expression (TIR's simplifier folds the
Select on the now constant index, LLVM shares the loads the copies have in common); the
channel axis, innermost in every tensor, is vectorized. Parallel over tiles. Left to Generic,
the Select chain ran per element, every expression evaluated. The output transform takes the
conv's epilogue (bias, activation, residual add) inlined, as the contraction rules do."""

from __future__ import annotations

from types import SimpleNamespace

from tvm import s_tir
from tvm.s_tir.schedule import ScheduleError
from tvm.target import Target

from ..winograd_kernels import INPUT_BLOCK, INPUT_ROWS_BLOCK, OUTPUT_BLOCK, OUTPUT_ROWS_BLOCK
from .cpu_blocks import (
    CpuRule,
    _extent,
    _largest_divisor,
    schedule_injective_block,
    vector_lanes,
)
from .cpu_contraction import Contraction


class WinogradTransform(CpuRule):
    """The input transform (its fused producers inlined) and the output transform (the conv's
    epilogue inlined), each parallel over tiles with its first stage computed per tile."""

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False):
        """Schedule ``sch`` in place (it may be MetaSchedule's traced schedule); None when it is
        no Winograd transform."""
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        names = [sch.get(block).name_hint for block in blocks]
        lanes = vector_lanes(target)
        if OUTPUT_BLOCK in names:
            index = names.index(OUTPUT_BLOCK)
            main = blocks[index]
            Contraction._inline_epilogues(
                sch, main, [SimpleNamespace(block_rv=b) for b in blocks[index + 1:]], lanes)
            self._output(sch, main, sch.get_sblock(OUTPUT_ROWS_BLOCK), lanes)
            for block in sch.get_child_blocks(sch.get_sblock("root")):
                if not sch.get(block).same_as(sch.get(main)):  # producers, epilogues left
                    schedule_injective_block(sch, block, lanes)
            return sch
        if INPUT_BLOCK in names:
            index = names.index(INPUT_ROWS_BLOCK)
            for producer in reversed(blocks[:index]):
                try:  # a fused elementwise producer (a relu) is read through the transform
                    sch.compute_inline(producer)
                except ScheduleError:
                    schedule_injective_block(sch, producer, lanes)
            for consumer in blocks[names.index(INPUT_BLOCK) + 1:]:
                schedule_injective_block(sch, consumer, lanes)
            self._input(sch, sch.get_sblock(INPUT_BLOCK), sch.get_sblock(INPUT_ROWS_BLOCK),
                        lanes)
            return sch
        return None

    @staticmethod
    def _channels(sch, loop, lanes: int):
        """(outer, vector) split of the channel loop, the vector as wide as a register or the
        largest divisor of the channels below it."""
        vector = _largest_divisor(_extent(sch, loop), lanes)
        return sch.split(loop, factors=[None, vector])

    def _input(self, sch, block, rows, lanes: int) -> None:
        position, tile, channel = sch.get_loops(block)
        alpha = self._leading_extent(sch, rows)   # m + 2 rows of B^T d
        row, col = sch.split(position, factors=[alpha, None])
        channel_outer, channel_lane = self._channels(sch, channel, lanes)
        sch.reorder(tile, channel_outer, row, col, channel_lane)
        sch.parallel(tile)
        sch.unroll(row)
        sch.unroll(col)
        sch.vectorize(channel_lane)
        self._stage_at(sch, rows, channel_outer)

    def _output(self, sch, block, rows, lanes: int) -> None:
        m = self._leading_extent(sch, rows)   # m rows of A^T M
        batch, h, w, channel = sch.get_loops(block)
        tile_h, row = sch.split(h, factors=[None, m])
        tile_w, col = sch.split(w, factors=[None, m])
        channel_outer, channel_lane = self._channels(sch, channel, lanes)
        sch.reorder(batch, tile_h, tile_w, channel_outer, row, col, channel_lane)
        sch.parallel(sch.fuse(batch, tile_h, tile_w))
        sch.unroll(row)
        sch.unroll(col)
        sch.vectorize(channel_lane)
        self._stage_at(sch, rows, channel_outer)

    @staticmethod
    def _leading_extent(sch, rows) -> int:
        return int(sch.get(rows).iter_vars[0].dom.extent)

    @staticmethod
    def _stage_at(sch, rows, loop) -> None:
        """The first (rows) stage computed per tile and channel vector, under ``loop`` (the
        second of the nest: tiles, channel vectors): a small buffer that stays in L1, its
        loops unrolled and the channels vectorized."""
        sch.compute_at(rows, loop, preserve_unit_loops=False)
        *unrolled, lane = sch.get_loops(rows)[2:]
        for loop_ in unrolled:
            sch.unroll(loop_)
        sch.vectorize(lane)
