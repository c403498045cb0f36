"""Bad input gets a clear error naming the problem, raised before any TVM work."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_builders import single_op

import aotc
from aotc.errors import ModelLoadError, UnsupportedModelError


def test_unknown_domain_is_refused_even_for_a_standard_op_name(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"Relu \(domain evil\.corp.*the_node"):
        aotc.compile(single_op("Relu", domain="evil.corp"), output=tmp_path / "m.so")


def test_every_unsupported_op_is_listed_at_once(tmp_path):
    model = single_op("Relu")
    model.graph.node.append(helper.make_node("FancyOp", ["y"], ["z"], name="fancy"))
    model.graph.node.append(helper.make_node("OtherOp", ["z"], ["w"], name="other"))
    with pytest.raises(UnsupportedModelError) as err:
        aotc.compile(model, output=tmp_path / "m.so")
    assert "FancyOp" in str(err.value) and "OtherOp" in str(err.value)
    assert "2 unsupported" in str(err.value)


def test_opset_newer_than_the_converter_knows_is_refused(tmp_path):
    with pytest.raises(UnsupportedModelError, match="opset 99 is newer than the newest onnx"):
        aotc.compile(single_op("Relu", opset=99), output=tmp_path / "m.so")


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(ModelLoadError, match="no such model file"):
        aotc.compile(tmp_path / "nope.onnx", output=tmp_path / "m.so")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xffnot a protobuf" * 10)
    with pytest.raises(ModelLoadError, match="junk.onnx"):
        aotc.compile(junk, output=tmp_path / "m.so")


def _model_with_external_weight(location: str) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    entry = weight.external_data.add()
    entry.key, entry.value = "location", location
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.ones(6, np.float32).tobytes())
    onnx.save(_model_with_external_weight(location), folder / "m.onnx")
    with pytest.raises(ModelLoadError, match="outside the model's folder"):
        aotc.compile(folder / "m.onnx", output=tmp_path / "m.so")


def test_external_data_inside_the_folder_compiles(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.full(6, 2.0, np.float32).tobytes())
    onnx.save(_model_with_external_weight("w.bin"), tmp_path / "m.onnx")
    aotc.compile(tmp_path / "m.onnx", output=tmp_path / "m.so")
    out = aotc.load(tmp_path / "m.so")(x=np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(out["y"], np.full((2, 3), 2.0, np.float32))


def test_codegen_errors_name_the_problem_and_the_call():
    """TVM's VM codegen ends its message with the offending IR; the user saw only
    'R.where(alloc26, ...)' as the reason."""
    from aotc.errors import meaningful_line
    err = RuntimeError("CodeGenVM cannot emit this Relax operator directly. Run the appropriate "
                       "lowering pass.\nOffending call:\nR.where(alloc26, alloc19, c)")
    line = meaningful_line(err)
    assert line.startswith("CodeGenVM cannot emit") and "R.where(alloc26" in line


def test_a_failing_pass_names_its_phase(monkeypatch, tmp_path):
    """Every compile failure used to say "compile phase 'optimize' failed"."""
    import tvm
    from onnx_builders import tiny_cnn

    from aotc.compiler import pipeline
    from aotc.errors import CompileError

    @tvm.transform.module_pass(opt_level=0, name="Exploding")
    class Exploding:
        def transform_module(self, mod, _ctx):
            raise ValueError("boom in layout")

    original = pipeline.phases

    def phases(spec, options=None):
        return [(name, passes + [Exploding()] if name == "layout" else passes)
                for name, passes in original(spec, options)]
    monkeypatch.setattr(pipeline, "phases", phases)
    with pytest.raises(CompileError, match="compile phase 'layout' failed: .*boom in layout"):
        aotc.compile(tiny_cnn(), target="x86", output=tmp_path / "x.so")
