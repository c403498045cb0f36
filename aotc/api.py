"""The public API. Heavy imports (TVM, onnx, torch) happen inside the functions so that
``import aotc`` and ``aotc --help`` stay instant."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def compile(model, target: str = "x86", output: str | Path = "model.so", *,  # pylint: disable=redefined-builtin
            input_shapes: dict[str, tuple[int, ...]] | None = None, example_inputs=None,
            dump_ir: str | Path | None = None,
            progress: Callable[[str], None] | None = None) -> dict:
    """Compile an ONNX file / ModelProto, a torch.nn.Module (with ``example_inputs``) or a
    ``.pt2`` ExportedProgram for ``target`` into one shared library at ``output``.

    Returns the metadata embedded in the library (signature, target, versions, hash...)."""
    from aotc import settings
    from aotc.compiler import build, import_model
    from aotc.targets import resolve

    spec = resolve(target)  # fail on a bad target before the (slow) import
    say = progress or (lambda _msg: None)
    say("importing model")
    imported = import_model(model, input_shapes=input_shapes, example_inputs=example_inputs)
    dump = dump_ir or settings.DUMP_IR.get() or None
    return build(imported, spec, output, dump_ir=Path(dump) if dump else None, progress=say)


def load(path: str | Path, verify: bool = True):
    """Load a compiled model (see aotc.runtime.Model)."""
    from aotc.runtime import load as _load
    return _load(path, verify=verify)
