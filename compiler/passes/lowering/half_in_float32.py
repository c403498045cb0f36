"""HalfInFloat32: float16/bfloat16 ops that accumulate or approximate compute in float32, and
only their results are rounded back.

Why: TVM lowers a float16 ``matmul`` with a float16 accumulator, and softmax, norms, means and
``exp`` in float16 too. Rounding every partial sum to 11 (float16) or 8 (bfloat16) bits drifts:
the ONNX node suite's float16 Attention cases came out 1 ulp past onnx's tolerance while
onnxruntime, which computes half-precision ops in float32 on CPUs, matched. A user who exports
a model in float16 expects float16 storage, not float16 partial sums.

How: each listed op whose tensor arguments are float16/bfloat16 gets float32 casts of those
arguments, an ``out_dtype`` of float32 where the op has one, and a cast of its result back to
the original dtype. Elementwise ``add``/``multiply``/... are left alone: one IEEE operation
rounded once gives the same answer in either precision. After legalization the casts fuse into
the kernels around them.

Where: before ``LegalizeOps`` (it rewrites Relax ops, not TIR).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...relax_walk import mutate_functions

HALF = ("float16", "bfloat16")

# Ops that sum many terms (matmul, convolutions, pooling, reductions, norms, softmax) or
# evaluate a transcendental function whose float16 lowering is less exact than float32's.
UPCAST_OPS = frozenset("relax." + name for name in (
    "matmul", "einsum", "sum", "mean", "prod", "variance", "std", "cumsum", "cumprod",
    "exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "sqrt", "rsqrt", "power",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "image.resize2d",
    "nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose",
    "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.group_norm", "nn.rms_norm",
    "nn.instance_norm", "nn.batch_norm", "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d",
    "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d",
    "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.attention", "nn.cross_entropy_with_logits",
    "nn.nll_loss",
))


def _half_dtype(expr: relax.Expr) -> str | None:
    ty = expr.ty
    if isinstance(ty, relax.TensorType) and ty.dtype in HALF:
        return ty.dtype
    return None


def with_float32_out(attrs):
    """A copy of ``attrs`` with out_dtype float32 (None when the op has no out_dtype)."""
    if attrs is None or not hasattr(attrs, "out_dtype"):
        return attrs
    inherited = set(dir(tvm.ir.Attrs))
    fields = {name: getattr(attrs, name) for name in dir(attrs)
              if not name.startswith("_") and name not in inherited}
    fields["out_dtype"] = "float32"
    return tvm.ir.make_node(f"relax.attrs.{type(attrs).__name__}", **fields)


@relax.expr_functor.mutator
class _Upcaster(relax.PyExprMutator):
    """Rewrites listed half-precision calls; counts them for tests and --explain."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in UPCAST_OPS:
            return call
        result = _half_dtype(call)
        if result is None or not any(_half_dtype(arg) for arg in call.args):
            return call
        args = [relax.op.astype(arg, "float32") if _half_dtype(arg) else arg
                for arg in call.args]
        wide = self.builder_.normalize(
            relax.Call(call.op, args, with_float32_out(call.attrs), call.ty_args))
        self.rewritten += 1
        return relax.op.astype(wide, result) if wide.ty.dtype != result else wide


@tvm.transform.module_pass(opt_level=0, name="HalfInFloat32")
class HalfInFloat32:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _Upcaster(mod))
