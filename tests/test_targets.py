"""Target families: presets, what the schedules read from them, cross-compiling for ARM."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import aotc
from aotc.errors import ArtifactError, TargetError
from aotc.targets import Toolchain, all_targets, resolve, simd

needs_arm_gcc = pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                                   reason="aarch64-linux-gnu-g++ not installed "
                                          "(apt install g++-aarch64-linux-gnu; .ci/run does)")


def test_presets_are_unique_and_cover_every_family():
    names = [s.name for s in all_targets()]
    assert len(names) == len(set(names))
    assert {s.family for s in all_targets()} >= {"x86", "arm"}
    for name in ("arm", "arm-dotprod", "arm-i8mm", "arm-cortex-a55", "arm-cortex-a76",
                 "arm-neoverse-n1", "arm-neoverse-v1", "x86-avx2", "x86-avx512"):
        assert resolve(name).name == name


def test_schedules_read_simd_from_the_spec():
    for spec in all_targets():
        assert simd(spec.tvm_target) == (spec.vector_bits, spec.vector_registers), spec.name
    assert resolve("arm").vector_lanes(32) == 4       # NEON: 4 fp32 lanes, not AVX's 8 or 16
    assert resolve("x86-avx2").vector_lanes(32) == 8
    assert resolve("x86-avx512").vector_lanes(32) == 16


def test_fixed_presets_do_not_carry_the_build_hosts_core_count():
    cores = {resolve(n).tvm_target["num-cores"] for n in ("x86-avx2", "x86-avx512", "arm")}
    assert cores == {4}


def test_missing_cross_compiler_is_named_before_any_work(tiny_onnx, tmp_path, monkeypatch):
    from aotc.compiler.build import check_toolchain
    spec = resolve("arm")
    broken = type(spec)(**{**spec.__dict__, "toolchain": Toolchain("no-such-g++",
                                                                   install_hint="x")})
    with pytest.raises(TargetError, match="no-such-g\\+\\+ not found"):
        check_toolchain(broken)


@needs_arm_gcc
def test_arm_build_is_aarch64_neon_code_and_refused_by_the_x86_runtime(tiny_onnx, tmp_path):
    out = tmp_path / "tiny_arm.so"
    meta = aotc.compile(tiny_onnx, target="arm", output=out)
    assert meta["target"]["arch"] == "aarch64" and meta["unscheduled_kernels"] == []
    assert "ARM aarch64" in subprocess.run(["file", str(out)], capture_output=True,
                                           text=True, check=True).stdout
    asm = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(out)], capture_output=True,
                         text=True, check=True).stdout
    assert "fmla\tv" in asm  # vectorized NEON multiply-adds: the default rules fit 4 lanes
    with pytest.raises(ArtifactError, match="built for aarch64"):
        aotc.load(out)


def test_tuning_a_target_this_machine_cannot_time_is_refused_up_front(tiny_onnx, tmp_path):
    with pytest.raises(TargetError, match="runs here only under emulation"):
        aotc.tune(tiny_onnx, target="arm", trials=8, log=tmp_path / "t.jsonl")
    with pytest.raises(TargetError, match="GPU tuning is not built yet"):
        aotc.tune(tiny_onnx, target="cuda", trials=8, log=tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()


def test_avx512_presets_generate_512_bit_vectors_and_keep_their_tuning_keys():
    """LLVM's tuning for the AVX-512 server CPUs splits vectors wider than 256 bits; the x86
    presets turn that off, so a 32-lane loop is two zmm multiply-adds, not four ymm ones. The
    attribute leaves the ISA, and so the tuning records' target key, as it was."""
    import tvm
    from tvm import te

    from aotc.schedules.keys import target_key

    for name, wide in (("x86-avx512", True), ("x86-fp16", True), ("x86-avx2", False)):
        spec = resolve(name)
        assert ("-prefer-256-bit" in spec.tvm_target.get("mattr", [])) == wide
        target = tvm.target.Target(spec.tvm_target)
        bare = tvm.target.Target({k: v for k, v in spec.tvm_target.items() if k != "mattr"})
        assert target_key(target) == target_key(bare)
    x = te.placeholder((64,), "float32", "x")
    y = te.compute((64,), lambda i: x[i] * 2.0 + 1.0, name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    _outer, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], factors=[None, 32])
    sch.vectorize(inner)
    for name, register in (("x86-fp16", "zmm"), ("x86-avx2", "ymm")):
        asm = tvm.compile(sch.mod, target=tvm.target.Target(resolve(name).tvm_target)
                          ).mod.inspect_source("asm")
        fmas = [line for line in asm.splitlines() if "vfmadd" in line]
        assert fmas and all(f"%{register}" in line for line in fmas), fmas
