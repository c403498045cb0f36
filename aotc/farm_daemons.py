"""``aotc farm``: TVM's RPC tracker and servers as processes that stop cleanly.

``tvm.exec.rpc_server`` and ``rpc_tracker`` spawn ``popen_worker`` children that outlive a
SIGTERM to the parent (seen here: three workers left after ``pkill -f tvm.exec.rpc_``). Each
process here starts in its own session (process group) and is stopped by signalling the whole
group: SIGTERM, then SIGKILL after a grace period."""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from aotc.errors import AotcError, TrackerUnreachable

PORT_RANGE = 100   # TVM binds the first free port of [port, port + range)
STOP_GRACE_S = 5.0


class FarmProcessError(AotcError):
    """A tracker or server did not start."""


@dataclass
class FarmProcess:
    """A tracker or server in its own process group."""
    name: str
    popen: subprocess.Popen

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the whole group, SIGKILL to what is left after ``grace_s``."""
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL)  # workers that ignored SIGTERM, or a frozen group
        self.popen.wait()


def _start(name: str, args: list[str], log=None) -> FarmProcess:
    popen = subprocess.Popen([sys.executable, "-m", *args], start_new_session=True,
                             stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return FarmProcess(name, popen)


def start_tracker(host: str = "127.0.0.1", port: int = 9190, log=None) -> FarmProcess:
    return _start(f"tracker {host}:{port}", ["aotc.farm_tracker", "--host", host, "--port",
                                             str(port), "--port-end", str(port + 1)], log)


def start_server(tracker: str, key: str, host: str = "127.0.0.1", port: int = 9300,
                 log=None) -> FarmProcess:
    return _start(f"server {key}@{tracker}",  # TVM's server with a handshake deadline
                  ["aotc.farm_server", "--tracker", tracker, "--key", key, "--host", host,
                   "--port", str(port), "--port-end", str(port + PORT_RANGE)], log)


def start_cpp_server(tracker: str, key: str, arch: str | None = None, host: str = "127.0.0.1",
                     port: int = 9300, log=None) -> FarmProcess:
    """The C++ server (runtime/cpp/tools/aotc_rpc_server.cc) for ``arch``: a board without
    Python; a foreign architecture runs here under its emulator (qemu-aarch64)."""
    from aotc import cpp_runner
    arch = arch or platform.machine()
    binary = cpp_runner.build(arch).parent / "aotc-rpc-server"
    command = [*cpp_runner.launcher(arch), str(binary), "--tracker", tracker,
               "--key", key, "--host", host, "--port", str(port)]
    popen = subprocess.Popen(command, start_new_session=True, stdout=log or subprocess.DEVNULL,
                             stderr=subprocess.STDOUT)
    return FarmProcess(f"C++ server {key}@{tracker} ({arch})", popen)


def wait_for(check, timeout_s: float, what: str, process: FarmProcess | None = None):
    """Poll ``check()`` until it returns a truthy value (returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and not process.alive:
            raise FarmProcessError(f"{process.name} exited with code {process.popen.returncode}")
        try:
            found = check()
        except AotcError:
            found = None
        if found:
            return found
        time.sleep(0.25)
    raise FarmProcessError(f"{what}: not ready after {timeout_s:.0f} s")


class _Stop(Exception):
    """SIGTERM arrived (raised out of whatever the main thread was waiting in)."""


def _raise_stop(_signum, _frame):
    # Only raise here: the main thread may be inside Popen.wait, whose lock a second wait
    # from the handler would wait for forever (every `systemctl stop` ended in SIGKILL).
    raise _Stop


def run_foreground(process: FarmProcess) -> int:
    """Wait for ``process``; Ctrl-C or SIGTERM stops its whole group (and reaps it)."""
    signal.signal(signal.SIGTERM, _raise_stop)
    try:
        return process.popen.wait()
    except (KeyboardInterrupt, _Stop):
        process.stop()
        return 0


def supervise(start, ready, what: str, say=print) -> int:
    """Run the server ``start()`` returns until SIGTERM / Ctrl-C, as a daemon should: wait for
    ``ready()`` (its tracker answering) first, retrying with back-off (1 s doubling to 30 s)
    for as long as it takes, since devices and trackers boot in any order; start it again
    whenever it exits (TVM's server gives up on a tracker gone for 60 s), once the tracker is
    back. Returns 0 when stopped."""
    signal.signal(signal.SIGTERM, _raise_stop)
    process = None
    try:
        while True:
            _wait_ready(ready, what, say)
            process = start()
            code = process.popen.wait()
            say(f"{process.name} exited with code {code}; starting it again")
            process = None
    except (KeyboardInterrupt, _Stop):
        if process is not None:
            process.stop()
        return 0


def _wait_ready(ready, what: str, say) -> None:
    delay = 1.0
    while True:
        try:
            if ready():
                return
        except AotcError as err:
            say(f"{what}: {err}; retrying in {delay:.0f} s")
        time.sleep(delay)
        delay = min(2 * delay, 30.0)


def check_tracker(address: str, timeout_s: float = 3.0) -> None:
    """TrackerUnreachable within ``timeout_s`` when nothing accepts connections at ``address``
    (HOST:PORT): checked before anything heavy is imported, so that a wrong or dead tracker is
    reported at once, not after TVM has loaded."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TrackerUnreachable(f"{address!r}: expected HOST:PORT of a TVM RPC tracker")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise TrackerUnreachable(f"tracker {address} is not reachable: {err}") from None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LoopbackFarm:
    """A tracker and ``servers`` TVM servers of ``key`` on this machine, ready when built (for
    trying a farm out, the tests and bench/farm_throughput.py). ``stop()`` ends every process
    group."""

    def __init__(self, servers: int, key: str = "x86", host: str = "127.0.0.1"):
        from aotc.schedules.farm_target import Farm, servers_of, summary
        self.host, self.port, self.key = host, free_port(host), key
        self.tracker = start_tracker(host, self.port)
        self.servers: list[FarmProcess] = []
        try:
            wait_for(lambda: summary(host, self.port), 30, "tracker", self.tracker)
            self.farm = Farm(host, self.port, key)
            self.servers = [start_server(self.address, key, host, free_port(host))
                            for _ in range(servers)]
            wait_for(lambda: servers_of(self.farm) == servers, 60, f"{servers} servers")
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def groups(self) -> list[int]:
        """Process group ids of the tracker and the servers (each is one group)."""
        return [p.popen.pid for p in [self.tracker, *self.servers]]

    def stop(self) -> None:
        for process in [*self.servers, self.tracker]:
            process.stop()
