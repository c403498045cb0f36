"""RemoveIdentityCast: a cast to the dtype a value already has goes, a real cast stays; with
it gone, attention exported with transformers' cast of the probabilities (GPT-2) is fused."""

import numpy as np
import tvm
from relax_helpers import attention_functions, attention_module, main_ops
from tvm import relax
from tvm.script import relax as R

from aotc.compiler.passes import FuseAttention, RemoveIdentityCast


def _module():
    @R.function
    def main(x: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            p = R.nn.softmax(x, axis=-1)
            same = R.astype(p, "float32")
            half = R.astype(same, "float16")
            R.output(half)
        return half

    return tvm.IRModule({"main": main})


def _run(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_identity_cast_is_removed_and_real_one_kept():
    @R.function
    def expected(x: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            p = R.nn.softmax(x, axis=-1)
            half = R.astype(p, "float16")
            R.output(half)
        return half

    after = RemoveIdentityCast()(_module())
    tvm.ir.assert_structural_equal(after["main"], expected.with_attr("global_symbol", "main"))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    assert np.array_equal(_run(after, x), _run(_module(), x))


def test_attention_with_a_cast_of_its_probabilities_is_fused_once_the_cast_is_gone():
    before = attention_module(scale=("multiply", 0.25), mask=False, cast=True)
    assert attention_functions(FuseAttention()(before)) == []
    after = FuseAttention()(RemoveIdentityCast()(before))
    assert len(attention_functions(after)) == 1 and "relax.nn.softmax" not in main_ops(after)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(np.float32)
              for p in before["main"].params]
    np.testing.assert_allclose(_run(after, *arrays), _run(before, *arrays), rtol=1e-5,
                               atol=1e-6)


def test_chained_identity_casts_of_other_dtypes_all_go():
    """bool and int16 casts to their own dtype, one cast of a cast (rewritten again after the
    first goes): torch's bool() and short() of tensors that already are."""
    @R.function
    def before(x: R.Tensor((4,), "bool"), y: R.Tensor((4,), "int16")):
        with R.dataflow():
            a = R.astype(x, "bool")
            b = R.astype(y, "int16")
            c = R.astype(b, "int16")
            out = (a, c)
            R.output(out)
        return out

    @R.function
    def expected(x: R.Tensor((4,), "bool"), y: R.Tensor((4,), "int16")):
        with R.dataflow():
            out = (x, y)
            R.output(out)
        return out

    after = RemoveIdentityCast()(
        tvm.IRModule({"main": before.with_attr("global_symbol", "main")}))
    tvm.ir.assert_structural_equal(after["main"], expected.with_attr("global_symbol", "main"))
