"""Device farms on loopback, with real TVM RPC trackers and servers (no mocks): status, clear
errors within seconds, remote tuning applied by compile, a server killed or frozen mid-run,
and no process left behind."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

import aotc
from aotc import farm_daemons as farm_procs
from aotc.cli import main
from aotc.farm_daemons import LoopbackFarm, free_port
from aotc.schedules import log as tuning_log
from aotc.schedules.farm_target import Farm, FarmError, servers_of, summary

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = pytest.mark.xdist_group("test_farm")


def group_alive(pgid: int, wait_s: float = 5.0) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies waiting for init to reap them
    do not count), polled for ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and _running_in(pid, pgid)]
        if not alive or time.monotonic() > deadline:
            return bool(alive)
        time.sleep(0.2)


def _running_in(pid: str, pgid: int) -> bool:
    try:
        fields = open(f"/proc/{pid}/stat", encoding="utf-8").read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid


@pytest.fixture(scope="module")
def two_kernels(tmp_path_factory):
    """The model the tuning runs here tune: two kernels (each task costs remote reference
    timings; tiny_onnx's six made each of these tests take about a minute)."""
    import onnx
    from onnx_builders import two_matmuls
    path = tmp_path_factory.mktemp("farm") / "two_matmuls.onnx"
    onnx.save(two_matmuls(), path)
    return path


@pytest.fixture(scope="module")
def loopback():
    farm = LoopbackFarm(servers=2)
    yield farm
    groups = farm.groups()
    farm.stop()
    assert not any(group_alive(g) for g in groups), "a farm process (or its worker) leaked"


def test_status_lists_servers_per_key(loopback):
    result = CliRunner().invoke(main, ["farm", "status", loopback.address])
    assert result.exit_code == 0, result.output
    assert "2 servers" in result.output
    assert [line.split()[:2] for line in result.output.splitlines() if line.startswith("x86")] \
        == [["x86", "2"]]


def test_tracker_down_or_unknown_key_fail_within_seconds(tiny_onnx, loopback, tmp_path):
    start = time.monotonic()
    with pytest.raises(FarmError, match="not reachable"):
        aotc.tune(tiny_onnx, "x86", tmp_path / "t.jsonl", trials=8, rpc=f"127.0.0.1:{free_port()}",
                  key="x86")
    with pytest.raises(FarmError, match="no server with key 'rk3588'.*keys there: x86"):
        aotc.tune(tiny_onnx, "x86", tmp_path / "t.jsonl", trials=8, rpc=loopback.address,
                  key="rk3588")
    assert time.monotonic() - start < 10
    status = CliRunner().invoke(main, ["farm", "status", f"127.0.0.1:{free_port()}"])
    assert status.exit_code == 1 and "not reachable" in status.output
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.slow
def test_remote_tuning_is_applied_by_compile_and_matches(two_kernels, loopback, tmp_path):
    import onnxruntime as ort
    log = tmp_path / "farm.jsonl"
    report = aotc.tune(two_kernels, "x86", log, trials=12, rpc=loopback.address, key="x86")
    assert report.trials >= 12 and report.results
    records, warnings = tuning_log.read(log)
    finals = [r for r in records if r.final]
    assert not warnings and finals and all(r.seconds > 0 for r in finals)
    meta = aotc.compile(two_kernels, output=tmp_path / "m.so", tuning_logs=[log],
                        shipped_logs=False)
    kept = [r for r in report.results if r.kept]
    assert len(meta["tuned_kernels"]) == len(kept)
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    want = ort.InferenceSession(str(two_kernels)).run(None, {"x": x})[0]
    np.testing.assert_allclose(aotc.load(tmp_path / "m.so")(x=x)["y"], want, rtol=1e-4, atol=1e-4)


def _tune_in_thread(model, farm: LoopbackFarm, log, trials: int, timeout: float):
    lines, outcome = [], {}

    def work():
        try:
            outcome["report"] = aotc.tune(model, "x86", log, trials=trials, rpc=farm.address,
                                          key="x86", rpc_timeout=timeout, progress=lines.append)
        except Exception as err:
            outcome["error"] = err
    thread = threading.Thread(target=work)
    thread.start()
    return thread, lines, outcome


def _wait_for_trials(lines, thread, count: int = 2) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and thread.is_alive():
        if sum(line.startswith("trial ") for line in lines) >= count:
            return
        time.sleep(0.2)


@pytest.mark.slow
def test_a_server_killed_mid_run_loses_no_record(two_kernels, tmp_path):
    farm = LoopbackFarm(servers=2)
    groups = farm.groups()
    try:
        thread, lines, outcome = _tune_in_thread(two_kernels, farm, tmp_path / "k.jsonl", 12, 20)
        _wait_for_trials(lines, thread)
        farm.servers[0].signal(signal.SIGKILL)
        thread.join(600)
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
        records, warnings = tuning_log.read(tmp_path / "k.jsonl")
        assert records and not warnings  # every line written whole
        failed = [line for line in lines if line.startswith("trial ")][-1]
        assert " 0 failed" in failed, failed  # the killed server's candidates ran elsewhere
        assert len(outcome["report"].results) == 2  # every task got its reference measured
    finally:
        farm.stop()
    assert not any(group_alive(g) for g in groups)


@pytest.mark.slow
def test_a_frozen_server_is_left_behind(two_kernels, tmp_path):
    farm = LoopbackFarm(servers=2)
    groups = farm.groups()
    try:
        farm.servers[0].signal(signal.SIGSTOP)  # registered, but answers nothing
        thread, lines, outcome = _tune_in_thread(two_kernels, farm, tmp_path / "f.jsonl", 8, 8)
        thread.join(600)
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
        assert len(outcome["report"].results) == 2
    finally:
        farm.servers[0].signal(signal.SIGCONT)
        farm.stop()
    assert not any(group_alive(g) for g in groups)


needs_arm = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
    reason="an emulated ARM board needs g++-aarch64-linux-gnu and qemu-user")


@needs_arm
@pytest.mark.slow
def test_arm_tuning_through_an_emulated_board(two_kernels, tmp_path):
    """aotc's C++ RPC server, cross-compiled, under qemu-aarch64: candidates cross-linked here,
    timed there; the log applied by compile for ARM, run under qemu, matches onnxruntime.
    (Emulated timings say nothing about ARM speed: only the mechanics are checked.)"""
    from test_cpp_runtime import check_arm_under_qemu
    port = free_port()
    tracker = farm_procs.start_tracker(port=port)
    board = None
    try:
        farm_procs.wait_for(lambda: summary("127.0.0.1", port), 30, "tracker", tracker)
        board = farm_procs.start_cpp_server(f"127.0.0.1:{port}", "rk3588", arch="aarch64",
                                            port=free_port())
        farm_procs.wait_for(lambda: servers_of(Farm("127.0.0.1", port, "rk3588")), 60,
                            "emulated board", board)
        log = tmp_path / "arm.jsonl"
        report = aotc.tune(two_kernels, "arm", log, trials=12, rpc=f"127.0.0.1:{port}",
                           key="rk3588")
        assert report.trials >= 12 and len(report.results) == 2
        assert sum(r.tuned_seconds is not None for r in report.results) >= 1
    finally:
        for process in filter(None, (board, tracker)):
            process.stop()
    meta = check_arm_under_qemu(two_kernels, tmp_path, tuning_logs=[log], shipped_logs=False)
    assert len(meta["tuned_kernels"]) == sum(r.kept for r in report.results)


@pytest.mark.slow
def test_a_candidate_that_hangs_on_the_device_times_out_and_the_next_one_runs():
    import tvm
    from test_tuning_space import TARGET, _matmul
    from tvm.s_tir import meta_schedule as ms
    from tvm.tirx import script as T

    from aotc.schedules.builder import PersistentBuilder
    from aotc.schedules.runners import FarmMeasurement

    @T.prim_func
    def hang(a: T.Buffer((4,), "float32")):
        T.func_attr({"global_symbol": "main"})
        while a[0] > T.float32(-1e30):  # random data only grows: never ends
            a[0] = a[0] + T.float32(1)

    farm = LoopbackFarm(servers=1)
    measurement = FarmMeasurement(Farm("127.0.0.1", farm.port, "x86", session_timeout_s=8))
    builder = PersistentBuilder(120, **measurement.builder_options())
    try:
        funcs = [hang, _matmul()]
        built = builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": f}), TARGET)
                               for f in funcs])
        assert all(b.error_msg is None and b.artifact_path.endswith(".so") for b in built)
        futures = measurement.runner().run([
            ms.runner.RunnerInput(b.artifact_path, "cpu", ms.arg_info.ArgInfo.from_prim_func(f))
            for b, f in zip(built, funcs)])
        hung, fine = [future.result() for future in futures]
        # timed out twice: on the device, then once more (a frozen device is not the kernel's
        # fault, so a timeout is retried once); the next candidate ran all the same
        assert "Timeout" in hung.error_msg and fine.error_msg is None and fine.run_secs
    finally:
        builder.shutdown()
        groups = farm.groups()
        farm.stop()
    assert not any(group_alive(g) for g in groups)
