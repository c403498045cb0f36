"""Helpers for the kernel tests: build one PrimFunc scheduled by a rule and check the machine
code, and output buffers with guard elements behind them (out-of-bounds writes show)."""

import numpy as np
import tvm

GUARD = 4096  # elements past the output, checked untouched
SENTINEL = 12345


def build_scheduled(rule, func, target: tvm.target.Target, instruction: str | None = None):
    """``func`` scheduled by ``rule`` (which must accept it) and built; with ``instruction``,
    the assembly must contain it."""
    with target:
        sch = rule.apply(func, target, False)
    assert sch is not None
    lib = tvm.compile(sch.mod, target=target)
    if instruction:
        assert instruction in lib.mod.inspect_source("asm")
    return lib


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
