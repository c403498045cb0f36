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
    return "\n".join(lines)
