"""Narrow types (int4/uint4, float8, float4) are carried in bytes (onnx_lowbit.py): casts to
and from them, Quantize/DequantizeLinear and blocked quantization match onnx's reference
(ml_dtypes) bit for bit, and the runtime takes and returns the user's ml_dtypes arrays."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import compile_and_load
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from aotc.compiler.frontends.onnx_graph import GraphInfo
from aotc.compiler.frontends.onnx_lowbit import CARRIED, carry_narrow_types


def _cast_model(src: int, dst: int, n: int, **attrs) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=dst, **attrs)], "cast",
        [helper.make_tensor_value_info("x", src, [n])],
        [helper.make_tensor_value_info("y", dst, [n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def _hard_floats() -> np.ndarray:
    """Ties, subnormals, overflow, signed zeros' neighbours, NaN and infinities."""
    rng = np.random.default_rng(0)
    special = [0.0, 1e-7, -1e-7, 0.0625, 0.25, 0.75, 1.0625, 1.125, 2.5, -3.5, 5.0, 7.0,
               240.0, 448.0, 464.0, 480.0, 500.0, 57344.0, 61440.0, 1e6, -1e6,
               np.inf, -np.inf, np.nan, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11]
    return np.concatenate([special, rng.standard_normal(200) * 8,
                           rng.uniform(-600, 600, 100)]).astype(np.float32)


FLOAT8_TYPES = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT4E2M1]


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dst", FLOAT8_TYPES)
def test_float_to_minifloat_rounds_like_the_reference(tmp_path, dst, saturate):
    x = _hard_floats()
    model = _cast_model(TensorProto.FLOAT, dst, len(x), saturate=saturate)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compile_and_load(model, tmp_path).run({"x": x})["y"]
    _same_bits(got, want)


@pytest.mark.parametrize("src", FLOAT8_TYPES)
def test_minifloat_to_float_is_exact(tmp_path, src):
    np_type = helper.tensor_dtype_to_np_dtype(src)
    width = 16 if src == TensorProto.FLOAT4E2M1 else 256
    x = np.arange(width, dtype=np.uint8).view(np_type)
    model = _cast_model(src, TensorProto.FLOAT16, width)
    got = compile_and_load(model, tmp_path).run({"x": x})["y"]
    want = x.astype(np.float16)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


@pytest.mark.parametrize("dst", [TensorProto.INT4, TensorProto.UINT4])
def test_int4_casts_wrap_and_round_trip(tmp_path, dst):
    x = np.array([-9, -8.7, -1, 0, 0.9, 7, 7.5, 8, 15, 16, 20, -17], np.float32)
    model = _cast_model(TensorProto.FLOAT, dst, len(x))
    got = compile_and_load(model, tmp_path, "to_int4").run({"x": x})["y"]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.int8), want.astype(np.int8))
    back = compile_and_load(_cast_model(dst, TensorProto.INT32, len(x)), tmp_path, "from_int4")
    np.testing.assert_array_equal(back.run({"x": got})["y"], want.astype(np.int32))


def test_no_narrow_type_reaches_tvm():
    model = _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN, 4)
    carried = carry_narrow_types(model, GraphInfo(model, 23))
    info = GraphInfo(carried, 23)
    names = {n for node in carried.graph.node for n in [*node.input, *node.output]}
    assert not any(info.elem_type(n) in CARRIED for n in names)
    assert carried.graph.output[0].type.tensor_type.elem_type == TensorProto.UINT8
    assert "Cast" in {n.op_type for n in carried.graph.node}  # the conversion, on bytes


def test_blocked_int4_dequantize_matches_the_reference(tmp_path):
    rng = np.random.default_rng(1)
    weights = rng.integers(-8, 8, (4, 6)).astype(ml_dtypes.int4)
    scale = rng.uniform(0.1, 1, (4, 2)).astype(np.float32)
    zero = rng.integers(-2, 2, (4, 2)).astype(ml_dtypes.int4)
    node = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"], axis=1, block_size=3)
    graph = helper.make_graph(
        [node], "dq", [helper.make_tensor_value_info("w", TensorProto.INT4, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
        initializer=[onnx.numpy_helper.from_array(scale, "s"),
                     onnx.numpy_helper.from_array(zero, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    want = ReferenceEvaluator(model).run(None, {"w": weights})[0]
    got = compile_and_load(model, tmp_path).run({"w": weights})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2", "uint2"])
def test_narrow_integer_inputs_reach_the_kernels_aligned(dtype):
    """int4/int2 inputs cross as an int8/uint8 copy the runtime makes: the kernels assume
    64-byte aligned arguments (runtime/buffers.py; an unaligned input once segfaulted), and
    numpy's own copy (astype) is only 16-byte aligned. Every size must give an aligned copy
    of the same values."""
    from aotc.runtime._tvm_runtime import tvm_ffi
    from aotc.runtime.exotic_dtypes import to_tvm
    narrow = getattr(ml_dtypes, dtype)
    low = int(ml_dtypes.iinfo(narrow).min)
    high = int(ml_dtypes.iinfo(narrow).max)
    rng = np.random.default_rng(0)
    for size in range(1, 80):
        values = rng.integers(low, high + 1, size=(size, 3))
        tensor = to_tvm(tvm_ffi(), values.astype(narrow))
        assert tensor.data_ptr() % 64 == 0, size
        np.testing.assert_array_equal(np.from_dlpack(tensor), values)
