"""The runtime takes the arrays users have (read-only, big-endian, numpy scalars, relative
paths), is safe to call from several threads, and keeps its memory flat over 10,000 runs."""

import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import aotc
from aotc.errors import InputMismatchError

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = pytest.mark.xdist_group("test_runtime_inputs")

X_SHAPE = (1, 8, 12, 12)


@pytest.fixture(scope="module")
def model(tiny_so):
    return aotc.load(tiny_so)


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal(X_SHAPE).astype(np.float32)


def test_read_only_input(model, x):
    """numpy refuses to DLPack-export read-only arrays: np.frombuffer, mmap'd np.load and onnx's
    numpy_helper all give them; 98 node-suite cases failed on this."""
    frozen = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(X_SHAPE)
    assert not frozen.flags.writeable
    np.testing.assert_array_equal(model(x=frozen)["y"], model(x=x)["y"])


def test_memory_mapped_input(model, x, tmp_path):
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    np.testing.assert_array_equal(model(x=mapped)["y"], model(x=x)["y"])


def test_big_endian_input(model, x):
    swapped = x.astype(">f4")
    np.testing.assert_array_equal(model(x=swapped)["y"], model(x=x)["y"])


def test_wrong_dtype_still_refused_whatever_the_byte_order(model, x):
    with pytest.raises(InputMismatchError, match="expected dtype float32, got float64"):
        model(x=x.astype(">f8"))


@pytest.mark.in_process
def test_relative_path_loads(tiny_so, x, monkeypatch):
    monkeypatch.chdir(tiny_so.parent)
    np.testing.assert_array_equal(aotc.load(tiny_so.name)(x=x)["y"], aotc.load(tiny_so)(x=x)["y"])


def test_outputs_survive_later_runs(model, x):
    first = model(x=x)["y"]
    kept = first.copy()
    model(x=-x)
    np.testing.assert_array_equal(first, kept)


@pytest.fixture(scope="module")
def scalar_model(tmp_path_factory):
    """y = s * v: a rank-0 input next to a vector."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["s", "v"], ["y"])], "scale",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    folder = tmp_path_factory.mktemp("scalar")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              folder / "scale.onnx")
    aotc.compile(folder / "scale.onnx", output=folder / "scale.so")
    return aotc.load(folder / "scale.so")


@pytest.mark.parametrize("scalar", [np.float32(3.0), 3.0, np.array(3.0, np.float32)])
def test_scalars_for_rank0_inputs(scalar_model, scalar):
    v = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(scalar_model(s=scalar, v=v)["y"], 3.0 * v)


def test_python_number_for_a_tensor_input_is_refused(scalar_model):
    with pytest.raises(InputMismatchError, match="input 'v': expected a numpy array, got float"):
        scalar_model(s=1.0, v=1.0)


def test_calls_from_several_threads_agree(model):
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(X_SHAPE).astype(np.float32) for _ in range(4)]
    expected = [model(x=a)["y"] for a in inputs]
    failures = []

    def work(k):
        for _ in range(50):
            got = model(x=inputs[k])["y"]
            if not np.array_equal(got, expected[k]):
                failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        line = next(row for row in status if row.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_memory_is_flat_over_10000_runs(model, x):
    for _ in range(500):  # warm the pooled allocator and numpy's caches
        model(x=x)
    before = _rss_mb()
    for _ in range(10_000):
        model(x=x)
    grown = _rss_mb() - before
    print(f"RSS before {before:.1f} MB, growth over 10,000 runs {grown:.2f} MB")
    assert grown < 8, f"RSS grew {grown:.1f} MB over 10,000 runs"


def test_rebuilt_library_at_the_same_path_is_reloaded(tmp_path):
    """dlopen hands back the library already loaded from a path: a model rebuilt to the same
    path used to run the old code."""
    def build(op):
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], op,
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                  tmp_path / "m.onnx")
        aotc.compile(tmp_path / "m.onnx", output=tmp_path / "m.so")
        return aotc.load(tmp_path / "m.so")

    x = np.array([-1, 2, -3, 4], np.float32)
    first = build("Relu")
    np.testing.assert_array_equal(first(x=x)["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(build("Neg")(x=x)["y"], -x)
    np.testing.assert_array_equal(first(x=x)["y"], np.maximum(x, 0))


def test_bfloat16_inputs_and_outputs(tmp_path):
    """numpy's DLPack export refuses bfloat16 (ml_dtypes); the runtime passes it as uint16 and
    re-labels it (runtime/exotic_dtypes.py)."""
    import ml_dtypes
    nodes = [helper.make_node("Cast", ["x"], ["as_bf16"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["b"], ["as_f32"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                        helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [4])],
        [helper.make_tensor_value_info("as_bf16", TensorProto.BFLOAT16, [4]),
         helper.make_tensor_value_info("as_f32", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "bf16.onnx")
    aotc.compile(tmp_path / "bf16.onnx", output=tmp_path / "bf16.so")
    x = np.array([1.5, -2.25, 3.0, 1e-3], np.float32)
    got = aotc.load(tmp_path / "bf16.so")(x=x, b=x.astype(ml_dtypes.bfloat16))
    assert got["as_bf16"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got["as_bf16"], x.astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(got["as_f32"], x.astype(ml_dtypes.bfloat16).astype(np.float32))
    # numpy has no dtype named bfloat16 to compare with (np.dtype(None) is float64: a check
    # against "no dtype" must not pass float64)
    with pytest.raises(InputMismatchError, match="expected dtype bfloat16, got float64"):
        aotc.load(tmp_path / "bf16.so")(x=x, b=x.astype(np.float64))


def test_empty_inputs_keep_ml_dtypes(tmp_path):
    """Empty inputs are re-strided for TVM; that once turned float8 into numpy's '<f1'."""
    import ml_dtypes
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "empty_f8",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT8E4M3FN, [2, 0])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT8E4M3FN, [2, 0])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)])
    aotc.compile(model, target="x86", output=tmp_path / "empty.so", input_shapes={"x": (2, 0)})
    got = aotc.load(tmp_path / "empty.so")(x=np.zeros((2, 0), ml_dtypes.float8_e4m3fn))["y"]
    assert got.dtype == ml_dtypes.float8_e4m3fn and got.shape == (2, 0)
