"""`aotc farm tracker|server` behave like daemons, with real processes on loopback: neither
loads torch; SIGTERM stops them and their children within seconds and leaves no zombie (the
handler used to wait inside the wait it interrupted: a deadlock, every stop ended in
SIGKILL); a server started
before its tracker registers once the tracker comes up, and again after a tracker restart;
an unreachable tracker is reported in under 5 s, before TVM loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from test_farm import group_alive

from aotc.farm_daemons import free_port, start_tracker, wait_for
from aotc.schedules.farm_target import Farm, servers_of, summary

AOTC = [sys.executable, "-m", "aotc.cli"]


def _daemon(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*AOTC, "farm", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _registered(farm: Farm) -> int:
    try:
        return servers_of(farm)
    except Exception:
        return 0


def _stop_within(process: subprocess.Popen, seconds: float) -> float:
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    return time.monotonic() - start


@pytest.fixture
def cleanup():
    groups: list[int] = []
    yield groups
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _registered_server(port: int, cleanup: list) -> subprocess.Popen:
    """`aotc farm server` for key x86 at the tracker on ``port``, once it has registered."""
    farm = Farm("127.0.0.1", port, "x86")
    server = _daemon("server", "--tracker", f"127.0.0.1:{port}", "--key", "x86",
                     "--port", str(free_port()))
    cleanup.append(server.pid)
    wait_for(lambda: _registered(farm) == 1, 60, "server registered")
    return server


def _with_torch(root: int) -> list[str]:
    """Command lines of ``root`` and its descendants (TVM's worker processes included) that
    mapped torch."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    tree, found = {root}, []
    while True:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        if not more:
            break
        tree |= more
    for pid in tree:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/maps") as f:
                if "libtorch" in f.read():
                    found.append(command)
        except OSError:
            continue
    return found


def test_sigterm_stops_tracker_and_server_with_their_children(cleanup):
    port = free_port()
    tracker = _daemon("tracker", "--port", str(port))
    cleanup.append(tracker.pid)
    wait_for(lambda: summary("127.0.0.1", port), 60, "tracker")
    server = _registered_server(port, cleanup)
    # no process of either loads torch (tvm_ffi would: 200 MB a process)
    assert _with_torch(tracker.pid) == []
    assert _with_torch(server.pid) == []
    for process in (server, tracker):
        assert _stop_within(process, 10) < 10
        assert process.returncode == 0, process.stderr.read()[-2000:]
        assert not group_alive(process.pid, wait_s=5), "a child outlived SIGTERM"


def test_a_server_waits_for_its_tracker_and_rejoins_after_a_restart(cleanup):
    port = free_port()
    farm = Farm("127.0.0.1", port, "x86")
    server = _daemon("server", "--tracker", f"127.0.0.1:{port}", "--key", "x86",
                     "--port", str(free_port()))
    cleanup.append(server.pid)
    time.sleep(3)
    assert server.poll() is None, "the server exited while its tracker was down"
    tracker = start_tracker("127.0.0.1", port)
    cleanup.append(tracker.popen.pid)
    wait_for(lambda: _registered(farm) == 1, 90, "server registered after the tracker came up")
    tracker.stop()
    tracker = start_tracker("127.0.0.1", port)
    cleanup.append(tracker.popen.pid)
    wait_for(lambda: _registered(farm) == 1, 120, "server registered after a tracker restart")
    assert _stop_within(server, 10) < 10 and not group_alive(server.pid, wait_s=5)
    tracker.stop()


def test_tune_reports_an_unreachable_tracker_in_seconds(tiny_onnx, tmp_path):
    start = time.monotonic()
    done = subprocess.run([*AOTC, "tune", str(tiny_onnx), "--log", str(tmp_path / "t.jsonl"),
                           "--rpc", f"127.0.0.1:{free_port()}", "--key", "x86"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "not reachable" in done.stderr + done.stdout
    assert time.monotonic() - start < 5


def test_a_silent_client_does_not_block_the_server(cleanup):
    """One client connects to the server and sends nothing; a real session through the
    tracker still starts (TVM's server waited on the silent one for as long as it stayed)."""
    import socket

    from tvm import rpc
    port = free_port()
    tracker = start_tracker("127.0.0.1", port)
    cleanup.append(tracker.popen.pid)
    wait_for(lambda: summary("127.0.0.1", port), 60, "tracker")
    server = _registered_server(port, cleanup)
    info = next(s for s in summary("127.0.0.1", port)["server_info"] if s["key"] == "server:x86")
    silent = socket.create_connection(tuple(info["addr"]), timeout=5)
    got = {}

    def request():
        session = rpc.connect_tracker("127.0.0.1", port).request("x86", session_timeout=60)
        got["exists"] = session.cpu(0).exist

    try:  # in a thread: without the deadline the request waits as long as the silent client
        thread = threading.Thread(target=request, daemon=True)
        thread.start()
        thread.join(45)
        assert got.get("exists"), "no session within 45 s beside a silent client"
    finally:
        silent.close()
    assert _stop_within(server, 10) < 10
    tracker.stop()
