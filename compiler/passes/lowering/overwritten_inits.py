"""DropOverwrittenInits: a tensorized block whose tensor intrinsic computes its sums from zero
and stores all of them loses its reduction init, which would only write zeros the intrinsic
overwrites.

Why: ``sch.tensorize`` keeps the init of the block it makes (a tile of the output set to
zero, then the reduction), and replaces only the body with the intrinsic's implementation.
The AMX intrinsics (default_schedules/amx_intrinsics.py) zero their tile registers
(``tilezero``), sum the whole reduction and store every sum of their tile, so the zeros the
init writes to the kernel's tile buffer first are never read: a store per output element per
tile, a large share of a short-reduction kernel's time (ResNet-50's 64-channel 1x1 convs).

How: such intrinsics mark their implementation's block with ``SUMS_FROM_ZERO``; tensorize
copies that annotation onto the block it makes. This pass removes the init of each block so
marked, and the mark. Other blocks, and kernels without one, are left as they are.

Where: the schedule phase, after the rules (default or tuned: both reach the kernel through
tensorize), on CPU targets."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ...default_schedules.amx_intrinsics import SUMS_FROM_ZERO
from ...relax_walk import with_prim_funcs


def _without_init(block: s_tir.SBlock) -> s_tir.SBlock:
    if SUMS_FROM_ZERO not in block.annotations:
        return block
    annotations = {k: v for k, v in block.annotations.items() if k != SUMS_FROM_ZERO}
    return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                        block.body, None, block.alloc_buffers, block.match_buffers,
                        annotations)


def drop_overwritten_inits(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a scheduled PrimFunc) without the inits of its blocks marked
    ``SUMS_FROM_ZERO``."""
    body = tvm_ffi.structural_map(func.body, (s_tir.SBlock, _without_init))
    return func if body.same_as(func.body) else func.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="DropOverwrittenInits")
class DropOverwrittenInits:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return with_prim_funcs(mod, drop_overwritten_inits)
