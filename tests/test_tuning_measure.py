"""Measurement parts of the tuner: the persistent builder turns a candidate that cannot build
into a failed result and goes on building the next; the time budget's rounds fit the
measured rate; durations parse as the CLI documents; a schedule whose results differ from the
default one's is caught before it could be logged; builds are reported to the progress line
(a round builds every task's batch before any measurement comes back)."""

import os

import click
import pytest
import tvm
from test_tuning_space import _matmul
from tvm.s_tir import meta_schedule as ms

from aotc.cli import DURATION
from aotc.schedules.builder import PersistentBuilder
from aotc.schedules.tune import Budget, _round_trials
from aotc.targets import resolve

# kernels are built and run here: the host's own target
TARGET = tvm.target.Target(resolve("x86").tvm_target)

# LLVM has no backend for this triple: code generation fails inside the worker
UNBUILDABLE = tvm.target.Target({"kind": "llvm", "mtriple": "nonsense-unknown-none"})


def test_a_failed_build_is_a_result_and_the_next_one_builds():
    builder = PersistentBuilder(timeout_sec=120)
    try:
        results = builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": _matmul()}),
                                                         UNBUILDABLE),
                                 ms.builder.BuilderInput(tvm.IRModule({"main": _matmul()}),
                                                         TARGET)])
    finally:
        builder.shutdown()
    assert results[0].artifact_path is None and "build failed" in results[0].error_msg
    assert results[1].error_msg is None and results[1].artifact_path.endswith(".tar")


def test_shutdown_removes_every_candidate_s_folder():
    builder = PersistentBuilder(timeout_sec=120)
    try:
        built = builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": _matmul()}),
                                                       TARGET) for _ in range(2)])
        folders = [os.path.dirname(b.artifact_path) for b in built]
        assert all(os.path.dirname(f) == builder.scratch and os.path.isdir(f) for f in folders)
    finally:
        builder.shutdown()
    assert not os.path.exists(builder.scratch)


def test_tvm_pool_workers_start_without_torch_and_work():
    """The tuner's builds and timings run in TVM's pool workers; started by aotc, those import
    TVM without torch (aotc/popen_worker.py), also where the parent process has torch."""
    import torch  # noqa: F401  (the parent has torch: the worker still must not)
    from tvm.support.popen_pool import PopenPoolExecutor

    from aotc.popen_worker import start_tvm_workers_here

    def worker_facts() -> dict:  # local: cloudpickle sends it by value
        import sys

        import numpy as np
        import tvm
        with open("/proc/self/maps") as maps:
            libtorch = "libtorch" in maps.read()
        a = tvm.runtime.tensor(np.arange(3, dtype="float32"))
        return {"torch": "torch" in sys.modules or libtorch,
                "main": sys.modules["__main__"].__spec__.name, "tensor": a.numpy().tolist()}

    start_tvm_workers_here()
    pool = PopenPoolExecutor(max_workers=1, timeout=60)
    try:
        facts = pool.submit(worker_facts).result()
    finally:
        pool.shutdown()
    assert facts == {"torch": False, "main": "aotc.popen_worker", "tensor": [0.0, 1.0, 2.0]}
    builder = PersistentBuilder(timeout_sec=120)  # the builder's pool: a real build there
    try:
        built = builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": _matmul()}),
                                                       TARGET)])
        assert built[0].error_msg is None, built[0].error_msg
        assert builder.pool.submit(worker_facts).result()["torch"] is False
    finally:
        builder.shutdown()


def test_time_budget_rounds_follow_the_measured_rate():
    assert _round_trials(Budget(trials=100), 40, 3, 10.0) == 60
    budget = Budget(seconds=60.0)
    assert _round_trials(budget, 0, 3, 1.0) == 12          # first round: a short probe
    assert _round_trials(budget, 20, 3, 20.0) == 40        # 1 trial/s, 40 s left
    assert _round_trials(budget, 20, 3, 61.0) == 0
    assert _round_trials(Budget(trials=30, seconds=60.0), 20, 3, 20.0) == 10
    with pytest.raises(ValueError):
        Budget()


def test_durations():
    assert [DURATION.convert(v, None, None) for v in ("90", "90s", "30m", "2h")] == \
        [90, 90, 1800, 7200]
    for bad in ("soon", "-5m", "0"):
        with pytest.raises(click.exceptions.BadParameter):
            DURATION.convert(bad, None, None)


def test_same_values_catches_a_kernel_that_computes_something_else():
    from test_tuning_space import _spaces
    from tvm import te

    from aotc.schedules.measure import kernel_outputs, same_values
    from aotc.schedules.space import default_rules_space

    matmul = _matmul()
    scheduled = _spaces(matmul, default_rules_space(TARGET))[0].mod["main"]
    want = kernel_outputs(matmul, TARGET)
    assert same_values(kernel_outputs(scheduled, TARGET), want)
    a, b = te.placeholder((64, 128), name="a"), te.placeholder((128, 96), name="b")
    k = te.reduce_axis((0, 127), "k")  # one term short
    short = te.create_prim_func([a, b, te.compute(
        (64, 96), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))])
    assert not same_values(kernel_outputs(short, TARGET), want)


def test_builds_are_reported_on_the_progress_line_before_any_measurement(monkeypatch):
    from aotc.schedules import progress as progress_module
    said = []
    monkeypatch.setattr(progress_module, "BUILT_EVERY_S", 0.0)
    line = progress_module.ProgressLine(["mm"], [1.0], said.append, [1e-3])
    builder = PersistentBuilder(timeout_sec=120, on_built=line.built)
    try:
        for _ in range(2):
            builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": _matmul()}), TARGET)
                           for _ in range(2)])
    finally:
        builder.shutdown()
    assert line.built_count == 4
    assert said[-1].startswith("built 4 candidates, 0 measured"), said
    monkeypatch.setattr(progress_module, "BUILT_EVERY_S", 3600.0)
    line.built(1)   # rate-limited: no new line within BUILT_EVERY_S of the last
    assert len(said) == 2 and line.built_count == 5
