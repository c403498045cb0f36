"""aarch64 targets (64-bit ARM with NEON), cross-compiled with Debian's aarch64-linux-gnu-g++.

``arm`` is generic ARMv8-A with NEON: it runs on every aarch64 board. The feature presets add
the int8 dot-product instructions (``+dotprod``: SDOT/UDOT, ARMv8.2; ``+i8mm``: SMMLA, ARMv8.6),
and the core presets let LLVM schedule for a known micro-architecture. All NEON: 128-bit
vectors, 32 registers (SVE on Neoverse-V1 is not used by the default schedules)."""

from __future__ import annotations

import platform
import shutil

from .spec import TargetSpec, Toolchain, preset_simd

FAMILY = "arm"
TRIPLE = "aarch64-linux-gnu"
TOOLCHAIN = Toolchain("aarch64-linux-gnu-g++", install_hint="apt install g++-aarch64-linux-gnu")
# Deployment boards, not the build host: 4 is the big-core count of common SoCs (RK3588's
# four A76, Raspberry Pi 4/5). MetaSchedule needs a core count to tune for.
_BOARD_CORES = 4

# name, description, mcpu (None: generic), extra features
_PRESETS = (
    ("arm", "generic aarch64 with NEON (any ARMv8-A board)", None, ()),
    ("arm-dotprod", "aarch64 with int8 dot product (ARMv8.2-A +dotprod)", None, ("+dotprod",)),
    ("arm-i8mm", "aarch64 with dotprod and int8 matrix multiply (ARMv8.6-A +i8mm)", None,
     ("+dotprod", "+i8mm")),
    ("arm-cortex-a55", "Cortex-A55 (little core of RK3588, many SoCs)", "cortex-a55", ()),
    ("arm-cortex-a72", "Cortex-A72 (Raspberry Pi 4)", "cortex-a72", ()),
    ("arm-cortex-a76", "Cortex-A76 (RK3588, Raspberry Pi 5)", "cortex-a76", ()),
    ("arm-neoverse-n1", "Neoverse-N1 (AWS Graviton2, Ampere Altra)", "neoverse-n1", ()),
    ("arm-neoverse-v1", "Neoverse-V1 (AWS Graviton3)", "neoverse-v1", ()),
)


def simd(attrs) -> tuple[int, int] | None:
    """(128 bits, 32 registers) of NEON for an aarch64 llvm target; None for other families."""
    return (128, 32) if str(attrs.get("mtriple", "") or "").startswith("aarch64") else None


def int8_dot(attrs) -> str | None:
    """No int8 dot-product kernels for this family yet: int8 contractions run un-tensorized."""
    del attrs
    return None


def _spec(name: str, description: str, mcpu: str | None, extra: tuple[str, ...]) -> TargetSpec:
    target = {"kind": "llvm", "mtriple": TRIPLE, "mattr": ["+neon", *extra],
              "num-cores": _BOARD_CORES}
    if mcpu:
        target["mcpu"] = mcpu
    bits, registers = preset_simd(simd, target)
    return TargetSpec(name, FAMILY, description, target, arch="aarch64", vector_bits=bits,
                      vector_registers=registers, toolchain=TOOLCHAIN,
                      features=("neon", *(f.lstrip("+") for f in extra)))


def presets() -> list[TargetSpec]:
    return [_spec(*preset) for preset in _PRESETS]


def runs_here(spec: TargetSpec) -> str | None:
    """aarch64 output runs natively on aarch64, and here under qemu-aarch64 (user mode)."""
    del spec
    if platform.machine() == "aarch64" or shutil.which("qemu-aarch64"):
        return None
    return "needs an aarch64 machine or qemu-aarch64 (apt install qemu-user)"
