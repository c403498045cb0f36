"""Load TVM's runtime without TVM's compiler.

``import tvm`` pulls in the 259 MB libtvm_compiler.so and torch (~3 s). A deployed model needs
only libtvm_runtime.so (from the same wheel) and tvm_ffi. tvm_ffi imports torch eagerly when
it is installed, so torch is hidden from it during its import."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
from pathlib import Path

from aotc import settings

_STATE: dict = {}


def package_dir(name: str) -> Path:
    """The folder of an installed package (tvm, tvm_ffi), found without executing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} is not installed (its wheel provides the TVM runtime libraries)")
    return Path(list(spec.submodule_search_locations)[0])


def runtime_library() -> Path:
    lib = package_dir("tvm") / "lib" / "libtvm_runtime.so"
    if not lib.is_file():
        raise ImportError(f"libtvm_runtime.so not found at {lib}")
    return lib


@functools.cache
def runtime_function(symbol: str, argtypes: tuple = ()):
    """A C++ function libtvm_runtime.so exports (TVM_DLL, by its mangled name), as a ctypes
    function returning nothing; None when the library lacks it. Looked up once per process."""
    try:
        function = getattr(ctypes.CDLL(str(runtime_library())), symbol)
    except (OSError, AttributeError, ImportError):
        return None
    function.argtypes, function.restype = list(argtypes), None
    return function


def import_hiding_torch(name: str):
    """``import name`` with torch hidden from it, unless something imported torch already.

    tvm_ffi imports torch eagerly whenever it is installed (about a second of CPU and a few
    hundred MB), and neither TVM's runtime nor compiling an ONNX model uses it. Only the first
    import of tvm_ffi matters; torch imported later (the torch frontend) still works: tvm_ffi
    then takes its tensors through the DLPack protocol."""
    hide_torch = "torch" not in sys.modules
    if hide_torch:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` fails fast
    try:
        return importlib.import_module(name)
    finally:
        if hide_torch:
            del sys.modules["torch"]


def tvm_ffi():
    """The tvm_ffi module, with libtvm_runtime loaded (VM and its builtins registered)."""
    if "ffi" not in _STATE:
        # first: libtvm_runtime.so links against its libtvm_ffi.so
        ffi = import_hiding_torch("tvm_ffi")
        if "tvm" not in sys.modules:  # with full TVM imported, its runtime is already there
            ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)
        _STATE["ffi"] = ffi
    return _STATE["ffi"]


def num_threads() -> int:
    """Threads of the TVM thread pool of the calling thread (what really runs, after any
    TVM_NUM_THREADS / AOTC_NUM_THREADS setting took effect).

    Asking starts the pool, so aotc's thread setting is applied first: a pool started with
    TVM's own default (half the cores: one of two) pins the calling thread to core 0, and every
    process it starts afterwards inherits that one-core mask."""
    settings.apply_thread_setting()
    return int(tvm_ffi().get_global_func("runtime.NumThreads")())
