"""`aotc inspect`: what is inside an ONNX model (op table, signature) or a compiled .so
(metadata). Kept apart from the CLI so that the API can reuse it."""

from __future__ import annotations

import json
from pathlib import Path


def describe(path: str) -> str:
    if Path(path).suffix == ".so":
        from aotc.runtime.artifact import read_metadata
        meta = read_metadata(path)
        return json.dumps(meta, indent=2)
    return describe_onnx(path)


def describe_onnx(path: str) -> str:
    from aotc.compiler.frontends.onnx_loader import graph_inputs, read_onnx
    from aotc.compiler.frontends.onnx_ops import model_opset, op_table

    model, name = read_onnx(path)
    rows = op_table(model)
    lines = [f"{name}: opset {model_opset(model)}, {len(model.graph.node)} nodes",
             f"{'op':28s} {'domain':12s} {'count':>5s}  supported"]
    for r in rows:
        status = "yes" if r.supported else f"NO: {r.reason}"
        lines.append(f"{r.op_type:28s} {r.domain:12s} {r.count:5d}  {status}")
    lines.append("inputs:")
    lines += [f"  {t}" for t in graph_inputs(model)]
    lines.append("outputs:")
    lines += [f"  {o.name}" for o in model.graph.output]
    lines.append(f"frontend: {frontend_verdict(model)}")
    return "\n".join(lines)


def frontend_verdict(model) -> str:
    """What the compiler's frontend makes of the model, short of compiling it: the op check,
    shape folding, aotc's rewrites and TVM's importer run as ``aotc compile`` runs them, and
    the ops that would need TVM's compiler at run time are looked for. A failure here is the
    failure ``aotc compile`` would report."""
    from aotc.compiler.frontends.onnx_loader import import_onnx
    from aotc.compiler.relax_walk import op_calls
    from aotc.compiler.runtime_deps import COMPILER_ONLY_OPS
    from aotc.errors import AotcError

    try:
        imported = import_onnx(model)
    except AotcError as err:
        return f"compile would FAIL: {err}"
    calls = op_calls(imported.mod)
    refused = sorted({COMPILER_ONLY_OPS[c.op.name] for c in calls
                      if c.op.name in COMPILER_ONLY_OPS})
    if refused:
        return (f"compile would FAIL: {', '.join(refused)} has no aotc kernel (TVM's runs only "
                "where TVM's compiler is loaded)")
    ranges = imported.signature.dim_ranges
    bounds = "".join(f"; dim {k} takes {lo} to {hi}" for k, (lo, hi) in ranges.items())
    return f"imports ({len(calls)} Relax ops){bounds}"
