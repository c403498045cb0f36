"""SumOfStackToAdd: ``sum(stack((a, b, ...), axis=0), axis=[0])`` becomes ``a + b + ...``.

Why: TVM 0.27's ONNX importer lowers the variadic ``Sum`` op (every residual join in the
Caffe2-era ResNet-50 of onnx's light zoo) to a 5-D stack plus a reduction. ConvertLayout cannot
map the 5-D stack ("Invalid SLayout: can't find S in source layout ABCDE"), so the whole model
stayed NCHW, several times slower than in NHWC
(docs/design/measurements.md#compilerpassesimporter_fixessum_of_stack_to_addpy). Plain adds
are layout-agnostic and fuse into the conv epilogue.

Where: with the other importer clean-ups, before ``ConvertLayoutNHWC``. Only the exact
stack-then-sum-over-the-stacked-axis form is rewritten; any other sum or stack is left alone.
"""

from __future__ import annotations

import functools

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..pattern_rewrite import rewrite_module


def _int_list(value) -> list[int] | None:
    return None if value is None else [int(v) for v in value]


def _rewrite(_orig, matches, stack_pat, sum_pat):
    stack, total = matches[stack_pat], matches[sum_pat]
    tensors = stack.args[0]
    if (int(stack.attrs.axis) != 0 or _int_list(total.attrs.axis) != [0]
            or bool(total.attrs.keepdims) or not isinstance(tensors, relax.Tuple)):
        return _orig
    return functools.reduce(relax.op.add, tensors.fields)


@tvm.transform.module_pass(opt_level=0, name="SumOfStackToAdd")
class SumOfStackToAdd:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        stack_pat = is_op("relax.stack")(wildcard())
        sum_pat = is_op("relax.sum")(stack_pat)
        rewriter = functools.partial(_rewrite, stack_pat=stack_pat, sum_pat=sum_pat)
        return rewrite_module(mod, sum_pat, rewriter)
