"""passes/pattern_rewrite.py: a rewrite with opaque constants gives the module the plain
rewrite gives (the constants bound back, the same objects), and a rewrite that matches nothing
gives back the function itself. That it no longer reads the weights is a timing
(docs/design/measurements.md, "Pattern rewrites and constants"); the test checks what it
computes."""

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R

from aotc.compiler.passes.pattern_rewrite import OPAQUE_BYTES, _rewrite_opaque, rewrite_module

WEIGHT = np.arange(32 * 64, dtype="float32").reshape(32, 64)  # 8 KiB: over OPAQUE_BYTES
BIAS = np.ones((64,), "float32")  # under it: stays a constant during the rewrite


def _before():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 32), "float32")):
            with R.dataflow():
                y = R.matmul(x, R.const(WEIGHT))
                z = R.add(y, R.const(BIAS))
                flat = R.reshape(z, (128,))
                back = R.reshape(flat, (4, 32))
                R.output(back)
            return back
    return Before


def _expected():
    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 32), "float32")):
            with R.dataflow():
                y = R.matmul(x, R.const(WEIGHT))
                z = R.add(y, R.const(BIAS))
                back = R.reshape(z, (4, 32))
                R.output(back)
            return back
    return Expected


def _collapse(mod, opaque: bool):
    x = wildcard()
    pattern = is_op("relax.reshape")(is_op("relax.reshape")(x, wildcard()), wildcard())
    return rewrite_module(mod, pattern, lambda e, m: relax.op.reshape(m[x], e.args[1]),
                          opaque_constants=opaque)


def _constants(mod) -> list:
    found = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst) else None)
    return found


def test_opaque_constants_rewrite_as_the_plain_rewrite_does():
    assert WEIGHT.nbytes >= OPAQUE_BYTES > BIAS.nbytes
    before = _before()
    opaque, plain = _collapse(before, True), _collapse(before, False)
    tvm.ir.assert_structural_equal(opaque, _expected())
    tvm.ir.assert_structural_equal(opaque, plain)
    assert len(opaque["main"].params) == 1  # the stand-in parameters are bound back
    originals = _constants(before)
    assert all(any(c.same_as(o) for o in originals) for c in _constants(opaque))
    x = np.random.default_rng(0).standard_normal((2, 32)).astype("float32")
    vm = relax.VirtualMachine(relax.build(opaque, tvm.target.Target({"kind": "llvm"})),
                              tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(),
                               (x @ WEIGHT + BIAS).reshape(4, 32), rtol=1e-5)


def test_nothing_to_rewrite_keeps_the_function():
    expected = _expected()
    tvm.ir.assert_structural_equal(_collapse(expected, True), expected)
    x = wildcard()
    pattern = is_op("relax.reshape")(is_op("relax.reshape")(x, wildcard()), wildcard())
    func = expected["main"]
    assert _rewrite_opaque(pattern, lambda e, m: e, func).same_as(func)
