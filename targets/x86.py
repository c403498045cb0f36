"""x86-64 targets. ``x86`` is the host as detected from /proc/cpuinfo; the others name a fixed
ISA level so that a build machine can produce a .so for a different deployment CPU."""

from __future__ import annotations

import os

from .spec import TargetSpec

# Checked from the newest down; the first ISA whose flags the host has picks the mcpu.
_ISA_LEVELS = (
    ("amx", {"amx_tile", "amx_bf16", "avx512f"}, "sapphirerapids"),
    ("avx512-vnni", {"avx512f", "avx512_vnni"}, "icelake-server"),
    ("avx512", {"avx512f", "avx512bw", "avx512vl"}, "skylake-avx512"),
    ("avx2", {"avx2", "fma"}, "haswell"),
)


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def detect_isa(flags: set[str]) -> tuple[str, str]:
    """(isa name, LLVM mcpu) for the best ISA level the flags allow."""
    for isa, needed, mcpu in _ISA_LEVELS:
        if needed <= flags:
            return isa, mcpu
    return "sse", "x86-64"


def _target(mcpu: str) -> dict:
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": os.cpu_count() or 1}


def host() -> TargetSpec:
    isa, mcpu = detect_isa(cpu_flags())
    return TargetSpec("x86", f"this host ({isa}, mcpu={mcpu})", _target(mcpu), features=(isa,))


def fixed() -> list[TargetSpec]:
    return [
        TargetSpec("x86-avx2", "any x86-64 with AVX2+FMA (Haswell and later)",
                   _target("haswell"), features=("avx2",)),
        TargetSpec("x86-avx512", "x86-64 with AVX-512 (Skylake-SP and later)",
                   _target("skylake-avx512"), features=("avx512",)),
    ]
