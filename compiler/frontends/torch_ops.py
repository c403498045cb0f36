"""PyTorch op check, run before any TVM work, like the ONNX one (onnx_ops.py).

TVM's importer stops at the first graph it cannot convert with an AssertionError that lists op
names only; here every aten op without a converter is listed in one UnsupportedModelError with
its count and first node, on the decomposed graph TVM would see."""

from __future__ import annotations

import collections

from aotc.errors import UnsupportedModelError


def converter_names() -> set[str]:
    from tvm.relax.frontend.torch.exported_program_translator import (  # pylint: disable=import-outside-toplevel
        ExportedProgramImporter)
    return set(ExportedProgramImporter().create_convert_map())


def unsupported_ops(program) -> list[tuple[str, int, str]]:
    """(op name, count, first node) for every call_function TVM has no converter for."""
    known = converter_names()
    counts, first = collections.Counter(), {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name not in known:
            counts[name] += 1
            first.setdefault(name, node.name)
    return [(name, n, first[name]) for name, n in sorted(counts.items())]


def check_torch_ops(program, source: str) -> None:
    bad = unsupported_ops(program)
    if bad:
        listed = "; ".join(f"{name} ({n} node(s), first {node!r})" for name, n, node in bad)
        raise UnsupportedModelError(
            f"{source}: {len(bad)} unsupported PyTorch op(s) after torch.export's decompositions: "
            f"{listed}")
