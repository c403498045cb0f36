"""NVIDIA GPU targets: kernels in CUDA, compiled by the machine's nvcc into a fatbin inside the
.so; the host side (the Relax VM's glue) is x86-64 code linked by the host cc.

``cuda`` is sm_75 (Turing) machine code plus PTX, which the driver compiles for any newer GPU;
the sm_* presets give each architecture its own machine code."""

from __future__ import annotations

import platform
import shutil

from .spec import TargetSpec, Toolchain, preset_simd
from .x86 import simd as host_simd

FAMILY = "cuda"
# (name suffix, arch, what has it)
_ARCHS = (
    ("sm75", "sm_75", "Turing: T4, RTX 20xx"),
    ("sm80", "sm_80", "Ampere: A100, A30"),
    ("sm86", "sm_86", "Ampere: A10, RTX 30xx"),
    ("sm89", "sm_89", "Ada: L4, L40, RTX 40xx"),
    ("sm90", "sm_90", "Hopper: H100, H200"),
)
TOOLCHAIN = Toolchain(also_needs=("nvcc",), install_hint="the CUDA toolkit compiles the kernels")
# The host code runs the VM's glue on the CPU: a baseline x86-64 with AVX2.
_HOST = {"kind": "llvm", "mcpu": "haswell"}


def simd(attrs) -> tuple[int, int] | None:
    """GPU targets have no CPU SIMD width; their host target belongs to the x86 family."""
    del attrs
    return None


def int8_dot(attrs) -> str | None:
    """No int8 dot-product kernels for this family yet: int8 contractions run un-tensorized."""
    del attrs
    return None


def _spec(name: str, arch: str, description: str, ptx: bool = False) -> TargetSpec:
    target = {"kind": "cuda", "arch": arch, "host": dict(_HOST)}
    bits, registers = preset_simd(host_simd, _HOST)  # of the host CPU, which runs the VM's glue
    return TargetSpec(name, FAMILY, description, target, arch="x86_64", vector_bits=bits,
                      vector_registers=registers, schedule_rules="gpu", backend="cuda",
                      runtime_device="cuda", toolchain=TOOLCHAIN,
                      features=(arch, *(("ptx",) if ptx else ())))


def presets() -> list[TargetSpec]:
    generic = _spec("cuda", "sm_75", "any NVIDIA GPU from Turing on (sm_75 code + PTX)", ptx=True)
    return [generic, *(_spec(f"cuda-{suffix}", arch, f"{arch}, {what}")
                       for suffix, arch, what in _ARCHS)]


def runs_here(spec: TargetSpec) -> str | None:
    del spec
    if platform.machine() != "x86_64":
        return f"the host code is x86-64; this machine is {platform.machine()}"
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU or driver on this machine"
    return None
