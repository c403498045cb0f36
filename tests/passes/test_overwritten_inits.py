"""DropOverwrittenInits on scheduled kernels: a tile of a 6 x 10 by 10 x 8 matmul whose block
(as tensorize leaves it) keeps the reduction init it was made with, while its body, marked as a
tile intrinsic that sums from zero (amx_intrinsics.SUMS_FROM_ZERO), sets every sum of its tile
itself.

Before: each tile is set to zero, then computed. After: the marked block has neither the init
nor the mark; an unmarked block with the same init keeps it. Numbers: equal to the original's,
with nothing written past the output."""

import numpy as np
import tvm
from kernel_helpers import check_guard, guarded_output
from tvm.script import tirx as T

from aotc.compiler.default_schedules.amx_intrinsics import SUMS_FROM_ZERO
from aotc.compiler.passes.lowering.overwritten_inits import (
    DropOverwrittenInits,
    drop_overwritten_inits,
)


def _tiled(marked: bool):
    """A 6 x 10 by 10 x 8 matmul in tiles of 3 rows x 4 columns, each the block tensorize
    makes: the init of the tile, then a body that computes the tile from zero."""
    annotations = {SUMS_FROM_ZERO: True} if marked else {}

    @T.prim_func(s_tir=True)
    def func(a: T.Buffer((6, 10), "float32"), b: T.Buffer((10, 8), "float32"),
             c: T.Buffer((6, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        for io, jo in T.grid(2, 2):
            with T.sblock("sum_o"):
                vio, vjo = T.axis.remap("SS", [io, jo])
                _ko = T.axis.reduce(1, 0)
                T.reads(c[vio * 3:vio * 3 + 3, vjo * 4:vjo * 4 + 4],
                        a[vio * 3:vio * 3 + 3, 0:10], b[0:10, vjo * 4:vjo * 4 + 4])
                T.writes(c[vio * 3:vio * 3 + 3, vjo * 4:vjo * 4 + 4])
                T.sblock_attr(annotations)
                with T.init():
                    for i, j in T.grid(3, 4):
                        c[vio * 3 + i, vjo * 4 + j] = T.float32(0)
                for i, j in T.grid(3, 4):
                    acc = T.alloc_buffer((1,), "float32", scope="local")
                    acc[0] = T.float32(0)
                    for r in range(10):
                        acc[0] = acc[0] + a[vio * 3 + i, r] * b[r, vjo * 4 + j]
                    c[vio * 3 + i, vjo * 4 + j] = acc[0]
    return func


@T.prim_func(s_tir=True)
def expected(a: T.Buffer((6, 10), "float32"), b: T.Buffer((10, 8), "float32"),
             c: T.Buffer((6, 8), "float32")):
    T.func_attr({"tirx.noalias": True})
    for io, jo in T.grid(2, 2):
        with T.sblock("sum_o"):
            vio, vjo = T.axis.remap("SS", [io, jo])
            _ko = T.axis.reduce(1, 0)
            T.reads(c[vio * 3:vio * 3 + 3, vjo * 4:vjo * 4 + 4],
                    a[vio * 3:vio * 3 + 3, 0:10], b[0:10, vjo * 4:vjo * 4 + 4])
            T.writes(c[vio * 3:vio * 3 + 3, vjo * 4:vjo * 4 + 4])
            for i, j in T.grid(3, 4):
                acc = T.alloc_buffer((1,), "float32", scope="local")
                acc[0] = T.float32(0)
                for r in range(10):
                    acc[0] = acc[0] + a[vio * 3 + i, r] * b[r, vjo * 4 + j]
                c[vio * 3 + i, vjo * 4 + j] = acc[0]


def test_the_marked_block_loses_its_init_and_mark():
    before = _tiled(marked=True)
    assert before.body.block.body.body.body.block.init is not None  # tiles set to zero first
    after = DropOverwrittenInits()(tvm.IRModule({"main": before}))["main"]
    tvm.ir.assert_structural_equal(after, expected.with_attr("global_symbol", "func"))


def test_an_unmarked_block_keeps_its_init():
    before = _tiled(marked=False)
    assert drop_overwritten_inits(before).same_as(before)


def test_numbers_match_the_original():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 10)).astype(np.float32)
    b = rng.standard_normal((10, 8)).astype(np.float32)
    before = _tiled(marked=True)
    target = tvm.target.Target({"kind": "llvm"})
    outs = []
    for func in (before, drop_overwritten_inits(before)):
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
        got, whole = guarded_output((6, 8), "float32")
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), got)
        check_guard(whole, (6, 8))
        outs.append(got.numpy())
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outs[1], outs[0])
