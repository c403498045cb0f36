"""Timing and checking one kernel on a farm's device (the reference measurements that
measure.py makes locally): the kernel is built here, uploaded through a tracker session, timed
or run there.

Each call runs in a worker process with a deadline (TVM's RPC client blocks forever on a
frozen server): past it the worker is killed and the call fails with FarmError, never hangs."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import tvm

from aotc.measure_settings import TUNE, MeasureSettings
from aotc.popen_worker import start_tvm_workers_here

from .builder import export_shared
from .farm_target import Farm, FarmError, servers_of
from .measure import argument_specs, argument_tensors, evaluator_arguments, task_module
from .retime import in_turns, one_measurement_per_round


def _export(func: tvm.tirx.PrimFunc, target: tvm.target.Target, folder: str,
            linker: str | None, name: str = "kernel") -> str:
    path = os.path.join(folder, f"{name}.so")
    export_shared(tvm.compile(task_module(func), target=target), path, linker)
    return path


class RemoteReference:
    """Reference measurements on a farm, in one worker process kept across calls (it imports
    TVM once: a fresh worker per call cost 3 s each, most of a small model's farm run). A
    call that misses its deadline kills the worker; the next call starts a new one."""

    def __init__(self, farm: Farm, linker: str | None = None, settings: MeasureSettings = TUNE):
        self.farm, self.linker, self.settings, self._pool = farm, linker, settings, None

    def kernel_seconds(self, func, target) -> float:
        with tempfile.TemporaryDirectory(prefix="aotc-remote-") as tmp:
            path = _export(func, target, tmp, self.linker)
            return self._call(_time_in_turns_on_device, {"kernel": path}, argument_specs(func),
                              evaluator_arguments(self.settings), 1)["kernel"]

    def compare(self, kernels: dict, target, rounds: int) -> dict[str, float]:
        """name -> median seconds of kernels of one workload, timed in turn in one session
        (retime.in_turns), each built and uploaded once."""
        with tempfile.TemporaryDirectory(prefix="aotc-remote-") as tmp:
            paths = {name: _export(func, target, tmp, self.linker, f"kernel{i}")
                     for i, (name, func) in enumerate(kernels.items())}
            evaluator = evaluator_arguments(one_measurement_per_round(self.settings))
            return self._call(_time_in_turns_on_device, paths,
                              argument_specs(next(iter(kernels.values()))), evaluator, rounds)

    def outputs(self, func, target) -> list[np.ndarray]:
        with tempfile.TemporaryDirectory(prefix="aotc-remote-") as tmp:
            path = _export(func, target, tmp, self.linker)
            return self._call(_run_on_device, path, argument_specs(func))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _call(self, fn, *args):
        """``fn(host, port, key, timeout, *args)`` in the worker with the session deadline; a
        device that fails or freezes is left behind and the call retried on another (a frozen
        server stays busy at the tracker, so the next request goes elsewhere)."""
        errors = []
        for _attempt in range(servers_of(self.farm)):  # FarmError in seconds: tracker/key gone
            try:
                return self._attempt(fn, *args)
            except FarmError as err:
                errors.append(str(err))
        raise FarmError("; ".join(errors))

    def _attempt(self, fn, *args):
        from tvm.support.popen_pool import PopenPoolExecutor
        farm = self.farm
        if self._pool is None:
            start_tvm_workers_here()
            self._pool = PopenPoolExecutor(max_workers=1, timeout=farm.session_timeout_s)
        try:
            return self._pool.submit(fn, farm.host, farm.port, farm.key,
                                     farm.session_timeout_s, *args).result()
        except TimeoutError:
            self.close()
            raise FarmError(f"a device of key {farm.key!r} did not finish within "
                            f"{farm.session_timeout_s:.0f} s (frozen or too slow)") from None
        except (RuntimeError, ConnectionError, OSError) as err:
            raise FarmError(f"remote measurement on key {farm.key!r} failed: {err}") from None


# --- in the worker process ---------------------------------------------------------------

def _session(host, port, key, timeout):
    from tvm import rpc
    return rpc.connect_tracker(host, port).request(key, priority=1, session_timeout=timeout)


def _load(session, path):
    session.upload(path)
    return session.load_module(os.path.basename(path))


def _time_in_turns_on_device(host, port, key, timeout, paths: dict, specs, evaluator: dict,
                             rounds: int) -> dict[str, float]:
    """name -> median seconds of the uploaded kernels, timed in turn (one kernel and one
    round: a single reference timing)."""
    session = _session(host, port, key, timeout)
    timers = {name: _load(session, path).time_evaluator("main", session.cpu(), **evaluator)
              for name, path in paths.items()}
    args = argument_tensors(specs, session.cpu())
    times = in_turns(list(paths), rounds,
                     lambda name: float(np.median(timers[name](*args).results)))
    return {name: t["median"] for name, t in times.items()}


def _run_on_device(host, port, key, timeout, path, specs) -> list[np.ndarray]:
    session = _session(host, port, key, timeout)
    lib = _load(session, path)
    args = argument_tensors(specs, session.cpu())
    lib["main"](*args)
    return [a.numpy() for a in args]
