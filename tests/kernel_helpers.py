"""Helpers for the kernel tests: build one PrimFunc scheduled by a rule and check the machine
code, and output buffers with guard elements behind them (out-of-bounds writes show)."""

import numpy as np
import tvm

from aotc.compiler.passes.lowering.hoisted_tile_configs import HoistTileConfigs
from aotc.compiler.passes.lowering.overwritten_inits import DropOverwrittenInits

GUARD = 4096  # elements past the output, checked untouched
SENTINEL = 12345


def build_scheduled(rule, func, target: tvm.target.Target, instruction: str | None = None):
    """``func`` scheduled by ``rule`` (which must accept it) and built, after the schedule
    phase's DropOverwrittenInits and HoistTileConfigs as the compiler runs them; with
    ``instruction``, the assembly must contain it."""
    with target:
        sch = rule.apply(func, target, False)
    assert sch is not None
    lib = tvm.compile(HoistTileConfigs()(DropOverwrittenInits()(sch.mod)), target=target)
    if instruction:
        assert instruction in lib.mod.inspect_source("asm")
    return lib


def conv_reference(x, w, stride: int, pad, dilation: int, pad_value=0, dtype=np.float64):
    """NHWC conv2d of ``x`` and HWIO ``w`` in ``dtype`` (float64, or int64 for integer
    kernels): padding ``pad`` (one int, or (rows, columns)) filled with ``pad_value``."""
    ph, pw = (pad, pad) if isinstance(pad, int) else pad
    xp = np.pad(x.astype(dtype), ((0, 0), (ph, ph), (pw, pw), (0, 0)),
                constant_values=pad_value)
    kh, kw, _, oc = w.shape
    oh = (xp.shape[1] - (kh - 1) * dilation - 1) // stride + 1
    ow = (xp.shape[2] - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, oc), dtype)
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i * dilation:i * dilation + oh * stride:stride,
                      j * dilation:j * dilation + ow * stride:stride, :] @ w[i, j].astype(dtype)
    return out


def bf16_attention_kernel(rows: int, keys: int, depth: int):
    """(the bf16 attention kernel of compiler/attention_kernels.py for one batch of 2 heads,
    scores scaled by 0.125 with a mask over the keys, as an unscheduled PrimFunc; the shapes
    of its inputs qb, kp, vp and mask)."""
    from tvm import te

    from aotc.compiler import attention_kernels
    qb = te.placeholder((1, 2, rows, depth), "uint16", "qb")
    kp = te.placeholder((1, 2, keys // 16, depth // 2, 16, 2), "uint16", "kp")
    vp = te.placeholder((1, 2, depth // 16, keys // 2, 16, 2), "uint16", "vp")
    mask = te.placeholder((1, 1, 1, keys), "float32", "mask")
    out = attention_kernels.attention(qb, kp, vp, mask, 0.125, False, None)
    inputs = [qb, kp, vp, mask]
    return (te.create_prim_func([*inputs, out]),
            [[int(d) for d in t.shape] for t in inputs])


def guarded_output(shape, dtype="float32"):
    """(view of ``shape``, the whole buffer) with GUARD sentinel elements behind the view."""
    whole = tvm.runtime.tensor(np.full(int(np.prod(shape)) + GUARD, SENTINEL, dtype))
    return whole._create_view(tuple(shape)), whole


def check_guard(whole, shape) -> None:
    tail = whole.numpy()[int(np.prod(shape)):]
    assert np.all(tail == SENTINEL), f"kernel wrote {np.sum(tail != SENTINEL)} elements " \
        "past its output"


def against_unmapped_pages(shape, at_end: bool, dtype=np.float32):
    """(array, its mapping) of ``shape`` placed against a PROT_NONE page: its last byte right
    before one (``at_end``) or its first right after one. A kernel reading past that end
    segfaults instead of reading a neighbour's bytes. Both ends stay 64-byte aligned when the
    size is a multiple of 64 (TVM's from_dlpack refuses others)."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    pages = -(-nbytes // page)
    mapping = mmap.mmap(-1, (pages + 2) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    libc = ctypes.CDLL(None)
    for guard in (base, base + (pages + 1) * page):
        assert libc.mprotect(ctypes.c_void_p(guard), page, 0) == 0
    start = page + (pages * page - nbytes if at_end else 0)
    array = np.frombuffer(mapping, dtype, int(np.prod(shape)), start).reshape(shape)
    return array, mapping


def exit_code_in_child(target, *args, timeout: float = 300) -> int | None:
    """Run ``target(*args)`` in a spawned process (a kernel that reads past an input placed by
    against_unmapped_pages kills it, not the test run) and return its exit code."""
    import multiprocessing
    child = multiprocessing.get_context("spawn").Process(target=target, args=args)
    child.start()
    child.join(timeout)
    return child.exitcode


def skip_unless_runs_here(target) -> None:
    """Skip the rest of a test (its in-process run) when this host's CPU lacks the
    instructions code built for ``target`` (an x86 llvm target of a fixed ISA) uses; what the
    test checked before, the schedule and the machine code, holds on any host."""
    import pytest

    from aotc.targets import cpu_flags_needed, x86
    lacking = x86.lacking_flags(cpu_flags_needed(target))
    if lacking:
        pytest.skip(f"this CPU lacks {', '.join(sorted(lacking))} to run the kernel")


def loops_spilling_vectors(asm: str) -> list[str]:
    """Labels of the single-block loops of ``asm`` (from a label to the jump back to it) that
    hold a multiply-add and move a vector register to or from the stack: an accumulator or a
    weight vector the register tile did not leave room for."""
    import re
    found = []
    for block in re.split(r"\n(?=\.LBB)", asm):
        label = block.split(":", 1)[0]
        body = re.search(rf"^.*?\n\s*j\w+\s+{re.escape(label)}\n", block, re.S)
        if body and "vfmadd" in body.group(0) and re.search(
                r"^\s*v\w+\s.*(%[xy]mm.*\(%rsp\)|\(%rsp\).*%[xy]mm)", body.group(0), re.M):
            found.append(label)
    return found


def crop_loops(sch) -> tuple:
    """(the crop block's loops, the outermost loop of the tile's reduction block: the
    tensorized ``*_o`` block of an AMX kernel, the ``*_update`` one of a vector kernel) of a
    scheduled packed kernel (cpu_dot.PackedDot): the crop runs right after each tile when its
    first loop is the tile's."""
    from aotc.compiler.dot_kernels import CROP_BLOCK
    blocks = {}
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        for inner in [block, *sch.get_child_blocks(block)]:
            blocks[sch.get(inner).name_hint] = [sch.get(loop) for loop in sch.get_loops(inner)]
    [crop] = [name for name in blocks if name.startswith(CROP_BLOCK)]
    [tile] = [name for name in blocks if name.endswith(("_o", "_update"))]
    return blocks[crop], blocks[tile][0]
