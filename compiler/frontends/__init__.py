"""Frontends: turn what the user gives (ONNX path / ModelProto, nn.Module, .pt2) into an
ImportedModel. Validation happens here, before any TVM work."""

from __future__ import annotations

import os

from .imported import ImportedModel


def import_model(source, input_shapes=None, example_inputs=None,
                 trust_pickle: bool = False) -> ImportedModel:
    """Dispatch on the kind of ``source``; torch is imported only for torch sources.
    ``trust_pickle``: load a .pt2 whose loading unpickles (frontends/pt2_archive.py)."""
    if isinstance(source, (str, os.PathLike)):
        if str(source).endswith(".pt2"):
            from .torch_loader import import_torch  # pylint: disable=import-outside-toplevel
            return import_torch(source, trust_pickle=trust_pickle)
        from .onnx_loader import import_onnx  # pylint: disable=import-outside-toplevel
        return import_onnx(source, input_shapes)
    if type(source).__module__.startswith("onnx"):
        from .onnx_loader import import_onnx  # pylint: disable=import-outside-toplevel
        return import_onnx(source, input_shapes)
    from .torch_loader import import_torch  # pylint: disable=import-outside-toplevel
    return import_torch(source, example_inputs)


__all__ = ["ImportedModel", "import_model"]
