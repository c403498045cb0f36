"""aotc's runtime: load a compiled model and run it.

Imports neither aotc's compiler nor TVM's (nor onnx, torch, xgboost): a deployed application
needs numpy, tvm_ffi and the libtvm_runtime.so of the apache-tvm wheel."""

from __future__ import annotations

from .model import Model
from .signature import ModelSignature, TensorSpec


def load(path, verify: bool = True, key_file=None) -> Model:
    """Load a .so built by ``aotc compile``; refuses files that fail the integrity check. An
    encrypted one is decrypted into memory with the key in ``key_file`` (or from
    AOTC_MODEL_KEY / AOTC_MODEL_KEY_FILE): runtime/encrypted.py."""
    return Model(path, verify=verify, key_file=key_file)


__all__ = ["Model", "ModelSignature", "TensorSpec", "load"]
