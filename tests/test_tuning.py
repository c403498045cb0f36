"""The tuner end to end with a tiny budget (4 MetaSchedule trials on one matmul kernel): the
log gets a record with both the tuned and the default time, a second run resumes (nothing left
to tune), and compiling with the log matches onnxruntime; a record that beat the default is
replayed into the kernel (marked tuned), one that did not is left out, and so is one timed
against default rules other than compile's (they changed since); the run leaves nothing in
the temporary folder. A tuner killed with
SIGKILL mid-search leaves its checkpoints readable, and the next run starts from them."""

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import pytest
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import aotc
from aotc.schedules import log as tuning_log


def _matmul_relu(path):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 96])],
        [numpy_helper.from_array(rng.standard_normal((128, 96)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tune_resume_and_compile_with_the_log(tmp_path, monkeypatch):
    model = _matmul_relu(tmp_path / "mm.onnx")
    log = tmp_path / "mm.jsonl"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    report = aotc.tune(model, trials=4, log=log)
    assert list(scratch.iterdir()) == []  # no candidate's folder left behind
    monkeypatch.undo()
    assert [r.task for r in report.results] == ["fused_matmul_packed_relu"]
    assert report.results[0].tuned_seconds is not None  # at least one candidate ran
    # each point of the curve carries the schedule it measured (what bench/tuning.py re-times)
    assert len(report.results[0].curve_traces) == len(report.results[0].curve) >= 1
    records, warnings = tuning_log.read(log)
    assert warnings == [] and not records[0].final  # the first new best, checkpointed
    # its time is the median of the runner's 5 repeats, alone (runners.MedianRunner)
    assert len(records[0].trace[1]) == 1 and records[0].seconds == float(records[0].trace[1][0])
    finals = [r for r in records if r.final]
    assert len(finals) == 1
    record = finals[0]
    assert record.seconds > 0 and record.default_seconds > 0

    assert aotc.tune(model, trials=4, log=log).results == []  # resumed: nothing left

    compiled, _ = check_against_onnxruntime(model, tmp_path, rtol=1e-5, atol=1e-5,
                                            tuning_logs=[log])
    beat_default = record.beats_default
    expected = ["fused_matmul_packed_relu"] if beat_default else []
    assert compiled.metadata["tuned_kernels"] == expected
    share = compiled.metadata["tuning"]  # the log timed the kernel either way
    assert share["kernels_estimated"] == share["kernels"] == 1
    assert share["estimated_seconds"] == pytest.approx(
        record.seconds if beat_default else record.default_seconds)
    assert share["tuned_share"] == (1.0 if beat_default else 0.0)

    # the same schedule on a machine where it beat the default: replayed, still right
    forced = tmp_path / "forced.jsonl"
    tuning_log.append(forced, [dataclasses.replace(record, default_seconds=1.0)])
    (tmp_path / "forced").mkdir()
    compiled, _ = check_against_onnxruntime(model, tmp_path / "forced", rtol=1e-5, atol=1e-5,
                                            tuning_logs=[forced])
    assert compiled.metadata["tuned_kernels"] == ["fused_matmul_packed_relu"]
    assert compiled.metadata["tuning"]["tuned_share"] == 1.0

    # timed against other default rules than compile's (they changed since): not applied
    assert record.default_schedule  # the default schedule's key, recorded by the tuner
    stale = tmp_path / "stale.jsonl"
    tuning_log.append(stale, [dataclasses.replace(record, default_seconds=1.0,
                                                  default_schedule="0123456789abcdef")])
    (tmp_path / "stale").mkdir()
    compiled, _ = check_against_onnxruntime(model, tmp_path / "stale", rtol=1e-5, atol=1e-5,
                                            tuning_logs=[stale])
    assert compiled.metadata["tuned_kernels"] == []


def test_a_missing_log_is_named(tmp_path):
    import pytest

    from aotc.errors import CompileError
    with pytest.raises(CompileError, match="no-such.jsonl"):
        aotc.compile(_matmul_relu(tmp_path / "mm.onnx"), output=tmp_path / "mm.so",
                     tuning_logs=[tmp_path / "no-such.jsonl"])


def test_a_killed_tuner_keeps_its_checkpoints_and_resumes_from_them(tmp_path):
    model = _matmul_relu(tmp_path / "mm.onnx")
    log = tmp_path / "mm.jsonl"
    # a time budget: its first round is a probe of 4 candidates, so the first checkpoint comes
    # after 4 builds (a budget of 400 trials built a first batch of 64), and it never ends here
    tuner = subprocess.Popen(
        [sys.executable, "-c", "from aotc.cli import main; main()", "tune", str(model),
         "--time-budget", "10m", "--log", str(log)],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and tuner.poll() is None and \
                not (log.is_file() and log.stat().st_size):
            time.sleep(0.2)
    finally:
        os.killpg(tuner.pid, signal.SIGKILL)  # the tuner and its build and run workers
        tuner.wait()
    records, _ = tuning_log.read(log)
    assert records and not any(r.final for r in records)  # killed before the end

    said = []
    aotc.tune(model, trials=4, log=log, progress=said.append)
    assert any("resuming 1 tasks" in line for line in said)
    records, _ = tuning_log.read(log)
    assert records[-1].final
