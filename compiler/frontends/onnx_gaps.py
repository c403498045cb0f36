"""Configurations of supported ops that TVM 0.27 converts to a wrong answer and that no rewrite
(onnx_rewrites.py) fixes yet: refused by the op check, by name, instead of compiling silently
wrong. Each entry was found by the node suite (tests/conformance) or a model from the wild.

A check takes (node, constants) and returns a reason, or '' when the node is fine."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from .onnx_graph import node_attrs

Check = Callable[[onnx.NodeProto, dict], str]


def batchnorm_training(node, _constants) -> str:
    if node_attrs(node).get("training_mode", 0):
        return "training_mode=1 (batch statistics): aotc compiles inference graphs only"
    return ""


def dropout_training(node, constants) -> str:
    if len(node.input) > 2 and node.input[2]:
        value = constants.get(node.input[2])
        if value is None:
            return ("training_mode given as a run-time input: aotc compiles inference graphs "
                    "only (make it a constant False)")
        if bool(value):
            return "training_mode=True (random masks): aotc compiles inference graphs only"
    return ""


def nms_any(_node, _constants) -> str:
    return ("TVM 0.27's NonMaxSuppression returns no boxes (a silent wrong answer in the ONNX "
            "node suite); not supported yet")


def roialign_max(node, _constants) -> str:
    if node_attrs(node).get("mode", b"avg") in (b"max", "max"):
        return "mode='max' computes wrong values in TVM 0.27; only mode='avg' is supported"
    return ""


def resize_gaps(node, constants) -> str:
    """Resize configurations TVM 0.27 gets wrong without an error."""
    attrs = node_attrs(node)
    if attrs.get("antialias", 0):
        return ("antialias=1 is ignored by TVM 0.27's Resize (downsampling then skips the "
                "filter: a silent wrong answer); not supported yet")
    if "axes" in attrs:
        return "the axes attribute is ignored by TVM 0.27's Resize; not supported yet"
    if attrs.get("keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
        return ("keep_aspect_ratio_policy other than 'stretch' is ignored by TVM 0.27's "
                "Resize; not supported yet")
    return ""


GAPS: dict[str, Check] = {
    "Resize": resize_gaps,
    "BatchNormalization": batchnorm_training,
    "Dropout": dropout_training,
    "NonMaxSuppression": nms_any,
    "RoiAlign": roialign_max,
}


def gap_reason(node: onnx.NodeProto, constants: dict) -> str:
    check = GAPS.get(node.op_type)
    return check(node, constants) if check and node.domain in ("", "ai.onnx") else ""
