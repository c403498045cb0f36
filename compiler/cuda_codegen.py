"""Device code for CUDA targets: an nvcc fatbin inside the .so, so that the GPU machine needs
only the TVM runtime and the driver (no Python, no nvcc).

Why this module: the pip wheel's TVM compiler does not link the CUDA runtime, so its codegen
returns a fallback module that carries CUDA *source*; a .so exported that way compiles its
kernels when loaded, through ``tvm_callback_cuda_compile`` (Python and nvcc on the GPU
machine). Once the CUDA runtime module (libtvm_runtime_cuda.so) is loaded, codegen hands the
source to ``tvm_callback_cuda_compile`` at compile time and keeps what it returns (here: a
fatbin from nvcc), and export writes that. libtvm_runtime_cuda.so imports nine CUDA driver
functions from libcuda.so.1, which a build machine without a GPU lacks: a stub driver that
defines them, each failing with CUDA_ERROR_NO_DEVICE, satisfies the loader; compiling never
calls them."""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
from pathlib import Path

import tvm_ffi

from aotc import settings
from aotc.errors import CompileError
from aotc.runtime._tvm_runtime import runtime_library

# What libtvm_runtime_cuda.so (0.27.0.post1) imports from the driver (nm -D -u).
_DRIVER_FUNCTIONS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuLaunchKernelEx",
                     "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload",
                     "cuTensorMapEncodeTiled")
_CUDA_ERROR_NO_DEVICE = 100
# Keep half/bfloat16 operators (TVM's generated code uses them), as TVM's own nvcc call does.
# No --use_fast_math (TVM's default): approximate exp/division would not match the reference.
_NVCC_FLAGS = ("-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
               "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
               "--expt-relaxed-constexpr")
_STATE: dict = {}


def gencode(arch: str, with_ptx: bool) -> list[str]:
    """nvcc -gencode flags: machine code for ``arch`` (sm_80), plus its PTX when the driver
    should be able to compile it for newer GPUs."""
    compute = arch.replace("sm_", "compute_")
    flags = ["-gencode", f"arch={compute},code={arch}"]
    return flags + (["-gencode", f"arch={compute},code={compute}"] if with_ptx else [])


def prepare(arch: str, with_ptx: bool) -> None:
    """Make the next codegen produce fatbins for ``arch`` (call before relax.build)."""
    if "loaded" not in _STATE:
        _load_cuda_runtime()
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", _compile, override=True)
        _STATE["loaded"] = True
    _STATE["gencode"] = gencode(arch, with_ptx)


def _compile(code: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="aotc-nvcc-") as tmp:
        source, fatbin = Path(tmp) / "kernels.cu", Path(tmp) / "kernels.fatbin"
        source.write_text(code)
        cmd = ["nvcc", "--fatbin", *_STATE["gencode"], *_NVCC_FLAGS, "-o", str(fatbin),
               str(source)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CompileError("nvcc failed on the generated kernels: "
                               f"{done.stderr.strip()[-1500:]}")
        return fatbin.read_bytes()


def _load_cuda_runtime() -> None:
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)  # a real driver, when present
    except OSError:
        ctypes.CDLL(str(_stub_driver()), mode=ctypes.RTLD_GLOBAL)
    runtime = runtime_library().parent / "libtvm_runtime_cuda.so"
    try:
        ctypes.CDLL(str(runtime), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise CompileError(f"cannot load TVM's CUDA runtime ({runtime.name}): {err}") from None


def _stub_driver() -> Path:
    """libcuda.so.1 with the functions TVM's CUDA runtime imports, built once into the cache."""
    body = "".join(f"int {name}(void) {{ return {_CUDA_ERROR_NO_DEVICE}; }}\n"
                   for name in _DRIVER_FUNCTIONS)
    body += ("int cuGetErrorName(int e, const char** s) { *s = \"no CUDA driver\"; return 0; }\n"
             "int cuGetErrorString(int e, const char** s) { *s = \"no CUDA driver\"; return 0; }\n")
    key = hashlib.sha256(body.encode()).hexdigest()[:12]
    folder = Path(settings.CACHE_DIR.get()) / "cuda-stub" / key
    library = folder / "libcuda.so.1"
    if not library.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stub.c").write_text(body)
        cmd = ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library),
               str(folder / "stub.c")]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CompileError(f"cannot build the CUDA driver stub: {done.stderr.strip()}")
    return library
