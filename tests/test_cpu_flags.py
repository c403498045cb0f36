"""A model whose code uses instructions this CPU lacks is refused at load with an error that
names the missing CPU flags (the C++ runner's refusal: test_cpp_runtime.py), not left to die
with SIGILL at its first such instruction; which flags each target preset's code needs."""

import numpy as np
import pytest
from helpers import claiming_a_flag_no_cpu_has

import aotc
from aotc.errors import ArtifactError
from aotc.runtime.artifact import read_metadata
from aotc.targets import all_targets, cpu_flags_needed, resolve, runs_here, x86

AVX2 = ["avx2", "fma"]
AVX512 = sorted([*AVX2, "avx512f", "avx512bw", "avx512vl"])
VNNI = sorted([*AVX512, "avx512_vnni"])
BF16 = sorted([*VNNI, "avx512_bf16"])


def test_flags_each_preset_needs():
    expected = {"x86-avx2": AVX2, "x86-avx512": AVX512, "x86-vnni": VNNI, "x86-bf16": BF16,
                "x86-fp16": sorted([*BF16, "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile"])}
    for name, flags in expected.items():
        assert cpu_flags_needed(resolve(name).tvm_target) == flags, name
    assert cpu_flags_needed({"kind": "llvm", "mcpu": "x86-64"}) == []
    # a bf16 build for the host adds the attribute to the host's mcpu
    assert cpu_flags_needed({"kind": "llvm", "mcpu": "icelake-server",
                             "mattr": ["+avx512bf16"]}) == BF16
    # aarch64 code runs under qemu, whose CPU has every feature; a CUDA model's host code is
    # the AVX2 baseline
    assert cpu_flags_needed(resolve("arm-i8mm").tvm_target) == []
    cuda = next(s for s in all_targets() if s.family == "cuda")
    assert cpu_flags_needed(cuda.tvm_target) == AVX2
    assert runs_here(resolve("x86")) is None  # what the host preset needs, this CPU has


def test_metadata_lists_the_flags(tiny_so):
    target = read_metadata(tiny_so)["target"]
    assert target["cpu_flags"] == cpu_flags_needed(target["tvm"])


def test_python_runtime_refuses_a_model_this_cpu_cannot_run(tiny_so, tmp_path):
    foreign = claiming_a_flag_no_cpu_has(tiny_so, tmp_path)
    with pytest.raises(ArtifactError, match=r"whose code uses avz2, .*this CPU lacks avz2\. "
                                            r"Compile it for this machine"):
        aotc.load(foreign)


def test_a_preset_this_cpu_lacks_is_refused_not_killed(tiny_onnx, tmp_path):
    """The real case: a library built for a fixed preset with instructions this CPU lacks
    (on an AVX2 machine, x86-avx512) loads with a clear error in a fresh process."""
    lacking = [s for s in all_targets() if s.family == "x86" and runs_here(s) is not None]
    if not lacking:
        pytest.skip("this CPU has every x86 preset's instructions")
    spec = lacking[0]
    path = tmp_path / "other.so"
    aotc.compile(tiny_onnx, target=spec.name, output=path)
    missing = x86.lacking_flags(cpu_flags_needed(spec.tvm_target))
    with pytest.raises(ArtifactError, match=f"this CPU lacks {', '.join(sorted(missing))}"):
        aotc.load(path).run({"x": np.zeros((1, 8, 12, 12), np.float32)})
