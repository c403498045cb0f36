"""Relax ops to TIR kernels, fused: index guards and float32 accumulation first (correctness),
then TVM's dispatch, legalization (with our exact min/max reductions, NaN-propagating
maximum/minimum/relu and vector math) and fusion."""

from __future__ import annotations

from tvm import relax

from aotc.options import CompileOptions

from ...default_schedules.exact_minmax import LEGALIZE_MAP as EXACT_MINMAX
from ...default_schedules.nan_minmax import LEGALIZE_MAP as NAN_MINMAX
from ...default_schedules.reciprocal_divide import LEGALIZE_MAP as RECIPROCAL_DIVIDE
from ...default_schedules.reciprocal_quantize import LEGALIZE_MAP as RECIPROCAL_QUANTIZE
from ...default_schedules.vector_math import LEGALIZE_MAP as VECTOR_MATH
from ...default_schedules.widening_conv import LEGALIZE_MAP as WIDENING_CONV
from ..step import REQUIRED, Step, enabled
from .guard_indices import GuardIndices
from .half_in_float32 import HalfInFloat32
from .hoisted_tile_configs import HoistTileConfigs
from .materialize_empty_constants import MaterializeEmptyConstants
from .ordered_shape_stores import OrderShapeFuncStores
from .overwritten_inits import DropOverwrittenInits
from .padded_image_in_producer import PaddedImageInProducer
from .padded_rows_in_producer import PaddedRowsInProducer
from .scalar_kernels_apart import ScalarKernelsApart
from .self_contained_kernels import SelfContainedKernels
from .sorted_scalar_params import SortScalarParams
from .whole_vector_predicates import WholeVectorPredicates

# Not a pass of its own: the float32 exp/erf/tanh/sigmoid entries of LegalizeOps' map.
VECTOR_MATH_NAME, VECTOR_MATH_LEVEL = "VectorMath", 1


def steps(options: CompileOptions) -> list[Step]:
    legalize_map = {**EXACT_MINMAX, **NAN_MINMAX, **WIDENING_CONV, **RECIPROCAL_QUANTIZE,
                    **RECIPROCAL_DIVIDE}
    if enabled(VECTOR_MATH_NAME, VECTOR_MATH_LEVEL, options):
        legalize_map.update(VECTOR_MATH)
    return [Step(GuardIndices(), REQUIRED, "out-of-range indices must not touch memory"),
            Step(HalfInFloat32(), REQUIRED, "float16/bfloat16 accumulation loses accuracy"),
            # sort, top-k, cumsum/cumprod and sampling to TOPI kernels, as TVM's CPU pipeline
            # does before legalization (without: "CodeGenVM cannot emit").
            Step(relax.backend.DispatchSampling(), REQUIRED, "codegen cannot emit sampling ops"),
            Step(SelfContainedKernels(), REQUIRED, "TVM's sort, top-k and nonzero need TVM's "
                 "compiler at run time"),
            Step(relax.backend.DispatchSortScan(), REQUIRED, "codegen cannot emit sort/scan ops"),
            Step(relax.transform.LegalizeOps(legalize_map), REQUIRED, "ops become kernels here"),
            Step(SortScalarParams(), REQUIRED, "LegalizeOps orders a kernel's dims differently "
                 "in each process: the same model would build different libraries"),
            Step(relax.transform.AnnotateTIROpPattern(), REQUIRED, "fusion reads the patterns"),
            Step(ScalarKernelsApart(), REQUIRED, "FuseTIR fails on shape kernels fused with "
                 "their consumers"),
            Step(relax.transform.FoldConstant(), 1),
            Step(relax.transform.FuseOps(), 1),
            Step(relax.transform.FuseTIR(), 1),
            Step(SortScalarParams(), REQUIRED, "FuseTIR orders a fused kernel's dims "
                 "differently in each process, as LegalizeOps does")]


__all__ = ["DropOverwrittenInits", "GuardIndices", "HalfInFloat32", "HoistTileConfigs",
           "MaterializeEmptyConstants",
           "OrderShapeFuncStores", "PaddedImageInProducer", "PaddedRowsInProducer",
           "ScalarKernelsApart",
           "SelfContainedKernels", "SortScalarParams", "WholeVectorPredicates",
           "VECTOR_MATH_LEVEL",
           "VECTOR_MATH_NAME", "steps"]
