"""ONNX Pad with constant pads, zero or positive, in constant mode on a float tensor: Relax's
``nn.pad`` op, where TVM's converter emits a prebuilt kernel (``call_tir`` of TOPI's pad).

Why: a kernel is opaque to the passes. FoldPadIntoConv folds only the op into the
convolution after it (the "SAME" padding of models converted from TensorFlow and the
asymmetric pads of EfficientNet-style exports), and ConvertLayout wrapped the kernel in two
transposes: on EfficientNet-B0 the four stride-2 pads, each a transpose, a pad and a
transpose, took a quarter of the kernel time (docs/design/measurements.md, "Explicit pads").

Anything else (run-time pads: onnx_runtime_params.pad; negative pads, other modes, integer
tensors, a run-time value) goes to the converters that handled it before."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax import op as R

from .onnx_runtime_params import pad as runtime_pad

_FLOAT = ("float16", "bfloat16", "float32", "float64")


def convert_pad(bb, inputs, attrs, opset, params):
    """Relax ``nn.pad`` for the pads this module takes; None leaves the node to the next
    converter (run-time pads, then TVM's)."""
    widths = _constant_widths(inputs, attrs, opset)
    if widths is None:
        return runtime_pad(bb, inputs, attrs, opset, params)
    return R.nn.pad(inputs[0], widths, "constant", _pad_value(inputs, attrs, opset))


def _pad_value(inputs, attrs, opset) -> float:
    if opset < 11:
        return float(attrs.get("value", 0.0))
    value = inputs[2] if len(inputs) > 2 else None
    return 0.0 if value is None else float(value.value.numpy().reshape(-1)[0])


def _constant_widths(inputs, attrs, opset) -> list[int] | None:
    """``nn.pad``'s widths (before and after of each axis in turn), or None."""
    data = inputs[0]
    ty = getattr(data, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0 or str(ty.dtype) not in _FLOAT:
        return None
    if attrs.get("mode", b"constant").decode() != "constant":
        return None
    rank = ty.ndim
    if opset < 11:
        pads = attrs.get("pads")
        axes = list(range(rank))
    else:
        pads_input = inputs[1] if len(inputs) > 1 else None
        value = inputs[2] if len(inputs) > 2 else None
        axes_input = inputs[3] if len(inputs) > 3 else None
        if not _constant(pads_input) or (value is not None and not _constant(value)) or \
                (axes_input is not None and not _constant(axes_input)):
            return None
        if value is not None and value.value.numpy().size != 1:
            return None
        pads = pads_input.value.numpy().reshape(-1).tolist()
        axes = (list(range(rank)) if axes_input is None
                else [int(a) % rank for a in axes_input.value.numpy().reshape(-1)])
    if pads is None or len(pads) != 2 * len(axes) or len(set(axes)) != len(axes) or \
            any(int(p) < 0 for p in pads):
        return None
    widths = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        widths[2 * axis], widths[2 * axis + 1] = int(pads[i]), int(pads[i + len(axes)])
    return widths


def _constant(expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst)
