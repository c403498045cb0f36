"""INT8 post-training quantization: calibrate (observe activation ranges on samples), annotate
(quantize/dequantize marks), realize (int8 kernels with int32 accumulation, prepacked weights).
The quantize phase of the pipeline runs AnnotateInt8 then RealizeInt8 when the compile options
carry calibrated ranges (with ResidualFromQuantized between them: residual adds read the
uint8 copy an int8 conv already made), then DepthwiseByteInput (float32 depthwise convs
whose input is clipped to [0, hi] read it as uint8), DepthwiseHalfInput (the other float32
depthwise convs between int8 ones read float16) and FoldIntoQuantize (each quantize absorbs
the clamps and the affine scale and offset in front of it); then ConvertBF16 with
``--precision bf16`` (bf16.py, then ResidualFromBF16 and MaxPoolBF16: activations travel as
bfloat16 where only bf16 convs read them) and ConvertFP16 with ``--precision fp16`` (fp16.py)."""

from __future__ import annotations

from aotc.options import CompileOptions

from ..contraction_sites import Site, main_sites
from ..passes.layout import winograd_runs
from ..passes.step import Step
from .annotate import AnnotateInt8
from .bf16 import ConvertBF16
from .bf16_attention import AttentionBF16
from .depthwise_byte_input import DepthwiseByteInput
from .depthwise_half_input import DepthwiseHalfInput
from .fold_into_quantize import FoldIntoQuantize
from .fp16 import ConvertFP16
from .max_pool_bf16 import MaxPoolBF16
from .realize import RealizeInt8
from .residual_from_bf16 import ResidualFromBF16
from .residual_from_quantized import ResidualFromQuantized


def steps(options: CompileOptions, amx: bool = False) -> list[Step]:
    """Both passes always listed (so that --disable-pass knows them); without calibrated
    ranges annotate does nothing, and realize then only finds the quantize/dequantize pairs an
    imported model carries. ``--disable-pass RealizeInt8`` leaves the annotated model, which
    computes the int8 result in float32: the way to tell a kernel bug from quantization
    error. ConvertBF16 (``--precision bf16``) and ConvertFP16 (``--precision fp16``) take the
    float32 contractions int8 left; ``amx``: the target has AMX-BF16 (ConvertBF16 pads
    matmul rows for its tiles)."""
    return [Step(AnnotateInt8(options.int8_ranges or {}), 0),
            Step(ResidualFromQuantized(), 1),
            Step(RealizeInt8(), 0),
            Step(DepthwiseByteInput(bool(options.int8_ranges)), 1),
            Step(DepthwiseHalfInput(bool(options.int8_ranges)), 1),
            Step(FoldIntoQuantize(), 1),
            Step(ConvertBF16(options.precision == "bf16", winograd=winograd_runs(options),
                             amx=amx), 0),
            Step(ResidualFromBF16(), 1),
            Step(MaxPoolBF16(), 1),
            Step(AttentionBF16(options.precision == "bf16"), 1),
            Step(ConvertFP16(options.precision == "fp16"), 0)]


__all__ = ["AnnotateInt8", "AttentionBF16", "ConvertBF16", "ConvertFP16", "DepthwiseByteInput",
           "DepthwiseHalfInput", "FoldIntoQuantize", "MaxPoolBF16", "RealizeInt8",
           "ResidualFromBF16", "ResidualFromQuantized", "Site", "main_sites", "steps"]
