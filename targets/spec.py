"""What a target family tells the rest of aotc: one TargetSpec per preset.

Everything target-specific that other packages need is a field here, so that the compiler,
the runtime and the tuner read the spec instead of branching on a family's name."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Toolchain:
    """How the .so is linked: ``compiler`` None means the host's cc (TVM's default)."""
    compiler: str | None = None
    link_flags: tuple[str, ...] = ()
    install_hint: str = ""          # what to install when a tool is missing
    also_needs: tuple[str, ...] = ()  # other programs the build runs (nvcc for CUDA kernels)

    def missing(self) -> str | None:
        """Why this toolchain cannot build here, or None when it can."""
        tools = ([self.compiler] if self.compiler else []) + list(self.also_needs)
        absent = [tool for tool in tools if shutil.which(tool) is None]
        if not absent:
            return None
        hint = f" ({self.install_hint})" if self.install_hint else ""
        return f"{', '.join(absent)} not found{hint}"


@dataclass(frozen=True)
class TargetSpec:
    name: str                     # what users type: x86, arm-cortex-a76, cuda-sm80, ...
    family: str                   # key of targets.FAMILIES
    description: str
    tvm_target: dict              # JSON-dict form; TVM 0.27 rejects "llvm -mcpu=..." strings
    arch: str                     # machine the .so runs on, as platform.machine() names it
    vector_bits: int              # SIMD register width the default schedules tile for
    vector_registers: int         # SIMD registers, bounding register tiles
    schedule_rules: str = "cpu"   # default-rule set of compiler/default_schedules (RULE_SETS key)
    backend: str = "cpu"          # finalize passes of compiler/build (FINALIZE key)
    runtime_device: str = "cpu"   # device the Relax VM runs on: cpu | cuda
    toolchain: Toolchain = field(default_factory=Toolchain)
    features: tuple[str, ...] = field(default_factory=tuple)

    def vector_lanes(self, dtype_bits: int = 32) -> int:
        return max(1, self.vector_bits // dtype_bits)


def preset_simd(simd, target: dict) -> tuple[int, int]:
    """(vector bits, vector registers) that a family's ``simd`` gives its own preset ``target``;
    a preset its family does not claim is a bug in the family's table."""
    found = simd(target)
    if found is None:
        raise ValueError(f"target family does not claim its own preset {target}")
    return found
