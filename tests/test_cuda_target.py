"""CUDA targets without a GPU: the .so builds with nvcc and carries machine code for the
target's architecture (and PTX for the generic preset); the runtime refuses it clearly where
no driver is present. bench/gpu_check.sh runs the models where a GPU is."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest

import aotc
from aotc.errors import ArtifactError
from aotc.targets import resolve

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = [pytest.mark.skipif(shutil.which("nvcc") is None,
                                 reason="nvcc (CUDA toolkit) compiles CUDA kernels"),
              pytest.mark.xdist_group("test_cuda_target")]
FATBIN_MAGIC = bytes.fromhex("50ed55ba")  # 0xBA55ED50, little-endian


def fatbin_entries(data: bytes) -> list[tuple[str, int]]:
    """(kind, sm version) of every image in the fatbin embedded in a .so."""
    at = data.find(FATBIN_MAGIC)
    assert at >= 0, "no fatbin in the library"
    _magic, _version, header, size = struct.unpack_from("<IHHQ", data, at)
    pos, end, entries = at + header, at + header + size, []
    while pos < end:
        kind, _v, entry_header, padded, _a, _b, _c, _d, sm = struct.unpack_from(
            "<HHIIIIIII", data, pos)
        entries.append(({1: "ptx", 2: "elf"}[kind], sm))
        pos += entry_header + padded
    return entries


@pytest.fixture(scope="module")
def cuda_builds(tiny_onnx, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cuda")
    out = {}
    for name in ("cuda", "cuda-sm80", "cuda-sm90"):
        meta = aotc.compile(tiny_onnx, target=name, output=folder / f"{name}.so")
        out[name] = (folder / f"{name}.so", meta)
    return out


def test_each_architecture_gets_its_machine_code(cuda_builds):
    assert fatbin_entries(cuda_builds["cuda-sm80"][0].read_bytes()) == [("elf", 80)]
    assert fatbin_entries(cuda_builds["cuda-sm90"][0].read_bytes()) == [("elf", 90)]
    # the generic preset: Turing code plus PTX the driver compiles for newer GPUs
    assert sorted(fatbin_entries(cuda_builds["cuda"][0].read_bytes())) == [("elf", 75), ("ptx", 75)]


def test_kernels_are_scheduled_and_no_source_ships(cuda_builds):
    path, meta = cuda_builds["cuda-sm80"]
    assert meta["unscheduled_kernels"] == [] and meta["target"]["device"] == "cuda"
    assert b"__global__" not in path.read_bytes()  # compiled, not CUDA source to JIT at load


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU is present")
@pytest.mark.in_process
def test_runtime_without_a_gpu_says_so(cuda_builds):
    # in a fresh process, as deployed: this one compiled for CUDA and holds a stub driver
    code = ("import aotc, sys\ntry:\n    aotc.load(sys.argv[1])\n"
            "except aotc.errors.ArtifactError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code, str(cuda_builds["cuda-sm80"][0])],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "needs libtvm_runtime_cuda.so and the device driver" in done.stdout, done.stdout
    # where the stub (or an old driver) is loaded, the device start fails with the reason
    with pytest.raises(ArtifactError, match="cannot start the cuda device"):
        aotc.load(cuda_builds["cuda-sm80"][0])


def test_presets_cover_the_common_architectures():
    for sm in ("75", "80", "86", "89", "90"):
        assert resolve(f"cuda-sm{sm}").tvm_target["arch"] == f"sm_{sm}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "bert", "efficientnet", "unet"])
def test_every_example_builds_for_the_gpu(name, example_onnx_dir, tmp_path):
    from aotc.examples.export_onnx import export
    out = tmp_path / f"{name}.so"
    meta = aotc.compile(export(name, example_onnx_dir), target="cuda-sm80", output=out)
    assert meta["unscheduled_kernels"] == []
    assert fatbin_entries(out.read_bytes()) == [("elf", 80)]
