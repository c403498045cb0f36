"""The TVM runtime a deployed model needs, for one machine architecture: libtvm_runtime.so
(the Relax VM), libtvm_ffi.so and tvm-ffi's C++ headers.

This machine's come from the installed apache-tvm / apache-tvm-ffi wheels. Another
architecture's (aarch64 for ARM targets) come from that architecture's wheels of the same
versions on PyPI, downloaded once with pip into the cache: only the two libraries are
extracted (the aarch64 apache-tvm wheel is 95 MB, 240 MB of it the compiler)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from aotc import settings
from aotc.errors import AotcError
from aotc.runtime._tvm_runtime import package_dir

# PyPI platform tag of the wheels per architecture (both projects publish manylinux_2_28).
WHEEL_PLATFORMS = {"x86_64": "manylinux_2_28_x86_64", "aarch64": "manylinux_2_28_aarch64"}
PACKAGES = ("apache-tvm", "apache-tvm-ffi")
# libtvm_runtime_extra.so: random fills and other helpers MetaSchedule's RPC runner calls on
# a farm's device (aotc-rpc-server loads it); models do not need it.
_MEMBERS = {"tvm_runtime": "tvm/lib/libtvm_runtime.so", "tvm_ffi": "tvm_ffi/lib/libtvm_ffi.so",
            "tvm_runtime_extra": "tvm/lib/libtvm_runtime_extra.so"}


class RuntimeUnavailable(AotcError):
    """The runtime libraries of an architecture cannot be had here (no network, no wheel)."""


@dataclass(frozen=True)
class RuntimeLibs:
    arch: str
    tvm_runtime: Path
    tvm_ffi: Path
    include: Path          # tvm-ffi's headers (the same on every architecture)
    tvm_runtime_extra: Path  # for aotc-rpc-server (MetaSchedule's argument fills)

    @property
    def folders(self) -> list[Path]:
        return sorted({self.tvm_runtime.parent, self.tvm_ffi.parent})


# Device -> libraries a model on that device needs beyond the CPU runtime: TVM's runtime for
# the device (from the apache-tvm wheel) and what it links that a GPU machine's driver package
# may lack (the CUDA runtime of the toolkit the wheel was built with: libcudart.so.13).
DEVICE_LIBRARIES = {"cuda": (("tvm", "libtvm_runtime_cuda.so"), (None, "libcudart.so.13"))}


def device_libraries(device: str) -> list[Path]:
    """This machine's copies of the libraries a ``device`` model needs ([] for the CPU)."""
    found = []
    for package, name in DEVICE_LIBRARIES.get(device, ()):
        path = _package_dir(package) / "lib" / name if package else _system_library(name)
        if path is None or not path.is_file():
            raise RuntimeUnavailable(f"a {device} model needs {name}, not found on this machine")
        found.append(path)
    return found


def _system_library(name: str) -> Path | None:
    """Where the dynamic linker finds ``name`` (ldconfig's cache)."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        if line.strip().startswith(name + " ") and "=>" in line:
            return Path(line.split("=>", 1)[1].strip())
    return None


def _package_dir(name: str) -> Path:
    try:
        return package_dir(name)
    except ImportError as err:
        raise RuntimeUnavailable(str(err)) from None


def headers() -> Path:
    return _package_dir("tvm_ffi") / "include"


def for_arch(arch: str | None = None) -> RuntimeLibs:
    """The runtime libraries for ``arch`` (default: this machine's)."""
    arch = arch or platform.machine()
    if arch == platform.machine():
        tvm_lib = _package_dir("tvm") / "lib"
        return RuntimeLibs(arch, tvm_lib / "libtvm_runtime.so",
                           _package_dir("tvm_ffi") / "lib" / "libtvm_ffi.so", headers(),
                           tvm_lib / "libtvm_runtime_extra.so")
    return _downloaded(arch)


def _downloaded(arch: str) -> RuntimeLibs:
    if arch not in WHEEL_PLATFORMS:
        raise RuntimeUnavailable(f"no TVM runtime wheels are known for {arch}; known: "
                                 f"{', '.join(WHEEL_PLATFORMS)}")
    versions = "-".join(importlib.metadata.version(p) for p in PACKAGES)
    folder = Path(settings.CACHE_DIR.get()) / "runtime" / f"{arch}-{versions}"
    libs = RuntimeLibs(arch, folder / "libtvm_runtime.so", folder / "libtvm_ffi.so", headers(),
                       folder / "libtvm_runtime_extra.so")
    if not all((folder / Path(m).name).is_file() for m in _MEMBERS.values()):
        _download(arch, folder)
    return libs


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _download(arch: str, folder: Path) -> None:
    wheels = folder / "wheels"
    pins = [f"{p}=={importlib.metadata.version(p)}" for p in PACKAGES]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--platform", WHEEL_PLATFORMS[arch], "--python-version",
           f"{sys.version_info.major}.{sys.version_info.minor}", "-d", str(wheels), *pins]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeUnavailable(f"could not download the {arch} TVM runtime ({' '.join(pins)}): "
                                 f"{_last_line(done.stderr) or 'pip failed'}")
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            for member in set(archive.namelist()) & set(_MEMBERS.values()):
                target = folder / Path(member).name
                target.write_bytes(archive.read(member))
                target.chmod(0o755)
    for wheel in wheels.glob("*.whl"):
        wheel.unlink()
    wheels.rmdir()
