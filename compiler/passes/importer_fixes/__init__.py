"""Clean-ups of TVM's ONNX importer output that kept ConvertLayout from converting whole graphs
(each module says which model it kept in NCHW)."""

from __future__ import annotations

from ..step import Step
from .conv1d_as_conv2d import Conv1dAsConv2d
from .lift_minmax_call_tir import LiftMinMaxCallTIR
from .remove_identity_broadcast import RemoveIdentityBroadcast
from .remove_identity_cast import RemoveIdentityCast
from .remove_inference_dropout import RemoveInferenceDropout
from .sum_of_stack_to_add import SumOfStackToAdd
from .whole_input_pooling import WholeInputPooling


def steps() -> list[Step]:
    return [Step(LiftMinMaxCallTIR(), 2), Step(SumOfStackToAdd(), 2),
            Step(RemoveIdentityBroadcast(), 2), Step(RemoveIdentityCast(), 2),
            Step(RemoveInferenceDropout(), 2),
            Step(WholeInputPooling(), 2), Step(Conv1dAsConv2d(), 2)]


__all__ = ["Conv1dAsConv2d", "LiftMinMaxCallTIR", "RemoveIdentityBroadcast",
           "RemoveIdentityCast", "RemoveInferenceDropout",
           "SumOfStackToAdd", "WholeInputPooling", "steps"]
