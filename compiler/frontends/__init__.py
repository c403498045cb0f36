"""Frontends: turn what the user gives (ONNX path / ModelProto, nn.Module, .pt2) into an
ImportedModel. Validation happens here, before any TVM work."""

from __future__ import annotations

import os

from .imported import ImportedModel


def import_model(source, input_shapes=None, example_inputs=None,
                 options=None) -> ImportedModel:
    """Dispatch on the kind of ``source``; torch is imported only for torch sources.
    ``options`` (CompileOptions): ``trust_pickle`` for a .pt2 whose loading unpickles
    (frontends/pt2_archive.py); ``dim_ranges`` and ``bound_inputs`` for ONNX models."""
    trust_pickle = bool(options and options.trust_pickle)
    onnx_options = {"dim_ranges": dict(options.dim_ranges), "bound": dict(options.bound_inputs)} \
        if options is not None else {}
    if isinstance(source, (str, os.PathLike)):
        if str(source).endswith(".pt2"):
            from .torch_loader import import_torch
            return import_torch(source, trust_pickle=trust_pickle)
        from .onnx_loader import import_onnx
        return import_onnx(source, input_shapes, **onnx_options)
    if type(source).__module__.startswith("onnx"):
        from .onnx_loader import import_onnx
        return import_onnx(source, input_shapes, **onnx_options)
    from .torch_loader import import_torch
    return import_torch(source, example_inputs)


__all__ = ["ImportedModel", "import_model"]
