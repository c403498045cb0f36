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
