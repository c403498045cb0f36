"""Default (untuned) CPU schedules, written as dlight schedule rules.

Why our own: TVM 0.27's CPU pipeline leaves conv2d and matmul as naive loop nests, two orders of
magnitude slower than onnxruntime. These rules give every kernel a parallel, vectorized,
register-blocked schedule without any measurement, so that a compile is fast and deterministic.

Rules are tried in order; the first that accepts a PrimFunc schedules it:
  0. ``Attention``: the one-kernel attention FuseAttention makes (cpu_attention.py).
     ``AttentionPacks``: the kernels that pack the bf16 attention kernel's Kt and V
     (cpu_attention.py).
  1. ``WinogradTransform``: the input and output transforms of the Winograd 3x3 convs
     (cpu_winograd.py; their matmul is a packed contraction, PackedDot's).
  2. ``PackedDot``: the packed int8 (quantized) and bf16 (--precision bf16) conv/matmul kernels,
  tensorized onto the
     target's dot-product instruction (cpu_dot.py); on targets without one they fall through.
  3. ``Contraction``: one multiply-accumulate reduction (conv2d in NHWC/HWIO, matmul, batch
     matmul) with injective producers and epilogues. Register-blocks the two innermost output
     axes, vectorizes the innermost (which is contiguous in the output and in the weight).
  4. ``RowWise``: softmax / layer norm style row reductions over the innermost axis, parallel
     over rows, reductions vectorized (cpu_rows.py); ``RowReduction`` (dlight's CPU
     ``Reduction``, guarded) takes the ones it refuses.
  5. ``Generic``: anything else (pooling, means, elementwise, layout changes): every block is
     parallelized over its outer spatial loops and vectorized on its innermost loop when that
     loop is spatial.
Assumes the conv layout pass ran first (NHWC data, HWIO weights): then the output channel axis
is innermost in both the output and the weight, which is what ``Contraction`` vectorizes.
"""

from __future__ import annotations

from .cpu_attention import Attention, AttentionPacks
from .cpu_blocks import schedule_injective_block, touches_bool, vector_lanes
from .cpu_contraction import Contraction
from .cpu_dot import PackedDot
from .cpu_generic import Generic, RowReduction, inline_injective_chains
from .cpu_rows import RowWise
from .cpu_winograd import WinogradTransform

RULES = (Attention(), AttentionPacks(), WinogradTransform(), PackedDot(), Contraction(), RowWise(),
         RowReduction(), Generic())

__all__ = ["Attention", "AttentionPacks", "Contraction", "PackedDot", "RowWise", "Generic", "RULES",
           "RowReduction",
           "WinogradTransform",
           "inline_injective_chains",
           "schedule_injective_block", "touches_bool", "vector_lanes"]
