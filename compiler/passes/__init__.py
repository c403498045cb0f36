"""aotc's own Relax passes, one per file (see each module's docstring for where it sits)."""

from .convert_layout_nhwc import ConvertLayoutNHWC
from .fold_channel_affine import FoldChannelAffine
from .fold_constants_numpy import FoldConstantsNumpy
from .guard_indices import GuardIndices
from .half_in_float32 import HalfInFloat32
from .legalize_dynamic_slices import LegalizeDynamicSlices
from .lift_minmax_call_tir import LiftMinMaxCallTIR
from .materialize_empty_constants import MaterializeEmptyConstants
from .remove_identity_broadcast import RemoveIdentityBroadcast
from .remove_inference_dropout import RemoveInferenceDropout
from .sum_of_stack_to_add import SumOfStackToAdd

__all__ = ["ConvertLayoutNHWC", "FoldChannelAffine", "FoldConstantsNumpy", "GuardIndices", "HalfInFloat32", "LegalizeDynamicSlices", "LiftMinMaxCallTIR", "MaterializeEmptyConstants", "RemoveIdentityBroadcast",
           "RemoveInferenceDropout", "SumOfStackToAdd"]
