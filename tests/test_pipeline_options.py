"""CompileOptions through the pipeline: opt levels, disabled passes, --explain, --dump-ir."""

import pytest
from click.testing import CliRunner
from helpers import check_against_onnxruntime
from onnx_builders import tiny_cnn

import aotc
from aotc.cli import main
from aotc.errors import CompileError
from aotc.targets import x86


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_every_opt_level_matches_onnxruntime(level, tiny_onnx, tmp_path):
    model, _ = check_against_onnxruntime(tiny_onnx, tmp_path,
                                         options=aotc.CompileOptions(opt_level=level))
    assert model.metadata["opt_level"] == level


def test_opt_level_0_runs_no_fusion_and_no_schedules(tmp_path):
    meta = aotc.compile(tiny_cnn(), output=tmp_path / "o0.so",
                        options=aotc.CompileOptions(opt_level=0, explain=True))
    ran = {r["pass"] for r in meta["explain"]["passes"]}
    skipped = {s["pass"] for s in meta["explain"]["skipped"]}
    assert {"FuseOps", "ApplyRulesSafely", "ConvertLayoutNHWC", "VectorMath"} <= skipped
    assert {"GuardIndices", "LegalizeOps", "HalfInFloat32"} <= ran
    assert ran.isdisjoint(skipped)


def test_explain_records_what_each_pass_changed(tmp_path):
    meta = aotc.compile(tiny_cnn(), output=tmp_path / "t.so",
                        options=aotc.CompileOptions(explain=True))
    records = {r["pass"]: r for r in meta["explain"]["passes"]}
    assert records["LegalizeOps"]["kernels_after"] > records["LegalizeOps"]["kernels_before"]
    fuse = records["FuseTIR"]
    assert fuse["kernels_after"] < fuse["kernels_before"]  # fused kernels replace the parts
    assert "call_tir" in fuse["changed"]
    assert "time per phase" in meta["explain"]["table"]
    assert "explain" not in aotc.load(tmp_path / "t.so").metadata  # not embedded


def test_disabled_pass_is_skipped_and_named_in_metadata(tmp_path):
    meta = aotc.compile(tiny_cnn(), output=tmp_path / "t.so",
                        options=aotc.CompileOptions(disabled_passes=("FuseOps",), explain=True))
    assert "FuseOps" not in {r["pass"] for r in meta["explain"]["passes"]}
    assert meta["disabled_passes"] == ["FuseOps"]


@pytest.mark.parametrize("name, message", [
    ("GuardIndices", "this pass cannot be disabled"), ("NoSuchPass",
                                                       "no such pass; passes that can be")])
def test_bad_disable_pass_is_refused_by_name(name, message, tmp_path):
    with pytest.raises(CompileError, match=f"--disable-pass {name}: {message}"):
        aotc.compile(tiny_cnn(), output=tmp_path / "t.so",
                     options=aotc.CompileOptions(disabled_passes=(name,)))


def test_opt_level_out_of_range_is_refused():
    with pytest.raises(ValueError, match="opt_level must be one of"):
        aotc.CompileOptions(opt_level=4)


def test_dump_ir_writes_the_ir_after_every_pass(tiny_onnx, tmp_path):
    result = CliRunner().invoke(main, ["compile", str(tiny_onnx), "-o", str(tmp_path / "t.so"),
                                       "--dump-ir", str(tmp_path / "ir"), "--explain"])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert files[0] == "00_imported.py"
    assert any(f.endswith("_lower_FuseTIR.py") for f in files)
    assert len(files) > 15
    assert "ConvertLayoutNHWC" in result.output and "kernels" in result.output


def test_memory_report_plans_below_the_unplanned_sum(tmp_path):
    """Activations of a chain of layers reuse storage: the planned total is below the sum."""
    meta = aotc.compile(tiny_cnn(), output=tmp_path / "t.so",
                        options=aotc.CompileOptions(explain=True))
    memory = meta["memory"]
    assert 0 < memory["planned_bytes"] <= memory["unplanned_bytes"]
    # the conv output alone: 1x16x12x12 float32
    assert memory["unplanned_bytes"] >= 16 * 12 * 12 * 4
    assert "activation memory: planned" in meta["explain"]["table"]


def test_dump_ir_keeps_each_bucket_entry_apart(tmp_path):
    """A bucket entry runs the pipeline again: its IR goes to a subfolder, not over main's."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    path = tmp_path / "rows.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    aotc.compile(path, output=tmp_path / "rows.so", options=aotc.CompileOptions(
        dump_ir=tmp_path / "ir", buckets={"n": (8,)}))
    main_files = {p.name for p in (tmp_path / "ir").iterdir() if p.is_file()}
    entries = [p for p in (tmp_path / "ir").iterdir() if p.is_dir()]
    assert [p.name for p in entries] == ["main_n8"]
    assert {p.name for p in entries[0].iterdir()} == main_files
    assert '"n"' in (tmp_path / "ir" / "00_imported.py").read_text()  # main's symbolic dim
    assert '"n"' not in (entries[0] / "00_imported.py").read_text()


@pytest.mark.skipif(not x86._BF16_FLAGS <= x86.cpu_flags(),
                    reason="--precision bf16 needs AVX512-BF16 on this CPU")
def test_dump_ir_of_a_bf16_build_is_its_own(tiny_onnx, tmp_path):
    """--precision bf16 also builds a float32 twin for its accuracy report: the dump is the
    bf16 library's IR, not the twin's written over it."""
    result = CliRunner().invoke(main, ["compile", str(tiny_onnx), "-o", str(tmp_path / "t.so"),
                                       "--precision", "bf16", "--dump-ir", str(tmp_path / "ir")])
    assert result.exit_code == 0, result.output
    [converted] = (tmp_path / "ir").glob("*_quantize_ConvertBF16.py")
    assert "conv2d_bf16" in converted.read_text()
