"""aotc compile --quantize int8 through the CLI on an ONNX model, checked against onnxruntime's
float32 output; and the errors a user gets for missing or ill-shaped calibration samples or an
unknown --skip-layers name."""

import json

import numpy as np
import onnxruntime as ort
from click.testing import CliRunner

import aotc
from aotc.cli import main

RNG = np.random.default_rng(0)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _calibration(path, shape=(1, 8, 12, 12), count=16):
    np.savez(path, x=RNG.standard_normal((count, *shape)).astype(np.float32))
    return path


def test_compile_int8_cli_against_onnxruntime(tiny_onnx, tmp_path):
    calib = _calibration(tmp_path / "calib.npz")
    out = tmp_path / "tiny8.so"
    result = invoke("compile", tiny_onnx, "-o", out, "--quantize", "int8", "--calib", calib,
                    "--calib-method", "minmax")
    assert result.exit_code == 0, result.output
    assert "int8 accuracy on 16 calibration samples (activation ranges: minmax calibration)" \
        in result.output
    assert "2 int8 layers" in result.output
    report = json.loads((tmp_path / "tiny8.so.quant.json").read_text())
    assert report["method"] == "minmax" and report["outputs"][0]["cosine"] > 0.999
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(str(tiny_onnx)).run(None, {"x": x})[0]
    got = aotc.load(out).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())


def test_keep_first_last_and_skip(tiny_onnx, tmp_path):
    calib = _calibration(tmp_path / "calib.npz")
    result = invoke("compile", tiny_onnx, "-o", tmp_path / "a.so", "--quantize", "int8",
                    "--calib", calib, "--skip-layers", "matmul_0")
    assert result.exit_code == 0, result.output
    assert "1 int8 layers; float32: matmul_0 (--skip-layers)" in result.output
    result = invoke("compile", tiny_onnx, "-o", tmp_path / "b.so", "--quantize", "int8",
                    "--calib", calib, "--skip-layers", "conv9")
    assert result.exit_code == 1
    assert "no quantizable layer named conv9" in result.output and "conv2d_0" in result.output


def test_calibration_errors_name_the_problem(tiny_onnx, tmp_path):
    result = invoke("compile", tiny_onnx, "-o", tmp_path / "a.so", "--quantize", "int8")
    assert result.exit_code == 2 and "needs --calib" in result.output
    bad = _calibration(tmp_path / "bad.npz", shape=(1, 3, 12, 12), count=2)
    result = invoke("compile", tiny_onnx, "-o", tmp_path / "a.so", "--quantize", "int8",
                    "--calib", bad)
    assert result.exit_code == 1
    assert "input 'x' expects shape [1, 8, 12, 12]" in result.output and "[2, 1, 3, 12, 12]" \
        in result.output
    np.savez(tmp_path / "other.npz", y=np.zeros((1, 8, 12, 12), np.float32))
    result = invoke("compile", tiny_onnx, "-o", tmp_path / "a.so", "--quantize", "int8",
                    "--calib", tmp_path / "other.npz")
    assert result.exit_code == 1 and "no array for input(s) x" in result.output


def test_int8_dynamic_needs_no_samples(tiny_onnx, tmp_path):
    """int8-dynamic without --calib: the matmul is int8 with its range measured per run, the
    conv stays float32 (named in the report), the report runs on random inputs."""
    result = invoke("compile", tiny_onnx, "-o", tmp_path / "d.so", "--quantize", "int8-dynamic")
    assert result.exit_code == 0, result.output
    assert "int8-dynamic accuracy on 4 random inputs (activation ranges: per run for matmuls)" \
        in result.output
    assert "1 int8 layers; float32: conv2d_0 (no calibration samples)" in result.output
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32) * 10
    want = ort.InferenceSession(str(tiny_onnx)).run(None, {"x": x})[0]
    got = aotc.load(tmp_path / "d.so").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())


def test_int8_for_arm_calibrates_and_reports_on_this_host(tiny_onnx, tmp_path):
    """An aarch64 .so cannot run here: calibration and the report use an x86 build of the same
    int8 model, and the report says so."""
    calib = _calibration(tmp_path / "calib.npz")
    meta = aotc.compile(tiny_onnx, "arm", tmp_path / "arm8.so",
                        quantize=aotc.QuantizeOptions(str(calib)))
    report = meta["quantization_report"]
    assert report["evaluated_build"] == "x86 build of the same int8 model"
    assert report["outputs"][0]["cosine"] > 0.999 and meta["target"]["arch"] == "aarch64"
