"""aotc's compiler: frontends -> passes -> schedules -> one .so. See shared DESIGN.md.

TVM is imported here first, with torch hidden from tvm_ffi unless the process imported torch
already (``import_hiding_torch``): compiling an ONNX model never needs it."""

from aotc.runtime._tvm_runtime import import_hiding_torch

import_hiding_torch("tvm")

from .build import build  # noqa: E402
from .frontends import ImportedModel, import_model  # noqa: E402

__all__ = ["ImportedModel", "build", "import_model"]
