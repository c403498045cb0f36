"""HoistTileConfigs: an AMX tile configuration is loaded before the outermost loop whose body
loads no other configuration (once per task of consecutive iterations, where that loop is a
parallel one), not once per intrinsic call.

Why: each AMX intrinsic (default_schedules/amx_intrinsics.py) begins with ``ldtilecfg``, as a
call cannot know what ran before it on its thread. ``ldtilecfg`` is costly, and a kernel that
calls an intrinsic per short step pays it each time: the bf16 attention kernel computes its
scores 32 keys at a time over a reduction of 64 (a head's depth), so each call is 4 tile
products and one configuration load.

How: the intrinsics mark their configuration code ``amx_intrinsics.TILE_CONFIG``, its value
the configuration's words. From the innermost loop out, a loop whose body holds marks of one
value only (that read none of its variables) loses them, and one copy goes before the loop. A
parallel loop's threads each need their own: where its iterations divide evenly into
MIN_TASKS tasks or more, the loop runs the fewest such tasks, each a serial loop over its
consecutive iterations after one load; else the load goes first in each iteration. Small
kernels that ran one short tile per iteration (MobileNets' 1x1 convs over 16 or 24 channels)
had spent much of their time loading configurations. Every tile instruction of the
loop then runs after that load and after no load of another configuration, which is all the
intrinsics need: each starts its sums with ``tilezero`` or a load, never from what an earlier
call left in a tile register. A loop whose body holds different configurations (the attention
kernel's two products where their reduction steps differ) keeps its inner loops' loads.

Where: the schedule phase's end, on CPU targets, after the rules (default or tuned) have placed
the intrinsics."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from ...default_schedules.amx_intrinsics import TILE_CONFIG
from ...default_schedules.cpu_blocks import renew_definitions, substitute, uses_var
from ...relax_walk import with_prim_funcs

# A parallel loop whose iterations each load the same configuration runs them in this many
# tasks or more (the fewest that divide them evenly), each loading it once: TVM hands each
# thread a contiguous range of a parallel loop's iterations, so the tasks keep its balance on
# any thread count up to here, and the loads drop from one per iteration to one per task.
MIN_TASKS = 64

# what a removed configuration becomes (then dropped from its sequence)
_REMOVED = tirx.Evaluate(tirx.const(0, "int32"))


def _configs(node) -> list:
    found: list = []
    tvm_ffi.structural_walk(node, (tirx.AttrStmt, lambda stmt: found.append(stmt)
                                   if stmt.attr_key == TILE_CONFIG else None))
    return found


def _uniform(configs) -> bool:
    return bool(configs) and len({str(c.value) for c in configs}) == 1


def _without_configs(stmt):
    def without(attr):
        return _REMOVED if attr.attr_key == TILE_CONFIG else attr

    def kept(seq):
        stmts = [s for s in seq.seq if not s.same_as(_REMOVED)]
        if len(stmts) == len(seq.seq):
            return seq
        return tirx.SeqStmt(stmts) if len(stmts) > 1 else stmts[0] if stmts else _REMOVED
    return tvm_ffi.structural_map(stmt, [(tirx.AttrStmt, without), (tirx.SeqStmt, kept)])


def _flat(seq):
    if not any(isinstance(s, tirx.SeqStmt) for s in seq.seq):
        return seq
    return tirx.SeqStmt([t for s in seq.seq
                         for t in (s.seq if isinstance(s, tirx.SeqStmt) else [s])])


def _task_count(extent) -> int | None:
    """The fewest tasks, at least MIN_TASKS, that split ``extent`` iterations evenly; None where
    none does (a prime count, or one under 2 x MIN_TASKS)."""
    if not isinstance(extent, tirx.IntImm):
        return None
    n = int(extent)
    return next((t for t in range(MIN_TASKS, n // 2 + 1) if n % t == 0), None)


def _in_tasks(loop, config, body):
    """The parallel ``loop`` with ``config`` first in each task: its iterations in _task_count
    tasks of consecutive ones where that count exists (one load per task), else one load per
    iteration."""
    tasks = _task_count(loop.extent)
    if tasks is None or not (isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0):
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                        tirx.SeqStmt([config, body]), loop.thread_binding, loop.annotations,
                        loop.step)
    var, dtype = loop.loop_var, str(loop.loop_var.ty)
    chunk = int(loop.extent) // tasks
    task = tirx.Var(f"{var.name}_task", dtype)
    inner = tirx.Var(f"{var.name}_in", dtype)
    body = substitute(body, var, task * tirx.const(chunk, dtype) + inner)
    serial = tirx.For(inner, tirx.const(0, dtype), tirx.const(chunk, dtype),
                      tirx.ForKind.SERIAL, body)
    return tirx.For(task, tirx.const(0, dtype), tirx.const(tasks, dtype), loop.kind,
                    tirx.SeqStmt([config, serial]), loop.thread_binding, loop.annotations)


def _loads_in_parallel(stmt) -> bool:
    """Whether a parallel loop in ``stmt`` holds a configuration load."""
    found: list = []
    tvm_ffi.structural_walk(stmt, (tirx.For, lambda loop: found.append(loop)
                                   if loop.kind == tirx.ForKind.PARALLEL and
                                   _configs(loop.body) else None))
    return bool(found)


def _hoisted(loop):
    """``loop`` (its inner loops done) whose body loads one configuration only: that
    configuration loaded once, before a serial loop or first in each task of a parallel one."""
    configs = _configs(loop.body)
    if not _uniform(configs) or any(uses_var(c, loop.loop_var) for c in configs) or \
            (loop.kind != tirx.ForKind.PARALLEL and _loads_in_parallel(loop.body)):
        return loop   # (a load in a parallel loop must stay there: its threads need it)
    config = renew_definitions(configs[0])  # each copy defines its buffer
    body = _without_configs(loop.body)
    if loop.kind == tirx.ForKind.PARALLEL:
        return _in_tasks(loop, config, body)
    return tirx.SeqStmt([config, tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                                          body, loop.thread_binding, loop.annotations,
                                          loop.step)])


def hoist_tile_configs(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each tile configuration loaded before the outermost loop whose body loads
    no other (first in each task where that is a parallel loop); ``func`` itself where no loop
    loads one."""
    if not _configs(func.body):
        return func
    body = tvm_ffi.structural_map(func.body, [(tirx.For, _hoisted), (tirx.SeqStmt, _flat)])
    return func if tvm_ffi.structural_equal(body, func.body) else func.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="HoistTileConfigs")
class HoistTileConfigs:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return with_prim_funcs(mod, hoist_tile_configs)
