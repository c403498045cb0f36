"""compiler/tvmscript.py: top_level.prim_func parses what T.prim_func parses."""

import tvm
from tvm.script import tirx as T

from aotc.compiler.tvmscript import top_level


@T.prim_func(s_tir=True)
def add_one_expected(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")) -> None:
    for i in T.serial(0, 16):
        with T.sblock("add"):
            vi = T.axis.remap("S", [i])
            b[vi] = a[vi] + T.float32(1)


@top_level.prim_func(s_tir=True)
def add_one(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")) -> None:
    for i in T.serial(0, 16):
        with T.sblock("add"):
            vi = T.axis.remap("S", [i])
            b[vi] = a[vi] + T.float32(1)


@top_level.prim_func(private=True, s_tir=True)
def add_one_private(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")) -> None:
    for i in T.serial(0, 16):
        with T.sblock("add"):
            vi = T.axis.remap("S", [i])
            b[vi] = a[vi] + T.float32(1)


def test_same_function_as_t_prim_func():
    tvm.ir.assert_structural_equal(add_one.with_attr("global_symbol", "add_one_expected"),
                                   add_one_expected)


def test_options_reach_the_parser():
    assert add_one.attrs["global_symbol"] == "add_one"
    assert add_one_private.attrs is None or "global_symbol" not in add_one_private.attrs
