"""Planned vs. unplanned activation memory of a scheduled module (``--explain``, metadata).

Unplanned: every intermediate tensor gets its own allocation (the sum of all of them).
Planned: what TVM's StaticPlanBlockMemory, which the build runs, allocates: storages reused
across tensors whose lifetimes do not overlap, plus the outputs (never planned). Computed on a
copy with the same lowering passes the build runs before planning; weights are not counted."""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline

from .frontends.relax_shapes import static_values
from .relax_walk import op_calls

_ALLOC_TENSOR = "relax.builtin.alloc_tensor"
_ALLOC_STORAGE = "relax.memory.alloc_storage"


def memory_report(mod: tvm.IRModule, target: tvm.target.Target) -> dict:
    """{"unplanned_bytes", "planned_bytes"}; a value is None when a size is symbolic."""
    with target:
        lowered = tvm.transform.Sequential(cpu_pipeline.dataflow_lower_passes(target))(mod)
        planned = relax.transform.StaticPlanBlockMemory()(lowered)
    unplanned = _sum_allocations(lowered, {_ALLOC_TENSOR})
    return {"unplanned_bytes": unplanned,
            "planned_bytes": _sum_allocations(planned, {_ALLOC_TENSOR, _ALLOC_STORAGE})}


def _sum_allocations(mod: tvm.IRModule, ops: set[str]) -> int | None:
    sizes = [_bytes(call) for call in op_calls(mod) if call.op.name in ops]
    return None if any(s is None for s in sizes) else sum(sizes)


def _bytes(call: relax.Call) -> int | None:
    dims = static_values(call.args[0])
    if dims is None:
        return None
    count = math.prod(dims)
    if call.op.name == _ALLOC_STORAGE:
        return count  # a storage's shape is its size in bytes
    dtype = tvm.DataType(str(call.args[1].value))
    return count * ((dtype.bits * dtype.lanes + 7) // 8)
