"""power by a constant 0.5, 1, 2, 3 or 4 is legalized to a square root or multiplications
(no libm pow call per lane); other exponents keep TVM's pow; both match onnxruntime."""

import numpy as np
import onnx
import pytest
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, te

from aotc.compiler.default_schedules.vector_math import LEGALIZE_MAP


def _kernel(build) -> tvm.tirx.PrimFunc:
    """The one kernel of a module whose main is ``build(bb, x)`` on a float32 [3, 4] ``x``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(build(bb, x))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps(LEGALIZE_MAP)(bb.get())
    kernels = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 1
    return kernels[0]


def _legalized(exponent: float) -> tvm.tirx.PrimFunc:
    return _kernel(lambda bb, x: relax.op.power(x, relax.const(exponent, "float32")))


def _expected(elementwise) -> tvm.tirx.PrimFunc:
    """The kernel of ``elementwise`` applied to each element, written directly in TE."""
    return _kernel(lambda bb, x: bb.call_te(
        lambda t: te.compute(t.shape, lambda *i: elementwise(t(*i)), name="power"), x))


@pytest.mark.parametrize("exponent,elementwise", [(3.0, lambda v: v * v * v),
                                                  (2.0, lambda v: v * v),
                                                  (0.5, te.sqrt)])
def test_small_exponents_need_no_pow(exponent, elementwise):
    tvm.ir.assert_structural_equal(_legalized(exponent), _expected(elementwise))


def test_other_exponents_keep_pow():
    tvm.ir.assert_structural_equal(
        _legalized(2.5), _expected(lambda v: te.power(v, tvm.tirx.const(2.5, "float32"))))


@pytest.mark.parametrize("exponent,shape", [(3.0, []), (2.0, [1]), (0.5, []), (2.5, []),
                                            (3.0, [4])])
def test_power_matches_onnxruntime(exponent, shape, tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])], "pow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(np.full(shape, exponent, np.float32), "e")])
    path = tmp_path / "pow.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x = np.abs(x) + 0.1 if exponent % 1 else x
    check_against_onnxruntime(path, tmp_path, feed={"x": x}, rtol=1e-6, atol=1e-6)
