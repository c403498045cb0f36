"""WholeVectorPredicates on scheduled kernels: a vectorized loop over 37 columns in vectors of
16 whose block is guarded by ``column < 37`` (and ``row < 5``, rows computed in tiles of 8).

Before: TVM's VectorizeLoop scalarizes the whole loop for the guard's sake, in every vector of
every row. After: where the last lane of a vector passes the guard (columns 0-31) the loop runs
vectorized under the row guard alone; the vector over columns 32-47 runs as the guarded
serial loop it was. Guards that the last lane passing does not make true for every lane are
left alone. Numbers: equal to the original's, with nothing written past the output."""

import numpy as np
import pytest
import tvm
from kernel_helpers import SENTINEL, check_guard, guarded_output
from tvm.script import tirx as T

from aotc.compiler.passes.lowering.whole_vector_predicates import (
    WholeVectorPredicates,
    whole_vector_predicates,
)


@T.prim_func(s_tir=True)
def guarded(a: T.Buffer((5, 37), "float32"), b: T.Buffer((5, 37), "float32")):
    T.func_attr({"tirx.noalias": True})
    for r, c0 in T.grid(8, 3):
        for c1 in T.vectorized(16):
            with T.sblock("add_one"):
                vr = T.axis.spatial(5, r)
                vc = T.axis.spatial(37, c0 * 16 + c1)
                T.where(r < 5 and c0 * 16 + c1 < 37)
                b[vr, vc] = a[vr, vc] + T.float32(1)


@T.prim_func(s_tir=True)
def expected(a: T.Buffer((5, 37), "float32"), b: T.Buffer((5, 37), "float32")):
    T.func_attr({"tirx.noalias": True})
    for r, c0 in T.grid(8, 3):
        if c0 < 2:
            for c1 in T.vectorized(16):
                with T.sblock("add_one"):
                    T.where(r < 5)
                    T.reads(a[r, c0 * 16 + c1])
                    T.writes(b[r, c0 * 16 + c1])
                    b[r, c0 * 16 + c1] = a[r, c0 * 16 + c1] + T.float32(1.0)
        else:
            for c1_lane in range(16):
                with T.sblock("add_one"):
                    T.where(r < 5 and c0 * 16 + c1_lane < 37)
                    T.reads(a[r, c0 * 16 + c1_lane])
                    T.writes(b[r, c0 * 16 + c1_lane])
                    b[r, c0 * 16 + c1_lane] = a[r, c0 * 16 + c1_lane] + T.float32(1.0)


@T.prim_func(s_tir=True)
def first_lanes_guarded(a: T.Buffer((48,), "float32"), b: T.Buffer((48,), "float32")):
    """Lanes from the fifth on pass: the last lane passing says nothing of the first."""
    T.func_attr({"tirx.noalias": True})
    for c0 in range(3):
        for c1 in T.vectorized(16):
            with T.sblock("add_one"):
                vc = T.axis.spatial(48, c0 * 16 + c1)
                T.where(5 <= c0 * 16 + c1)
                b[vc] = a[vc] + T.float32(1)


@T.prim_func(s_tir=True)
def falling_guard(a: T.Buffer((48,), "float32"), b: T.Buffer((48,), "float32")):
    """``a - b`` falls as the lane rises: the first lanes fail where the last passes."""
    T.func_attr({"tirx.noalias": True})
    for c0 in range(3):
        for c1 in T.vectorized(16):
            with T.sblock("add_one"):
                vc = T.axis.spatial(48, c0 * 16 + c1)
                T.where(40 - c1 < c0 * 16 + 30)
                b[vc] = a[vc] + T.float32(1)


_EXPECTED = expected.with_attr("global_symbol", "guarded")
_HOST = tvm.target.Target({"kind": "llvm"})


def _run(func, a):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=_HOST)
    out, whole = guarded_output(a.shape)
    lib["main"](tvm.runtime.tensor(a), out)
    check_guard(whole, a.shape)
    return out.numpy()


def test_a_lane_guard_runs_whole_vectors_and_a_guarded_last_vector():
    after = whole_vector_predicates(guarded)
    tvm.ir.assert_structural_equal(after, _EXPECTED)
    a = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)
    np.testing.assert_array_equal(_run(guarded, a), a + 1)
    np.testing.assert_array_equal(_run(after, a), a + 1)


@pytest.mark.parametrize("func, first", [(first_lanes_guarded, 5), (falling_guard, 11)],
                         ids=["first-lanes-guarded", "falling-guard"])
def test_guards_the_last_lane_does_not_decide_are_left_alone(func, first):
    """Each guard fails on the first lanes of a vector whose last lane passes it. Left as they
    are, the kernels write from column ``first`` on, as their guards say."""
    assert whole_vector_predicates(func).same_as(func)
    a = np.arange(48, dtype=np.float32)
    got = _run(func, a)
    np.testing.assert_array_equal(got[first:], a[first:] + 1)
    assert np.all(got[:first] == SENTINEL)


def test_the_module_pass_leaves_unguarded_kernels_as_they_are():
    mod = tvm.IRModule({"guarded": guarded, "first_lanes_guarded": first_lanes_guarded})
    after = WholeVectorPredicates()(mod)
    tvm.ir.assert_structural_equal(after["guarded"], _EXPECTED)
    assert after["first_lanes_guarded"].same_as(first_lanes_guarded)
