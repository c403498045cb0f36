"""HoistTileConfigs on a kernel of two parallel tasks, each three steps, each step writing a row
of the output in two halves, each half after loading its tile configuration (marked
amx_intrinsics.TILE_CONFIG, as the AMX intrinsics mark theirs). A counter stands in for
``ldtilecfg`` here, so that the test runs on any CPU and shows how often a configuration is
loaded.

After, where both halves load the same configuration: one load, first in each task; the steps
without theirs. Where they differ, the steps keep theirs. Numbers: the output as before, the
configuration loaded once per task instead of twice per step. Two loops of a task loading
different configurations each load theirs once, before the loop. Outside any parallel loop the
load goes before the outermost loop."""

import numpy as np
import tvm
from tvm.script import tirx as T

from aotc.compiler.default_schedules.amx_intrinsics import TILE_CONFIG
from aotc.compiler.passes.lowering.hoisted_tile_configs import (
    HoistTileConfigs,
    hoist_tile_configs,
)


def _stepped(second_config: str = "1,64"):
    @T.prim_func(s_tir=True)
    def func(out: T.Buffer((2, 3, 4), "float32"), loads: T.Buffer((2,), "int32")):
        T.func_attr({"tirx.noalias": True})
        for p in T.parallel(2):
            for s in range(3):
                with T.attr(0, TILE_CONFIG, "1,64"):
                    loads[p] = loads[p] + 1
                for j in range(2):
                    out[p, s, j] = T.Cast("float32", p * 12 + s * 4 + j)
                with T.attr(0, TILE_CONFIG, second_config):
                    loads[p] = loads[p] + 1
                for j in range(2, 4):
                    out[p, s, j] = T.Cast("float32", p * 12 + s * 4 + j)
    return func


@T.prim_func(s_tir=True)
def expected(out: T.Buffer((2, 3, 4), "float32"), loads: T.Buffer((2,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for p in T.parallel(2):
        with T.attr(0, TILE_CONFIG, "1,64"):
            loads[p] = loads[p] + 1
        for s in range(3):
            for j in range(2):
                out[p, s, j] = T.Cast("float32", p * 12 + s * 4 + j)
            for j in range(2, 4):
                out[p, s, j] = T.Cast("float32", p * 12 + s * 4 + j)


def _run(func):
    lib = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros((2, 3, 4), np.float32))
    loads = tvm.runtime.tensor(np.zeros(2, np.int32))
    lib["main"](out, loads)
    return out.numpy(), loads.numpy()


def test_one_configuration_per_parallel_task():
    after = HoistTileConfigs()(tvm.IRModule({"main": _stepped()}))["main"]
    tvm.ir.assert_structural_equal(after, expected.with_attr("global_symbol", "func"))


def test_numbers_match_and_the_configuration_loads_once_per_task():
    before = _stepped()
    out, loads = _run(before)
    np.testing.assert_array_equal(loads, [6, 6])
    hoisted_out, hoisted_loads = _run(hoist_tile_configs(before))
    np.testing.assert_array_equal(hoisted_out, out)
    np.testing.assert_array_equal(out.ravel(), np.arange(24))
    np.testing.assert_array_equal(hoisted_loads, [1, 1])


def test_a_step_of_two_configurations_keeps_its_loads():
    before = _stepped(second_config="1,32")
    assert hoist_tile_configs(before).same_as(before)


@T.prim_func(s_tir=True)
def _two_loops(out: T.Buffer((2, 3, 4), "float32"), loads: T.Buffer((2,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for p in T.parallel(2):
        for s in range(3):
            with T.attr(0, TILE_CONFIG, "1,64"):
                loads[p] = loads[p] + 1
            out[p, s, 0] = T.float32(1)
        for s in range(3):
            with T.attr(0, TILE_CONFIG, "1,32"):
                loads[p] = loads[p] + 1
            out[p, s, 1] = T.float32(2)


@T.prim_func(s_tir=True)
def _two_loops_expected(out: T.Buffer((2, 3, 4), "float32"), loads: T.Buffer((2,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for p in T.parallel(2):
        with T.attr(0, TILE_CONFIG, "1,64"):
            loads[p] = loads[p] + 1
        for s in range(3):
            out[p, s, 0] = T.float32(1)
        with T.attr(0, TILE_CONFIG, "1,32"):
            loads[p] = loads[p] + 1
        for s in range(3):
            out[p, s, 1] = T.float32(2)


def test_loops_of_different_configurations_load_theirs_before_the_loop():
    after = hoist_tile_configs(_two_loops)
    tvm.ir.assert_structural_equal(after, _two_loops_expected.with_attr("global_symbol",
                                                                        "_two_loops"))
    assert list(_run(after)[1]) == [2, 2]


@T.prim_func(s_tir=True)
def _serial(out: T.Buffer((3, 4), "float32"), loads: T.Buffer((1,), "int32")):
    T.func_attr({"tirx.noalias": True})
    with T.sblock("root"):
        for s in range(3):
            with T.attr(0, TILE_CONFIG, "1,64"):
                loads[0] = loads[0] + 1
            for j in range(4):
                out[s, j] = T.float32(1)


@T.prim_func(s_tir=True)
def _serial_expected(out: T.Buffer((3, 4), "float32"), loads: T.Buffer((1,), "int32")):
    T.func_attr({"tirx.noalias": True})
    with T.sblock("root"):
        with T.attr(0, TILE_CONFIG, "1,64"):
            loads[0] = loads[0] + 1
        for s in range(3):
            for j in range(4):
                out[s, j] = T.float32(1)


def test_outside_parallel_loops_it_loads_before_the_outermost_loop():
    tvm.ir.assert_structural_equal(hoist_tile_configs(_serial),
                                   _serial_expected.with_attr("global_symbol", "_serial"))


@T.prim_func(s_tir=True)
def _many_tasks(out: T.Buffer((130,), "float32"), loads: T.Buffer((1,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for p in T.parallel(130):
        with T.attr(0, TILE_CONFIG, "1,64"):
            loads[0] = 1
        out[p] = T.Cast("float32", p)


@T.prim_func(s_tir=True)
def _many_tasks_expected(out: T.Buffer((130,), "float32"), loads: T.Buffer((1,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for p_task in T.parallel(65):
        with T.attr(0, TILE_CONFIG, "1,64"):
            loads[0] = 1
        for p_in in range(2):
            out[p_task * 2 + p_in] = T.Cast("float32", p_task * 2 + p_in)


def test_a_parallel_loop_of_many_iterations_loads_once_per_task_of_them():
    """130 iterations, each loading the configuration: 65 tasks of 2 consecutive ones (the
    fewest tasks, at least MIN_TASKS = 64, that divide them evenly), one load each."""
    after = hoist_tile_configs(_many_tasks)
    tvm.ir.assert_structural_equal(after, _many_tasks_expected.with_attr("global_symbol",
                                                                         "_many_tasks"))
    lib = tvm.compile(tvm.IRModule({"main": after}), target=tvm.target.Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros(130, np.float32))
    lib["main"](out, tvm.runtime.tensor(np.zeros(1, np.int32)))
    np.testing.assert_array_equal(out.numpy(), np.arange(130))


@T.prim_func(s_tir=True)
def _prime(out: T.Buffer((131,), "float32"), loads: T.Buffer((1,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for p in T.parallel(131):
        with T.attr(0, TILE_CONFIG, "1,64"):
            loads[0] = 1
        out[p] = T.Cast("float32", p)


def test_a_prime_count_of_iterations_loads_once_per_iteration():
    assert hoist_tile_configs(_prime).same_as(_prime)  # the load already first in each


@T.prim_func(s_tir=True)
def _reads_the_loop(out: T.Buffer((3,), "float32"), loads: T.Buffer((3,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for s in range(3):
        with T.attr(0, TILE_CONFIG, "1,64"):
            loads[s] = 1
        out[s] = T.float32(1)


def test_a_configuration_that_reads_its_loop_stays_in_it():
    assert hoist_tile_configs(_reads_the_loop).same_as(_reads_the_loop)


@T.prim_func(s_tir=True)
def _parallel_in_serial(out: T.Buffer((3, 2), "float32"), loads: T.Buffer((2,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for s in range(3):
        for p in T.parallel(2):
            for _j in range(2):
                with T.attr(0, TILE_CONFIG, "1,64"):
                    loads[p] = loads[p] + 1
            out[s, p] = T.float32(1)


@T.prim_func(s_tir=True)
def _parallel_in_serial_expected(out: T.Buffer((3, 2), "float32"),
                                 loads: T.Buffer((2,), "int32")):
    T.func_attr({"tirx.noalias": True})
    for s in range(3):
        for p in T.parallel(2):
            with T.attr(0, TILE_CONFIG, "1,64"):
                loads[p] = loads[p] + 1
            for _j in range(2):
                T.evaluate(0)
            out[s, p] = T.float32(1)


def test_a_load_in_a_parallel_loop_stays_in_its_tasks():
    """A serial loop around a parallel one: the load goes first in each task, not before the
    serial loop, where the worker threads would never run it."""
    after = hoist_tile_configs(_parallel_in_serial)
    tvm.ir.assert_structural_equal(after, _parallel_in_serial_expected.with_attr(
        "global_symbol", "_parallel_in_serial"))
