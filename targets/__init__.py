"""Target registry: a dict of families, each a module with ``presets()``, ``simd(attrs)``
and ``runs_here(spec)``. Nothing else in aotc names a target family."""

from __future__ import annotations

import platform

from aotc.errors import TargetError
from aotc.options import PRECISIONS

from . import arm, cuda, x86
from .spec import TargetSpec, Toolchain

FAMILIES = {x86.FAMILY: x86, arm.FAMILY: arm, cuda.FAMILY: cuda}


def all_targets() -> list[TargetSpec]:
    return [spec for family in FAMILIES.values() for spec in family.presets()]


def resolve(name: str) -> TargetSpec:
    for spec in all_targets():
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in all_targets())
    raise TargetError(f"unknown target {name!r}; known targets: {known}")


def _llvm_attrs(tvm_target):
    """The attrs of the CPU part of a TVM target (a Target or its dict form)."""
    if hasattr(tvm_target, "attrs"):  # a tvm.target.Target: a GPU target's CPU is its host
        target = tvm_target if tvm_target.kind.name == "llvm" else tvm_target.host
        return target.attrs if target is not None else {}
    return tvm_target if tvm_target.get("kind") == "llvm" else tvm_target.get("host", {})


def _first_answer(question: str, tvm_target):
    """The first family's non-empty answer to ``family.<question>(attrs)``, or None; a family
    without that function has nothing to say."""
    attrs = _llvm_attrs(tvm_target)
    for family in FAMILIES.values():
        found = getattr(family, question, lambda _attrs: None)(attrs)
        if found:
            return found
    return None


def cpu_flags_needed(tvm_target) -> list[str]:
    """The /proc/cpuinfo flags a CPU needs to run the CPU code built for a TVM target (a GPU
    target's host code included), sorted; empty where the family checks none (aarch64 code
    runs under qemu, whose emulated CPU has every feature)."""
    return sorted(_first_answer("flags_needed", tvm_target) or ())


def int8_dot(tvm_target) -> str | None:
    """The int8 dot-product instructions ("avx512-vnni") the int8 kernels may be tensorized
    onto for this target, or None (they then run as plain integer loops)."""
    return _first_answer("int8_dot", tvm_target)


def bf16_dot(tvm_target) -> str | None:
    """The bf16 dot-product instructions ("avx512-bf16") the bf16 kernels are tensorized onto
    for this target, or None."""
    return _first_answer("bf16_dot", tvm_target)


def amx_bf16(tvm_target) -> str | None:
    """The bf16 tile instructions ("amx-bf16") the bf16 matmuls run on for this target, or
    None (they then run on bf16_dot's vector instructions)."""
    return _first_answer("amx_bf16", tvm_target)


def amx_int8(tvm_target) -> str | None:
    """The int8 tile instructions ("amx-int8") the int8 matmuls and convs run on for this
    target, or None (they then run on int8_dot's vector instructions)."""
    return _first_answer("amx_int8", tvm_target)


def broadcast_register(tvm_target) -> bool:
    """Whether a multiply-add of a broadcast activation needs that broadcast in a register of
    its own (x86 without AVX-512: no embedded-broadcast memory operand), so that a register
    tile must leave one free for it."""
    return bool(_first_answer("broadcast_register", tvm_target))


def fp16_dot(tvm_target) -> str | None:
    """The float16 vector instructions ("avx512-fp16") the fp16 kernels run on for this
    target, or None."""
    return _first_answer("fp16_dot", tvm_target)


def for_precision(spec: TargetSpec, precision: str) -> TargetSpec:
    """The spec to compile ``spec``'s models at ``precision`` with (its instructions enabled),
    or a TargetError saying why this target cannot: asked before any model work."""
    if precision not in PRECISIONS:
        raise TargetError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return spec
    family = FAMILIES[spec.family]
    if not hasattr(family, "for_precision"):
        raise TargetError(f"--precision {precision} is not built for {spec.name}: aotc has no "
                          f"{precision} kernels for the {spec.family} family yet (fp32 and int8 "
                          "are)")
    return family.for_precision(spec, precision)


def simd(tvm_target) -> tuple[int, int]:
    """(vector bits, vector registers) of a TVM llvm target, from the family that claims it.
    The schedule rules see only the TVM target (under ``with target:``), so they ask here."""
    attrs = _llvm_attrs(tvm_target)
    for family in FAMILIES.values():
        found = family.simd(attrs)
        if found:
            return found
    raise TargetError(f"no target family knows the SIMD registers of {dict(attrs)}")


def runs_here(spec: TargetSpec) -> str | None:
    """Why a .so for ``spec`` cannot run on this machine (natively or emulated), or None."""
    return FAMILIES[spec.family].runs_here(spec)


def measurable_here(spec: TargetSpec) -> str | None:
    """Why kernels for ``spec`` cannot be timed on this machine (local tuning), or None.
    Emulated code runs (qemu) but its timings say nothing about the real CPU."""
    if spec.runtime_device != "cpu":
        return (f"the tuner times CPU kernels only; {spec.name} kernels run on a "
                f"{spec.runtime_device} device (GPU tuning is not built yet)")
    if spec.arch != platform.machine():
        return (f"{spec.name} code is {spec.arch} and this machine is {platform.machine()}: "
                "it runs here only under emulation, whose timings say nothing about the real "
                f"CPU; run aotc tune on a {spec.arch} machine and compile here with --tuning-log")
    return runs_here(spec)


__all__ = ["TargetSpec", "Toolchain", "all_targets", "amx_bf16", "amx_int8", "bf16_dot",
           "broadcast_register", "cpu_flags_needed", "for_precision", "fp16_dot", "int8_dot",
           "resolve", "measurable_here", "runs_here", "simd"]
