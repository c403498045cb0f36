"""Building and launching the C++ runner (runtime/cpp) for a machine architecture.

The runner is built once per architecture and source version into the cache, linked against
that architecture's TVM runtime (aotc.runtime_libs) with an rpath to it, so that it runs in
place. Another architecture's runner is cross-compiled and launched under its emulator here
(qemu-aarch64 user mode for aarch64 on x86)."""

from __future__ import annotations

import hashlib
import importlib.util
import platform
import shutil
import subprocess
from pathlib import Path

from aotc import settings
from aotc.errors import AotcError

from . import runtime_libs

# runtime/cpp in a checkout, aotc/runtime/cpp in an installed wheel: found without importing


def _runtime_package() -> Path:
    spec = importlib.util.find_spec("aotc.runtime")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("aotc.runtime is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


SOURCE = _runtime_package() / "cpp"
# architecture -> (CMake toolchain file in runtime/cpp, or None for the host; emulator command)
CROSS = {"aarch64": ("aarch64-toolchain.cmake", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])}


class RunnerBuildError(AotcError):
    """The C++ runner could not be built (no cmake or compiler, or a compile error)."""


def source_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in SOURCE.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(SOURCE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def launcher(arch: str) -> list[str]:
    """Command prefix that runs an ``arch`` program here ([] when native)."""
    if arch == platform.machine():
        return []
    if arch not in CROSS:
        raise RunnerBuildError(f"cannot run {arch} programs on this {platform.machine()} machine")
    emulator = CROSS[arch][1]
    if shutil.which(emulator[0]) is None:
        raise RunnerBuildError(f"{emulator[0]} not found (apt install qemu-user) to run "
                               f"{arch} code")
    return list(emulator)


def build(arch: str | None = None, rpath: str | None = None, build_dir: Path | None = None) -> Path:
    """The aotc-run binary for ``arch`` (default: this machine), built if not cached.
    ``rpath`` defaults to the folders of the runtime libraries it was linked against."""
    arch = arch or platform.machine()
    libs = runtime_libs.for_arch(arch)
    rpath = rpath or ":".join(str(f) for f in libs.folders)
    key = hashlib.sha256(f"{source_digest()}|{rpath}".encode()).hexdigest()[:16]
    folder = build_dir or Path(settings.CACHE_DIR.get()) / "cpp" / f"{arch}-{key}"
    binary = folder / "aotc-run"
    if binary.is_file():
        return binary
    _cmake(arch, libs, rpath, folder)
    return binary


def _cmake(arch: str, libs: runtime_libs.RuntimeLibs, rpath: str, folder: Path) -> None:
    if shutil.which("cmake") is None:
        raise RunnerBuildError("cmake not found: it builds the C++ runner (apt install cmake)")
    configure = ["cmake", "-S", str(SOURCE), "-B", str(folder), f"-DTVM_FFI_INCLUDE={libs.include}",
                 f"-DTVM_FFI_LIB={libs.tvm_ffi}", f"-DTVM_RUNTIME_LIB={libs.tvm_runtime}",
                 f"-DAOTC_RPATH={rpath}"]
    if arch != platform.machine():
        if arch not in CROSS:
            raise RunnerBuildError(f"no cross toolchain known for {arch}")
        configure.append(f"-DCMAKE_TOOLCHAIN_FILE={SOURCE / CROSS[arch][0]}")
    for cmd in (configure, ["cmake", "--build", str(folder), "-j", "2"]):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            raise RunnerBuildError(f"building the {arch} C++ runner failed ({cmd[1]}):\n"
                                   f"{(done.stdout + done.stderr)[-2000:]}")
