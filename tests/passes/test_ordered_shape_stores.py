"""OrderShapeFuncStores: the stores of a VMShapeLower ``shape_func`` sorted by heap slot, IR
before and after; a sequence whose stores depend on each other is left alone. A model with
symbolic dims compiled twice giving the same bytes, and its outputs against onnxruntime, are
in tests/test_reproducible_build.py."""

import tvm
from tvm.script import ir as I
from tvm.script import tirx as T

from aotc.compiler.passes.lowering import OrderShapeFuncStores


def _module(order: tuple[int, ...]):
    values = {2: lambda H: T.int64(8) * H[1],
              5: lambda H: (H[1] + T.int64(15)) // T.int64(16) * T.int64(16),
              3: lambda H: T.max(H[0], H[1]) * T.Cast("int64", H[0] < H[1])}

    @I.ir_module
    class Module:
        @T.prim_func(s_tir=True)
        def shape_func(H: T.Buffer((T.int64(6),), "int64")):
            T.func_attr({"tirx.is_host_func": True})
            H[order[0]] = values[order[0]](H)
            H[order[1]] = values[order[1]](H)
            H[order[2]] = values[order[2]](H)
    return Module


def test_stores_are_sorted_by_heap_index():
    before = _module((5, 2, 3))
    after = OrderShapeFuncStores()(before)
    tvm.ir.assert_structural_equal(after, _module((2, 3, 5)))
    tvm.ir.assert_structural_equal(OrderShapeFuncStores()(_module((3, 5, 2))), after)


def test_sorted_stores_leave_the_module():
    mod = _module((2, 3, 5))
    assert OrderShapeFuncStores()(mod).same_as(mod)


def test_stores_that_read_each_other_keep_their_order():
    @I.ir_module
    class Module:
        @T.prim_func(s_tir=True)
        def shape_func(H: T.Buffer((T.int64(4),), "int64")):
            T.func_attr({"tirx.is_host_func": True})
            H[3] = H[0] * T.int64(2)
            H[2] = H[3] + T.int64(1)  # reads the slot the store before it writes

    assert OrderShapeFuncStores()(Module).same_as(Module)


def test_other_functions_are_not_touched():
    @I.ir_module
    class Module:
        @T.prim_func(s_tir=True)
        def kernel(H: T.Buffer((T.int64(4),), "int64")):
            H[3] = T.int64(1)
            H[2] = T.int64(2)

    assert OrderShapeFuncStores()(Module).same_as(Module)
