"""aotc's own Relax passes, one per module, grouped by purpose in subpackages; each group's
``steps()`` returns its passes in order, with the opt level each needs:
  folding/         constants, inference decomposition, BatchNorm into weights
  importer_fixes/  clean-ups of TVM's ONNX importer output that block layout conversion
  cleanup/         layout chains collapsed, pad folded into conv, CSE, dead code
  layout/          NHWC/HWIO convolutions
  fusion/          patterns FuseOps does not find (attention)
  lowering/        index guards, float32 accumulation, legalization and fusion to TIR
Helpers shared by the groups: pattern_rewrite, step (and compiler/relax_walk.py, which the
compile reports use too)."""

from . import cleanup, fusion
from .cleanup import (
    CollapseLayoutChains,
    ElementwiseUnderReshape,
    FoldPadIntoConv,
    SplitIntoSlices,
)
from .folding import (
    FoldChannelAffine,
    FoldConstantsNumpy,
    FoldRemainingConstants,
    LegalizeDynamicSlices,
)
from .fusion import FuseAttention
from .importer_fixes import (
    Conv1dAsConv2d,
    LiftMinMaxCallTIR,
    RemoveIdentityBroadcast,
    RemoveIdentityCast,
    RemoveInferenceDropout,
    SumOfStackToAdd,
    WholeInputPooling,
)
from .layout import ConvertLayoutNHWC
from .lowering import (
    DropOverwrittenInits,
    GuardIndices,
    HalfInFloat32,
    HoistTileConfigs,
    MaterializeEmptyConstants,
    PaddedImageInProducer,
    PaddedRowsInProducer,
    WholeVectorPredicates,
)

# the groups pipeline.py calls steps() of, then the passes tests and callers import by name
__all__ = ["cleanup", "fusion",
           "CollapseLayoutChains", "ElementwiseUnderReshape", "Conv1dAsConv2d",
           "ConvertLayoutNHWC", "FoldPadIntoConv", "SplitIntoSlices",
           "DropOverwrittenInits", "FuseAttention", "FoldChannelAffine", "FoldConstantsNumpy",
           "FoldRemainingConstants",
           "GuardIndices", "HalfInFloat32", "HoistTileConfigs", "LegalizeDynamicSlices",
           "LiftMinMaxCallTIR",
           "MaterializeEmptyConstants", "PaddedImageInProducer", "PaddedRowsInProducer",
           "RemoveIdentityBroadcast",
           "RemoveIdentityCast",
           "RemoveInferenceDropout",
           "SumOfStackToAdd", "WholeInputPooling", "WholeVectorPredicates"]
