"""The CLI through click's runner, and once as a real subprocess."""

import json
import subprocess
import sys

import numpy as np
from click.testing import CliRunner
from onnx_builders import single_op

from aotc.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_targets_lists_host_and_fixed():
    result = invoke("targets")
    assert result.exit_code == 0
    assert "x86 " in result.output and "x86-avx2" in result.output


def test_inspect_prints_op_table_and_signature(tiny_onnx):
    result = invoke("inspect", tiny_onnx)
    assert result.exit_code == 0, result.output
    assert "Conv" in result.output and "yes" in result.output
    assert "x: float32[1,8,12,12]" in result.output


def test_inspect_predicts_the_frontend_failures(tmp_path):
    """Every op of this model is one aotc has a converter for; inspect used to say only that.
    It now runs the frontend as compile does and gives the reason compile would fail."""
    import onnx
    cases = {"unique": (single_op("Unique"), "Unique has no aotc kernel")}
    for name, (model, reason) in cases.items():
        onnx.save(model, tmp_path / f"{name}.onnx")
        result = invoke("inspect", tmp_path / f"{name}.onnx")
        assert result.exit_code == 0, result.output
        assert "frontend: compile would FAIL" in result.output and reason in result.output


def test_compile_run_bench(tiny_onnx, tmp_path):
    out = tmp_path / "t.so"
    result = invoke("compile", tiny_onnx, "--target", "x86", "-o", out)
    assert result.exit_code == 0, result.output
    x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke("run", out, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                    tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "o" / "y.npy").shape == (1, 10)
    result = invoke("bench", out, "--compare-onnx", tiny_onnx, "--runs", 5, "--json",
                    tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    assert "p99" in result.output and "onnxruntime" in result.output
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["ratio_vs_onnxruntime"] > 0 and report["max_abs_diff"] < 1e-4


def test_usage_error_exits_2(tiny_onnx):
    assert invoke("compile", tiny_onnx).exit_code == 2  # -o missing
    assert invoke("nonsense").exit_code == 2


def test_failure_exits_1_with_one_line(tmp_path):
    import onnx
    onnx.save(single_op("Relu", domain="evil.corp"), tmp_path / "evil.onnx")
    result = invoke("compile", tmp_path / "evil.onnx", "-o", tmp_path / "e.so")
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]  # progress lines come first on stderr
    assert last.startswith("error: ") and "evil.corp" in last
    assert "Traceback" not in result.output
    bad_target = invoke("compile", tmp_path / "evil.onnx", "-t", "z80", "-o", tmp_path / "e.so")
    assert bad_target.exit_code == 1 and "unknown target 'z80'" in bad_target.output


def test_real_subprocess_compile_and_run(tiny_onnx, tmp_path):
    out = tmp_path / "sub.so"
    aotc = [sys.executable, "-m", "aotc.cli"]
    subprocess.run([*aotc, "compile", str(tiny_onnx), "-o", str(out)], check=True)
    run = subprocess.run([*aotc, "run", str(out)], capture_output=True, text=True, check=True)
    assert run.stdout.startswith("y: float32[1, 10]")
    bad = subprocess.run([*aotc, "run", str(tmp_path / "missing.so")], capture_output=True)
    assert bad.returncode == 2


def test_variable_length_options_are_parsed_or_refused_by_name(tiny_onnx, tmp_path):
    from aotc.compiler.frontends.shapes import parse_bind, parse_buckets, parse_input_range
    assert parse_input_range("seq=1:512") == ("seq", (1, 512))
    assert parse_buckets("seq=64,16,32,16") == ("seq", (16, 32, 64))
    assert parse_bind("sr=16000") == ("sr", [16000.0])
    for flag, value, named in [("--input-range", "seq=8:4", "expected DIM=MIN:MAX"),
                               ("--buckets", "seq=0,8", "expected DIM=S1,S2"),
                               ("--bind", "sr=fast", "expected NAME=V"),
                               ("--buckets", "seq=8", "--buckets names ['seq']")]:
        result = invoke("compile", tiny_onnx, "-o", tmp_path / "t.so", flag, value)
        assert result.exit_code == 1 and named in result.output, result.output
