"""The public API. Heavy imports (TVM, onnx, torch) happen inside the functions so that
``import aotc`` and ``aotc --help`` stay instant."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def compile(model, target: str = "x86", output: str | Path = "model.so", *,  # pylint: disable=redefined-builtin
            input_shapes: dict[str, tuple[int, ...]] | None = None, example_inputs=None,
            dump_ir: str | Path | None = None, options=None,
            progress: Callable[[str], None] | None = None) -> dict:
    """Compile an ONNX file / ModelProto, a torch.nn.Module (with ``example_inputs``) or a
    ``.pt2`` ExportedProgram for ``target`` into one shared library at ``output``.

    ``options``: an ``aotc.CompileOptions`` (opt level, disabled passes, explain, IR dumps);
    ``dump_ir`` is a shortcut for its dump folder.
    Returns the metadata embedded in the library (signature, target, versions, hash...)."""
    import dataclasses

    from aotc import settings
    from aotc.compiler import build, import_model
    from aotc.options import CompileOptions
    from aotc.targets import resolve

    from aotc.compiler.pipeline import check_options

    spec = resolve(target)  # fail on a bad target or pass name before the (slow) import
    check_options(spec, options or CompileOptions())
    say = progress or (lambda _msg: None)
    say("importing model")
    imported = import_model(model, input_shapes=input_shapes, example_inputs=example_inputs)
    options = options or CompileOptions()
    dump = dump_ir or options.dump_ir or settings.DUMP_IR.get() or None
    options = dataclasses.replace(options, dump_ir=Path(dump) if dump else None)
    return build(imported, spec, output, options=options, progress=say)


def load(path: str | Path, verify: bool = True):
    """Load a compiled model (see aotc.runtime.Model)."""
    from aotc.runtime import load as _load
    return _load(path, verify=verify)
