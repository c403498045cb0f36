"""HoistTileConfigs: an AMX tile configuration is loaded before the outermost loop whose body
loads no other configuration (first in each task, where that loop is a parallel one), not once
per intrinsic call.

Why: each AMX intrinsic (default_schedules/amx_intrinsics.py) begins with ``ldtilecfg``, as a
call cannot know what ran before it on its thread. ``ldtilecfg`` is costly, and a kernel that
calls an intrinsic per short step pays it each time: the bf16 attention kernel computes its
scores 32 keys at a time over a reduction of 64 (a head's depth), so each call is 4 tile
products and one configuration load.

How: the intrinsics mark their configuration code ``amx_intrinsics.TILE_CONFIG``, its value
the configuration's words. From the innermost loop out, a loop whose body holds marks of one
value only loses them, and one copy goes before the loop; in a parallel loop it goes first in
the body instead, since each thread runs its tasks from there. Every tile instruction of the
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
from ...relax_walk import with_prim_funcs

# what a removed configuration becomes (then dropped from its sequence)
_REMOVED = tirx.Evaluate(tirx.const(0, "int32"))


def _configs(node) -> list:
    found: list = []

    def collect(stmt):
        if stmt.attr_key == TILE_CONFIG:
            found.append(stmt)
        return stmt
    tvm_ffi.structural_map(node, (tirx.AttrStmt, collect))
    return found


def _copy(stmt):
    """``stmt`` with variables of its own (each copy defines its configuration buffer)."""
    fresh: dict = {}

    def renewed(var, kind):
        if kind != tvm_ffi.structural.DefRegionKind.NONE:
            fresh[var] = tirx.Var(var.name, var.ty)
            return fresh[var]
        return fresh.get(var, var)
    return tvm_ffi.structural_map(stmt, with_def_region_kind=(tirx.Var, renewed))


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


def _hoisted(loop):
    """``loop`` (its inner loops done) whose body loads one configuration only: that
    configuration loaded once, before a serial loop or first in each task of a parallel one."""
    configs = _configs(loop.body)
    if not _uniform(configs):
        return loop
    config = _copy(configs[0])
    body = _without_configs(loop.body)
    if loop.kind == tirx.ForKind.PARALLEL:
        body = tirx.SeqStmt([config, body])
    out = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                   loop.annotations, loop.step)
    return out if loop.kind == tirx.ForKind.PARALLEL else tirx.SeqStmt([config, out])


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
