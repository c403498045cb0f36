"""A symbolic batch stays symbolic (checked at several sizes against onnxruntime);
--input-shape fixes it; bad overrides name the problem."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_builders import tiny_cnn

import aotc
from aotc.errors import AotcError, InputMismatchError

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = pytest.mark.xdist_group("test_dynamic_shapes")


@pytest.fixture(scope="module")
def dynamic_onnx(tmp_path_factory):
    model = tiny_cnn()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path_factory.mktemp("dyn") / "tiny_dyn.onnx"
    onnx.save(model, path)
    return path


def test_symbolic_batch_runs_at_several_sizes(dynamic_onnx, tmp_path):
    meta = aotc.compile(dynamic_onnx, output=tmp_path / "dyn.so")
    assert meta["signature"]["inputs"][0]["shape"] == ["batch", 8, 12, 12]
    assert meta["unscheduled_kernels"] == []
    model = aotc.load(tmp_path / "dyn.so")
    session = ort.InferenceSession(str(dynamic_onnx), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 12, 12)).astype(np.float32)
        np.testing.assert_allclose(model(x=x)["y"], session.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-5)


def test_input_shape_fixes_the_batch(dynamic_onnx, tmp_path):
    meta = aotc.compile(dynamic_onnx, output=tmp_path / "fixed.so",
                        input_shapes={"x": (2, 8, 12, 12)})
    assert meta["signature"]["inputs"][0]["shape"] == [2, 8, 12, 12]
    model = aotc.load(tmp_path / "fixed.so")
    assert model(x=np.zeros((2, 8, 12, 12), np.float32))["y"].shape == (2, 10)
    with pytest.raises(InputMismatchError, match=r"expected shape \[2, 8, 12, 12\], got \[3"):
        model(x=np.zeros((3, 8, 12, 12), np.float32))


@pytest.mark.parametrize("shapes, message", [
    ({"nope": (1, 8, 12, 12)}, r"unknown input\(s\) \['nope'\]"),
    ({"x": (1, 8, 12)}, "has rank 4"),
    ({"x": (1, 9, 12, 12)}, "has fixed shape"),
])
def test_bad_input_shape_overrides_are_refused(dynamic_onnx, tmp_path, shapes, message):
    with pytest.raises(AotcError, match=message):
        aotc.compile(dynamic_onnx, output=tmp_path / "bad.so", input_shapes=shapes)
