"""x86-64 targets. ``x86`` is the host as detected from /proc/cpuinfo; the others name a fixed
ISA level so that a build machine can produce a .so for a different deployment CPU."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import platform

from aotc.errors import TargetError

from .spec import TargetSpec, preset_simd

FAMILY = "x86"
# Checked from the newest down; the first ISA whose flags the host has picks the mcpu. By ISA,
# not vendor: an AMD Zen 4 host (avx512_vnni, no AMX) gets icelake-server (LLVM's znver4 was
# not faster there: docs/design/measurements.md#targetsx86py).
_ISA_LEVELS = (
    ("amx", {"amx_tile", "amx_bf16", "avx512f"}, "sapphirerapids"),
    ("avx512-vnni", {"avx512f", "avx512_vnni"}, "icelake-server"),
    ("avx512", {"avx512f", "avx512bw", "avx512vl"}, "skylake-avx512"),
    ("avx2", {"avx2", "fma"}, "haswell"),
)
_AVX512_CPUS = {"skylake-avx512", "cascadelake", "cooperlake", "icelake-server", "icelake-client",
                "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4",
                "znver5"}
# Fixed presets describe a deployment machine, not the build host (whose core count would
# otherwise leak into schedules and workload keys); 4 is a small server slice.
_FIXED_CORES = 4


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


def simd(attrs) -> tuple[int, int] | None:
    """(vector bits, vector registers) of a TVM llvm target of this family (None: not an x86
    target). Not LLVM's own answer: tvm's llvm_get_vector_width says 512 for haswell."""
    triple = str(attrs.get("mtriple", "") or "")
    if triple and not triple.startswith(("x86_64", "i386", "i686")):
        return None
    mattr = {str(a) for a in attrs.get("mattr", []) or []}
    wide = "+avx512f" in mattr or str(attrs.get("mcpu", "")) in _AVX512_CPUS
    return (512, 32) if wide else (256, 16)


def broadcast_register(attrs) -> bool | None:
    """True for an x86 target without AVX-512: its FMAs take no embedded-broadcast memory
    operand ({1to16}), so every broadcast activation is a vbroadcastss into a register."""
    found = simd(attrs)
    return None if found is None else found[0] < 512


# LLVM CPUs with AVX-512 VNNI (vpdpbusd); AMX machines have it too.
_VNNI_CPUS = {"cascadelake", "cooperlake", "icelake-server", "icelake-client", "tigerlake",
              "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5"}


def _instructions(attrs, attribute: str, cpus: set[str], name: str) -> str | None:
    """``name`` when the target enables ``attribute`` (mattr) or its mcpu is one of ``cpus``."""
    mattr = {str(a) for a in attrs.get("mattr", []) or []}
    return name if attribute in mattr or str(attrs.get("mcpu", "")) in cpus else None


def int8_dot(attrs) -> str | None:
    """The int8 dot-product instruction set an x86 llvm target has ("avx512-vnni"), or None."""
    return _instructions(attrs, "+avx512vnni", _VNNI_CPUS, "avx512-vnni")


# LLVM CPUs with AVX512-BF16 (vdpbf16ps). Not an ISA level of the host's detection: adding it
# there would change the host preset's mcpu, and so the target key of every shipped tuning log.
_BF16_CPUS = {"cooperlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4",
              "znver5"}
_BF16_FLAGS = {"avx512f", "avx512_vnni", "avx512_bf16"}


def bf16_dot(attrs) -> str | None:
    """The bf16 dot-product instruction set an x86 llvm target has ("avx512-bf16"), or None."""
    return _instructions(attrs, "+avx512bf16", _BF16_CPUS, "avx512-bf16")


# LLVM CPUs with AMX-BF16 and AMX-INT8 (tdpbf16ps, tdpbusd on tile registers): Sapphire
# Rapids and later Xeons.
_AMX_CPUS = {"sapphirerapids", "emeraldrapids", "graniterapids"}
_AMX_BF16_FLAGS = {"amx_tile", "amx_bf16"}
_AMX_INT8_FLAGS = {"amx_tile", "amx_int8"}


def amx_bf16(attrs) -> str | None:
    """The bf16 tile instruction set an x86 llvm target has ("amx-bf16"), or None."""
    return _instructions(attrs, "+amx-bf16", _AMX_CPUS, "amx-bf16")


def amx_int8(attrs) -> str | None:
    """The int8 tile instruction set an x86 llvm target has ("amx-int8"), or None."""
    return _instructions(attrs, "+amx-int8", _AMX_CPUS, "amx-int8")


# Linux gives a process AMX tile state only once it asks; the first tile instruction before
# that raises SIGILL. A library with AMX kernels asks when it is loaded (this constructor,
# linked into it by compiler/build.py), whoever loads it.
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
AMX_PERMISSION_SOURCE = f"""#include <sys/syscall.h>
#include <unistd.h>
__attribute__((constructor)) static void aotc_request_amx(void) {{
  syscall({_SYS_ARCH_PRCTL}, {_ARCH_REQ_XCOMP_PERM}, {_XFEATURE_XTILEDATA});
}}
"""


@functools.cache
def request_amx() -> bool:
    """Ask Linux for this process's AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM); whether
    it was granted (False off Linux, on a CPU or kernel without AMX, or where a seccomp
    filter refuses the call)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


# LLVM CPUs with AVX512-FP16 (vfmadd231ph on <32 x half>); Zen 4 and 5 lack it.
_FP16_CPUS = {"sapphirerapids", "emeraldrapids", "graniterapids"}
_FP16_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_fp16"}


def fp16_dot(attrs) -> str | None:
    """The float16 vector instruction set an x86 llvm target has ("avx512-fp16"), or None."""
    return _instructions(attrs, "+avx512fp16", _FP16_CPUS, "avx512-fp16")


# precision -> (query, LLVM attribute, CPU flags, what it runs on, the preset that has it)
_PRECISIONS = {
    "bf16": (bf16_dot, "+avx512bf16", _BF16_FLAGS, "AVX512-BF16 (vdpbf16ps)",
             "x86-bf16 for a CPU that has it (Cooper Lake, Sapphire Rapids, Zen 4 and later)"),
    "fp16": (fp16_dot, "+avx512fp16", _FP16_FLAGS, "AVX512-FP16 (vfmadd231ph)",
             "x86-fp16 for a CPU that has it (Sapphire Rapids and later)"),
}


def for_precision(spec: TargetSpec, precision: str) -> TargetSpec:
    """``spec`` with the instructions ``precision`` needs enabled, or a TargetError. The host
    preset gets the LLVM attribute when this CPU has the flags (an icelake-server host lacks
    bf16; LLVM would refuse the instructions without it)."""
    query, attribute, flags, instructions, preset = _PRECISIONS[precision]
    if query(spec.tvm_target):
        return spec
    if spec.name == "x86" and flags <= cpu_flags():
        target = dict(spec.tvm_target)
        target["mattr"] = [*target.get("mattr", []), attribute]
        return dataclasses.replace(spec, tvm_target=target,
                                   features=(*spec.features, query(target) or attribute))
    raise TargetError(f"--precision {precision} needs {instructions}, which {spec.name} "
                      f"(mcpu={spec.tvm_target.get('mcpu')}) lacks; use {preset}")


def _spec(name: str, description: str, mcpu: str, cores: int, isa: str) -> TargetSpec:
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}
    if mcpu in _AVX512_CPUS:
        # LLVM's tuning for these CPUs splits vectors wider than 256 bits (a frequency
        # concern of the first AVX-512 parts): the kernels' 512-bit epilogues and elementwise
        # loops ran as pairs of 256-bit operations beside 512-bit reductions.
        target["mattr"] = ["-prefer-256-bit"]
    bits, registers = preset_simd(simd, target)
    return TargetSpec(name, FAMILY, description, target, arch="x86_64", vector_bits=bits,
                      vector_registers=registers, features=(isa,))


def host() -> TargetSpec:
    isa, mcpu = detect_isa(cpu_flags())
    return _spec("x86", f"this host ({isa}, mcpu={mcpu})", mcpu, os.cpu_count() or 1, isa)


def fixed() -> list[TargetSpec]:
    return [
        _spec("x86-avx2", "any x86-64 with AVX2+FMA (Haswell and later)", "haswell",
              _FIXED_CORES, "avx2"),
        _spec("x86-avx512", "x86-64 with AVX-512 (Skylake-SP and later)", "skylake-avx512",
              _FIXED_CORES, "avx512"),
        _spec("x86-vnni", "x86-64 with AVX-512 VNNI (Cascade Lake, Ice Lake and later)",
              "icelake-server", _FIXED_CORES, "avx512-vnni"),
        _spec("x86-bf16", "x86-64 with AVX-512 VNNI and BF16 (Cooper Lake, Sapphire Rapids, "
              "Zen 4 and later)", "cooperlake", _FIXED_CORES, "avx512-bf16"),
        _spec("x86-fp16", "x86-64 with AVX-512 VNNI, BF16 and FP16 (Sapphire Rapids and "
              "later)", "sapphirerapids", _FIXED_CORES, "avx512-fp16"),
    ]


def presets() -> list[TargetSpec]:
    return [host(), *fixed()]


# LLVM CPUs with AVX2 and FMA but not AVX-512 (those are in _AVX512_CPUS). Code for an mcpu in
# neither set (x86-64, or one aotc's presets never name) is not checked for a baseline.
_AVX2_CPUS = {"haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
              "znver1", "znver2", "znver3"}
_LEVEL_FLAGS = {isa: flags for isa, flags, _mcpu in _ISA_LEVELS}


def flags_needed(attrs) -> set[str]:
    """The /proc/cpuinfo flags a CPU needs to run code LLVM built for an x86 llvm target
    (``attrs``: a Target's attrs or its dict form): the vector ISA its mcpu or mattr names and
    the dot-product instructions it enables. Code built for a CPU with more than that (an
    icelake-server build on an AVX2 machine) dies with SIGILL at its first such instruction."""
    mattr = {str(a) for a in attrs.get("mattr", []) or []}
    mcpu = str(attrs.get("mcpu", "") or "")
    needed = set()
    if mcpu in _AVX2_CPUS | _AVX512_CPUS or "+avx2" in mattr:
        needed |= _LEVEL_FLAGS["avx2"]
    if simd(attrs) == (512, 32):
        needed |= _LEVEL_FLAGS["avx2"] | _LEVEL_FLAGS["avx512"]
    if int8_dot(attrs):
        needed |= _LEVEL_FLAGS["avx512-vnni"]
    if bf16_dot(attrs):
        needed |= _BF16_FLAGS
    if fp16_dot(attrs):
        needed |= _FP16_FLAGS
    if amx_bf16(attrs):
        needed |= _AMX_BF16_FLAGS
    if amx_int8(attrs):
        needed |= _AMX_INT8_FLAGS
    return needed


def lacking_flags(needed) -> set[str]:
    """Those of ``needed`` this CPU lacks; none where /proc/cpuinfo cannot be read (no flags
    to go by: the check must not refuse every model there)."""
    have = cpu_flags()
    return set(needed) - have if have else set()


def runs_here(spec: TargetSpec) -> str | None:
    """Why a .so for ``spec`` cannot run on this machine, or None."""
    if platform.machine() != "x86_64":
        return f"this machine is {platform.machine()}"
    lacking = lacking_flags(flags_needed(spec.tvm_target))
    return f"this CPU lacks {', '.join(sorted(lacking))}" if lacking else None
