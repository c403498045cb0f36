"""The polynomial exp, erf, tanh and sigmoid (compiler/default_schedules/vector_math.py) hold
their stated accuracy against float64 on a million points (at most 6 ulp, relative error under
4e-7 where the result is not tiny) and keep the special values: inf, -inf and NaN; exp
underflows to 0 below about -88. The compiled model runs in a fresh process, as users run it."""

import math

import numpy as np
import onnx
import pytest
from helpers import compile_and_load
from onnx import TensorProto, helper
from relax_helpers import one_input_module

OPS = {"Exp": np.exp, "Tanh": np.tanh,
       "Erf": np.vectorize(math.erf, otypes=[np.float64]),
       "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}


def _model(path, n: int):
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], [op.lower()]) for op in OPS], "transcendentals",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info(op.lower(), TensorProto.FLOAT, [n]) for op in OPS])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of float32's spacing at ``want``."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def test_polynomials_stay_within_six_ulp_of_float64(tmp_path):
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-87.0, 88.0, 500_000), rng.normal(0.0, 5.0, 500_000)])
    x = x.astype(np.float32)
    model = compile_and_load(_model(tmp_path / "t.onnx", x.size), tmp_path)
    outputs = model.run({"x": x})
    x64 = x.astype(np.float64)
    for op, reference in OPS.items():
        want = reference(x64)
        got = outputs[op.lower()]
        meaningful = np.abs(want) > 1e-30  # below that float32 is denormal: absolute error only
        assert _ulps(got, want)[meaningful].max() <= 6.0, op
        relative = np.abs(got - want)[meaningful] / np.abs(want)[meaningful]
        assert relative.max() < 4e-7, op


def test_special_values_are_kept(tmp_path):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, -100.0, 100.0, -88.5], np.float32)
    model = compile_and_load(_model(tmp_path / "s.onnx", x.size), tmp_path)
    out = model.run({"x": x})
    np.testing.assert_array_equal(out["exp"][:2], [np.inf, 0.0])
    np.testing.assert_array_equal(out["tanh"][:2], [1.0, -1.0])
    np.testing.assert_array_equal(out["erf"][:2], [1.0, -1.0])
    np.testing.assert_array_equal(out["sigmoid"][:2], [1.0, 0.0])
    for name in OPS:
        assert np.isnan(out[name.lower()][2]), f"{name}(NaN) must be NaN"
    assert out["exp"][3] == 1.0 and out["tanh"][3] == 0.0 and out["erf"][3] == 0.0
    assert out["sigmoid"][3] == 0.5
    assert out["exp"][5] == 0.0 and out["exp"][7] >= 0.0  # underflow to 0, never negative
    np.testing.assert_array_equal([out["tanh"][6], out["erf"][6], out["sigmoid"][6]], [1, 1, 1])


def test_softmax_divides_once_a_row():
    """The float32 softmax legalization divides once a row (1 / sum, a [rows, 1] buffer) and
    multiplies every element by it: no division per element, which the one-kernel attention
    did for every score."""
    import tvm
    from tvm import relax, s_tir

    from aotc.compiler.default_schedules.vector_math import LEGALIZE_MAP

    before = one_input_module((12, 128), lambda _bb, x: relax.op.nn.softmax(x, axis=-1))
    mod = relax.transform.LegalizeOps(LEGALIZE_MAP)(before)
    func = next(f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    sch = s_tir.Schedule(func)
    dividing = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        store = sch.get(block).body
        if " / " in str(store.value):
            dividing.append([int(d) for d in store.buffer.shape])
    assert dividing == [[12, 1]]


@pytest.mark.parametrize("fused", [False, True], ids=["x86-64", "host-isa"])
def test_softmax_exp_within_two_ulp_on_its_domain(fused):
    """softmax's exp (arguments x - max(x) <= 0): relative error under 2e-7 where the result
    is a normal float, exactly 1 at 0, exactly 0 below -88 and at -inf (padded keys and masks
    weigh nothing), NaN kept. Built for plain x86-64 (no FMA: every product rounded) and for
    the host's ISA level (fused multiply-adds where it has them)."""
    from relax_helpers import run_main

    from aotc.compiler.default_schedules.vector_math import softmax_exp
    from aotc.targets.x86 import cpu_flags, detect_isa

    rng = np.random.default_rng(1)
    x = np.concatenate([np.linspace(-87.3, 0.0, 1_000_000), -np.abs(rng.normal(0.0, 5.0, 200_000)),
                        [0.0, -0.0, -88.0, -100.0, -3.4e38, -np.inf, np.nan]]).astype(np.float32)
    module = one_input_module(x.shape, lambda bb, v: bb.call_te(softmax_exp, v))
    mcpu = detect_isa(cpu_flags())[1] if fused else "x86-64"
    got = run_main(module, x, mcpu=mcpu).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    normal = want >= np.finfo(np.float32).tiny
    assert (np.abs(got - want)[normal] / want[normal]).max() < 2e-7
    assert got[~normal & ~np.isnan(x)].max() < np.finfo(np.float32).tiny  # no garbage below
    np.testing.assert_array_equal(got[-7:-1], [1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert np.isnan(got[-1])


def test_softmax_keeps_masks_and_nan_rows(tmp_path):
    """A compiled float32 Softmax (fresh process) against float64 on rows with -inf masks, a
    fully masked row and a NaN row; its largest entries come out at exp(0) = 1 exactly."""
    rows = np.random.default_rng(2).normal(0.0, 8.0, (64, 100)).astype(np.float32)
    rows[1, 10:] = -np.inf
    rows[2, :] = -np.inf
    rows[3, 7] = np.nan
    rows[4, :] = -100.0
    rows[4, 50] = 0.0
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(rows.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(rows.shape))])
    path = tmp_path / "softmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    got = compile_and_load(path, tmp_path).run({"x": rows})["y"]
    with np.errstate(invalid="ignore"):
        # the differences as float32 computes them (their rounding, up to 2e-6 of a small
        # probability, is the input's, not the kernel's)
        shifted = (rows - rows.max(axis=-1, keepdims=True)).astype(np.float64)
        e = np.exp(shifted)
        want = e / e.sum(axis=-1, keepdims=True)
    finite = ~np.isnan(want).any(axis=-1)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-30)
    assert np.isnan(got[2]).all() and np.isnan(got[3]).all()
    assert (got[1, 10:] == 0.0).all()
    assert got[4, 50] == 1.0 and (np.delete(got[4], 50) == 0.0).all()
