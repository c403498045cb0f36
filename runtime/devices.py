"""Where a model's Relax VM runs, read from the .so's metadata (target.device).

A CPU model takes numpy memory as it is (DLPack views). A GPU model's inputs are copied to the
device before the call and its outputs back after it; TVM's CUDA runtime
(libtvm_runtime_cuda.so, beside libtvm_runtime.so in the wheel) is loaded first, since it
registers the loader of the kernels' fatbin."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from aotc.errors import ArtifactError

from ._tvm_runtime import runtime_library, tvm_ffi

_POOLED_ALLOCATOR = 2
_CPU = 1


@dataclass(frozen=True)
class VmDevice:
    name: str                       # as TargetSpec.runtime_device and tvm_ffi.device name it
    dl_type: int                    # DLPack device type: kDLCPU 1, kDLCUDA 2
    runtime: str | None = None      # TVM runtime library that adds this device

    def vm_initialization_args(self) -> tuple[int, ...]:
        """vm_initialization(device type, id, allocator, host type, id, host allocator)."""
        return (self.dl_type, 0, _POOLED_ALLOCATOR, _CPU, 0, _POOLED_ALLOCATOR)

    @property
    def is_host(self) -> bool:
        return self.dl_type == _CPU

    def load_runtime(self) -> None:
        if self.runtime is None:
            return
        library = runtime_library().parent / self.runtime
        try:
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise ArtifactError(f"a {self.name} model needs {library.name} and the device "
                                f"driver: {err}") from None

    def upload(self, tensor):
        """A copy of a host tensor on this device."""
        return _copy(tensor, self.name)

    def download(self, tensor):
        """A host copy of a tensor on this device, after the device finished writing it."""
        out = _copy(tensor, "cpu")
        ffi = tvm_ffi()
        ffi.get_global_func("runtime.Device_StreamSync")(ffi.device(self.name, 0), None)
        return out


def _copy(tensor, device: str):
    """A new tensor like ``tensor`` on ``device`` (first of its kind), holding its values."""
    ffi = tvm_ffi()
    alloc = ffi.get_global_func("runtime.TVMTensorAllocWithScope")
    out = alloc(ffi.Shape(list(tensor.shape)), tensor.dtype, ffi.device(device, 0), None)
    ffi.get_global_func("runtime.TVMTensorCopyFromTo")(tensor, out)
    return out


DEVICES = {"cpu": VmDevice("cpu", _CPU), "cuda": VmDevice("cuda", 2, "libtvm_runtime_cuda.so")}
