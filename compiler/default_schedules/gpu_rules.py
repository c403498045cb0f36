"""Default schedules for GPU targets: dlight's GPU rules, tried in order on every kernel.

Matmul (shared-memory tiled GEMM), GEMV (batch-1 matrix-vector), Reduction and
GeneralReduction (softmax, norms), and Fallback, which binds any other loop nest to blocks and
threads: no kernel reaches codegen unscheduled, which TVM's CUDA codegen would reject (a kernel
without thread bindings does not compile for the GPU)."""

from __future__ import annotations

from tvm.s_tir import dlight as dl

RULES = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
         dl.gpu.Fallback())
