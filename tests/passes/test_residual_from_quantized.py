"""ResidualFromQuantized on a residual block: y = relu(conv_a(x)); out = conv_b(y) + y.

After AnnotateInt8, y is quantized for conv_b and the add still reads the float32 y. After the
pass the add reads the dequantize of that uint8 copy, so y has one user (its quantize) and
FuseOps can put the quantize into conv_a's kernel. Realized, the float32 y is gone from
between the kernels. Numbers: within half a quantization step of y of the annotated model (the
residual now carries y's rounding to uint8). Values outside the calibrated range are clipped on
the residual path too, as in onnxruntime's QDQ models; this test's range covers y."""

import numpy as np
import tvm
from relax_helpers import run_main
from tvm import relax

from aotc.compiler.quantize import AnnotateInt8, RealizeInt8, ResidualFromQuantized, main_sites

RNG = np.random.default_rng(0)
RANGE = (-16.0, 16.0)  # covers y here: the residual is rounded, not clipped


def _conv(x, ic, oc):
    weight = relax.const((RNG.standard_normal((3, 3, ic, oc)) * 0.2).astype(np.float32))
    return relax.op.nn.conv2d(x, weight, padding=[1, 1], data_layout="NHWC",
                              kernel_layout="HWIO")


def _module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(_conv(x, 16, 16)))
            z = bb.emit(_conv(y, 16, 16))
            out = bb.emit_output(relax.op.add(z, y))
        bb.emit_func_output(out)
    return bb.get()


def _annotated():
    before = _module()
    return AnnotateInt8({site.name: RANGE for site in main_sites(before)})(before)


def _add_input_ops(mod):
    """The ops that make the add's two inputs."""
    values = relax.analysis.get_var2val(mod["main"])
    adds = [v for v in values.values() if isinstance(v, relax.Call)
            and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.add"]
    (add,) = [a for a in adds if all(isinstance(arg, relax.Var) for arg in a.args)]
    return sorted(values[arg].op.name for arg in add.args)


def test_structure():
    annotated = _annotated()
    assert _add_input_ops(annotated) == ["relax.nn.conv2d", "relax.nn.relu"]
    rerouted = ResidualFromQuantized()(annotated)
    assert _add_input_ops(rerouted) == ["relax.dequantize", "relax.nn.conv2d"]


def test_nothing_to_reroute_without_quantized_sites():
    before = _module()
    tvm.ir.assert_structural_equal(ResidualFromQuantized()(before), before)


def test_numbers_within_half_a_step_of_the_residual():
    annotated = _annotated()
    x = RNG.standard_normal((1, 8, 8, 16)).astype(np.float32)
    want = run_main(annotated, x)
    got = run_main(RealizeInt8()(ResidualFromQuantized()(annotated)), x)
    step = (RANGE[1] - RANGE[0]) / 255
    np.testing.assert_allclose(got, want, rtol=0, atol=0.5 * step + 1e-4)
    assert not np.allclose(got, want, rtol=0, atol=1e-6)  # the residual did change
