"""Export the example models to ONNX (and .pt2): ``python -m aotc.examples.export_onnx OUT_DIR``.

Uses torch's TorchScript-based exporter (``dynamo=False``): the default dynamo exporter needs
onnxscript, which we do not depend on. Opset 17."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from . import models


def export(name: str, folder: str | Path) -> Path:
    """Write ``folder/name.onnx`` (skipped if present) and return its path."""
    import torch
    path = Path(folder) / f"{name}.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    model, inputs = models.build(name)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), input_names=[models.INPUT_NAMES[name]],
                          output_names=["output"], opset_version=17, dynamo=False)
    return path


def main(argv: list[str]) -> None:
    folder = Path(argv[0] if argv else "examples/onnx")
    for name in models.MODELS:
        print(export(name, folder))


if __name__ == "__main__":
    main(sys.argv[1:])
