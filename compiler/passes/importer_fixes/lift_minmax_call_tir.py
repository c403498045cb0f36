"""LiftMinMaxCallTIR: turn ``call_tir(maximum|minimum, (x, scalar_const))`` back into
``R.maximum`` / ``R.minimum``.

Why: TVM 0.27's ONNX importer lowers ``Clip`` (ReLU6 in every MobileNet) straight to TE
PrimFuncs. ``ConvertLayout`` cannot see through a call_tir, so in an NHWC graph every ReLU6
was wrapped in two transposes.
As Relax ops they are layout-agnostic elementwise ops and fuse into the conv epilogue.

Where: right after import, before ``ConvertLayout``. Recognises the PrimFunc by structure (one
block computing ``max(a, b)`` / ``min(a, b)`` over its inputs), not by name.
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx
from tvm.ir import TensorLoad
from tvm.relax.dpl import is_op, wildcard

from ..pattern_rewrite import rewrite_module


def _minmax_kind(func: tirx.PrimFunc) -> str | None:
    """'maximum' / 'minimum' if the PrimFunc is one elementwise max/min block, else None."""
    if len(func.params) != 3:
        return None
    try:
        sch = s_tir.Schedule(func)
        found = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    except Exception:
        return None  # not a single-root block function: not ours to rewrite
    if len(found) != 1 or not isinstance(found[0].body, tirx.BufferStore):
        return None
    value = found[0].body.value
    ops = {tirx.Max: "maximum", tirx.Min: "minimum"}
    kind = next((name for cls, name in ops.items() if isinstance(value, cls)), None)
    if kind is None or not all(isinstance(v, TensorLoad) for v in (value.a, value.b)):
        return None
    return kind


@tvm.transform.module_pass(opt_level=0, name="LiftMinMaxCallTIR")
class LiftMinMaxCallTIR:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        kinds = {gv: _minmax_kind(f) for gv, f in mod.functions_items()
                 if isinstance(f, tirx.PrimFunc)}
        kinds = {gv: k for gv, k in kinds.items() if k}
        if not kinds:
            return mod

        def lift(call, _matches):
            if not isinstance(call, relax.Call) or call.args[0] not in kinds:
                return call
            if not isinstance(call.args[1], relax.Tuple):
                return call  # arguments bound to a variable (Clip without bounds): not ours
            args = call.args[1].fields
            if len(args) != 2 or not isinstance(args[1], tvm.ir.expr.Constant):
                return call
            op = relax.op.maximum if kinds[call.args[0]] == "maximum" else relax.op.minimum
            return op(args[0], args[1])

        return rewrite_module(mod, is_op("relax.call_tir")(wildcard(), wildcard()), lift)
