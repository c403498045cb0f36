"""Stable keys for tuning records: which kernel (workload) and which machine code (target).

A workload key is the structural hash of the kernel's PrimFunc with the attributes that do not
change what it computes removed (its name, aotc's FLOP count); the same kernel from another
model, run or machine gets the same key. A target key is the ISA the code is generated for
(kind, mcpu, mattr), never the build host's core count, nor LLVM tuning attributes that leave
the instruction set as it is (``-prefer-256-bit``: targets/x86.py): a schedule tuned under one
stays valid under the other."""

from __future__ import annotations

import tvm
import tvm_ffi

_IGNORED_ATTRS = ("global_symbol", "aotc.flops", "tirx.is_scheduled", "op_pattern",
                  "aotc.estimated_seconds", "aotc.pad_rows")


def workload_key(func: tvm.tirx.PrimFunc) -> str:
    for attr in _IGNORED_ATTRS:
        if func.attrs is not None and attr in func.attrs:
            func = func.without_attr(attr)
    return f"{tvm_ffi.structural_hash(func) & (2 ** 64 - 1):016x}"


def schedule_key(scheduled: tvm.tirx.PrimFunc) -> str:
    """The key of a scheduled kernel (its loop nest, as workload_key hashes it): a tuning
    record carries the key of the default schedule it was timed against, so compile can tell
    when the default rules have changed since (the record's default time is then stale)."""
    return workload_key(scheduled)


# LLVM subtarget tunings, not instructions (the module docstring)
_TUNING_ATTRS = ("-prefer-256-bit", "+prefer-256-bit")


def target_key(target: tvm.target.Target) -> str:
    parts = [target.kind.name, str(target.attrs.get("mcpu", ""))]
    mattr = [str(a) for a in target.attrs.get("mattr") or [] if str(a) not in _TUNING_ATTRS]
    if mattr:
        parts.append(",".join(sorted(mattr)))
    return ":".join(p for p in parts if p)
