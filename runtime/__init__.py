"""aotc's runtime: load a compiled model and run it.

Imports neither aotc's compiler nor TVM's (nor onnx, torch, xgboost): a deployed application
needs numpy, tvm_ffi and the libtvm_runtime.so of the apache-tvm wheel."""

from __future__ import annotations

from .model import Model
from .signature import ModelSignature, TensorSpec


def load(path, verify: bool = True) -> Model:
    """Load a .so built by ``aotc compile``; refuses files that fail the integrity check."""
    return Model(path, verify=verify)


__all__ = ["Model", "ModelSignature", "TensorSpec", "load"]
