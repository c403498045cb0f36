"""Compiled models in tests run in a separate process that has never loaded TVM's compiler, as a
user's process has not: a kernel that calls a function only the compiler library registers
(TOPI's CPU sort did) fails there as it would for a user, where the compiling test process
would hide it.

``conftest.py`` replaces ``aotc.runtime.load`` by ``load`` here for every test not marked
``in_process`` (tests of the runtime's own internals: threads, forks, ctypes handles). The
returned ``FreshModel`` forwards calls, method calls and attribute reads to the real Model in
the runner process. One runner per test process, started on first use, restarted if a model
kills it; it checks after each request that TVM's compiler was not imported."""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import threading

# The runner's own code. It talks to its parent over stdin/stdout with length-prefixed pickles
# (parent and child are the same test run; nothing else writes to these pipes).
_RUNNER = r"""
import pickle, struct, sys, traceback
sys.stdout = sys.stderr  # prints from the runtime must not corrupt the reply stream
out, inp = sys.__stdout__.buffer, sys.stdin.buffer
models = {}

def reply(value):
    data = pickle.dumps(value)
    out.write(struct.pack("<Q", len(data)) + data)
    out.flush()

def serve(kind, handle, name, args, kwargs):
    if kind == "load":
        from aotc.runtime import load
        models[handle] = load(*args, **kwargs)
        return None
    if kind == "drop":
        models.pop(handle, None)
        return None
    model = models[handle]
    if kind == "getattr":
        value = getattr(model, name)
        return "<callable>" if callable(value) else value
    return (model if name == "__call__" else getattr(model, name))(*args, **kwargs)

while True:
    header = inp.read(8)
    if len(header) < 8:
        break
    request = pickle.loads(inp.read(struct.unpack("<Q", header)[0]))
    try:
        value = ("ok", serve(*request))
        pickle.dumps(value)
    except BaseException as err:  # every failure goes back to the test that asked
        try:
            pickle.dumps(err)
            value = ("raise", err)
        except Exception:
            value = ("raise", RuntimeError(f"{type(err).__name__}: {err}"))
    if "tvm" in sys.modules:
        value = ("raise", AssertionError(
            "TVM's compiler package was imported in the model's process (by "
            f"{request[0]} {request[2]!r}): a user's process would not have it"))
    reply(value)
"""


class RunnerDied(RuntimeError):
    pass


# The runner's TVM pool workers sleep at once after a run instead of spinning: the test beside
# it compiles its next model on the same cores, and spinning workers took them
# (docs/design/measurements.md, "tests/fresh_runner.py"). Results do not depend on it. Only
# here: processes the tests fork keep TVM's default (a forked child's pool hung with spinning
# off; see tests/test_fork.py).
_RUNNER_ENV = {"TVM_THREAD_POOL_SPIN_COUNT": "0"}


class _Runner:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _RUNNER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     env={**_RUNNER_ENV, **os.environ})
        self.lock = threading.Lock()
        self.next_handle = 0
        self.dropped: list[int] = []  # models collected since the last request

    def ask(self, *request):
        while self.dropped:
            handle = self.dropped.pop()
            self._ask_one(("drop", handle, "drop", (), {}))
        return self._ask_one(request)

    def _ask_one(self, request):
        data = pickle.dumps(request)
        with self.lock:
            try:
                self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
                self.proc.stdin.flush()
                header = self.proc.stdout.read(8)
                if len(header) < 8:
                    raise EOFError
                kind, value = pickle.loads(self.proc.stdout.read(struct.unpack("<Q", header)[0]))
            except (BrokenPipeError, EOFError):
                code = self.proc.wait()
                raise RunnerDied(f"the model's process died (exit code {code}) during "
                                 f"{request[0]} {request[2]!r}") from None
        if kind == "raise":
            raise value
        return value

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_STATE: dict[str, _Runner] = {}


def _runner() -> _Runner:
    runner = _STATE.get("runner")
    if runner is None or runner.proc.poll() is not None:
        runner = _STATE["runner"] = _Runner()
    return runner


@atexit.register
def _close() -> None:
    if "runner" in _STATE:
        _STATE.pop("runner").close()


class FreshModel:
    """A Model living in the runner process; reads like one."""

    def __init__(self, path, **kwargs):
        runner = _runner()
        runner.next_handle += 1
        handle = runner.next_handle
        runner.ask("load", handle, "load", (str(path),), kwargs)
        object.__setattr__(self, "_where", (runner, handle))

    def _ask(self, kind, name, args=(), kwargs=None):
        runner, handle = self._where
        if runner.proc.poll() is not None:
            raise RunnerDied("the model's process died before this call (an earlier call "
                             "killed it)")
        return runner.ask(kind, handle, name, args, kwargs or {})

    def __call__(self, *args, **kwargs):
        return self._ask("call", "__call__", args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = self._ask("getattr", name)
        if value == _CALLABLE:
            return lambda *args, **kwargs: self._ask("call", name, args, kwargs)
        return value

    def __del__(self):
        # Garbage collection may run inside a request: the drop is sent with the next one.
        runner, handle = self.__dict__.get("_where", (None, None))
        if runner is not None:
            runner.dropped.append(handle)


_CALLABLE = "<callable>"


def load(path, verify: bool = True, key_file=None) -> FreshModel:
    return FreshModel(path, verify=verify, key_file=None if key_file is None else str(key_file))
