"""The TIR pipeline aotc compiles with: TVM's default one, then StackBuffers.

Why: TVM's LowerTVMBuiltin puts a kernel's own buffers on the stack only when they are of
"global" scope and under 1,024 bytes; every other one becomes a TVMBackendAllocWorkspace /
FreeWorkspace call pair where it is allocated. The register tile of a conv or matmul keeps its
accumulators in such a buffer (cpu_contraction / cpu_dot: ``cache_write``, applied on the way
out), allocated in every parallel tile: 28 int32 vectors of MobileNetV2's 16->96 int8 expand
are 1,792 bytes, so each of its 2,688 tiles called the allocator twice. Timed alone (2
threads), that kernel went 0.089 -> 0.072 ms with the tile on the stack. A stack buffer also
lets LLVM keep the tile in registers instead of storing and reloading it.

What: every buffer a kernel allocates (scope global or local) of a constant size up to
MAX_STACK_BYTES gets the ``disable_lower_builtin`` annotation, which LowerTVMBuiltin honours:
the LLVM code generator then makes it an ``alloca`` in the entry block of its function (of the
parallel closure, for a buffer inside a parallel loop: one per worker thread, on its stack).
Larger and symbolic-size buffers keep TVM's workspace allocation.

Where: ``tir_pipeline(target)`` names the pipeline for tvm.compile / relax.build: "aotc" on
LLVM (CPU) targets, TVM's default elsewhere (CUDA kernels' buffers are other memories). The
tuner builds its candidates with it too, so that tuned and compiled kernels are the same
code."""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx import stmt as S
from tvm.tirx.compilation_pipeline import get_tir_pipeline, register_tir_pipeline

# Well under a worker thread's stack (8 MB by default); the largest register tile of our
# schedules is 32 vectors x 64 bytes = 2 KB, a depthwise window under 1 KB.
MAX_STACK_BYTES = 16 * 1024
PIPELINE = "aotc"
_ANNOTATION = "disable_lower_builtin"


def _constant_bytes(buffer) -> int | None:
    count = 1
    for dim in buffer.shape:
        if not isinstance(dim, tirx.IntImm):
            return None
        count *= int(dim)
    return count * buffer.dtype.bits * buffer.dtype.lanes // 8


def _on_stack(alloc: S.AllocBuffer) -> S.AllocBuffer:
    size = _constant_bytes(alloc.buffer)
    if (size is None or size > MAX_STACK_BYTES or _ANNOTATION in alloc.annotations
            or alloc.buffer.scope() not in ("global", "local")):
        return alloc
    annotations = {**dict(alloc.annotations), _ANNOTATION: tirx.IntImm("int32", 1)}
    return S.AllocBuffer(alloc.buffer, annotations=annotations)


def _rewrite(stmt):
    """``stmt`` with its allocations annotated; nodes without a changed child are kept. The
    statements that hold others (TVM 0.27's allocations and bindings are flat): sequences,
    loops, attributes, conditionals."""
    if isinstance(stmt, S.AllocBuffer):
        return _on_stack(stmt)
    if isinstance(stmt, S.SeqStmt):
        seq = [_rewrite(s) for s in stmt.seq]
        changed = any(not a.same_as(b) for a, b in zip(seq, stmt.seq))
        return S.SeqStmt(seq, stmt.span) if changed else stmt
    if isinstance(stmt, (S.For, S.AttrStmt, S.While)):
        body = _rewrite(stmt.body)
        if body.same_as(stmt.body):
            return stmt
        if isinstance(stmt, S.For):
            return S.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                         stmt.thread_binding, stmt.annotations, stmt.step, stmt.span)
        if isinstance(stmt, S.AttrStmt):
            return S.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
        return S.While(stmt.condition, body, stmt.span)
    if isinstance(stmt, S.IfThenElse):
        then = _rewrite(stmt.then_case)
        other = _rewrite(stmt.else_case) if stmt.else_case is not None else None
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return S.IfThenElse(stmt.condition, then, other, stmt.span)
    return stmt


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="StackBuffers")
def stack_buffers(func, _mod, _ctx):
    body = _rewrite(func.body)
    return func if body.same_as(func.body) else func.with_body(body)


def _pipeline():
    lower, finalize_host, finalize_device = get_tir_pipeline("default")
    return tvm.transform.Sequential([lower, stack_buffers]), finalize_host, finalize_device


register_tir_pipeline(PIPELINE, _pipeline)


def tir_pipeline(target: tvm.target.Target) -> str:
    """The TIR pipeline to build ``target``'s kernels with."""
    return PIPELINE if target.kind.name == "llvm" else "default"
