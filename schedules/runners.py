"""Where the tuner measures: this machine, or a device farm (farm_target.py). One object gives both
MetaSchedule's runner for candidates and the reference measurements (the default schedule's
time, the results check), so that both sides of every comparison run on the same kind of
device. ``create(farm)`` picks one; the builder stays local (candidates are compiled here)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture

from aotc.measure_settings import TUNE, MeasureSettings
from aotc.popen_worker import start_tvm_workers_here

from . import measure, remote, retime
from .farm_target import Farm, servers_of

# A candidate's whole measurement; past it the runner's worker is killed and the candidate
# recorded as failed (a hung kernel, a frozen device).
RUN_TIMEOUT_S = 60.0


# A candidate whose measurement failed this way is run once more, on whichever device the
# tracker gives next: a device killed or frozen mid-measurement says nothing about the
# candidate. (A kernel that hangs every device costs a second deadline.)
_DEVICE_FAILURES = ("timeout", "connection", "kshutdown", "socket", "broken pipe")


@derived_object
class RetryingRunner(PyRunner):
    """Wraps a runner: a candidate that failed for a device's reason is retried once."""

    def __init__(self, inner, retries: int = 1):
        super().__init__()
        self.inner, self.retries = inner, retries

    def run(self, runner_inputs):
        futures = self.inner.run(runner_inputs)
        return [RetryingFuture(self.inner, one, future, self.retries)
                for one, future in zip(runner_inputs, futures)]


@derived_object
class RetryingFuture(PyRunnerFuture):
    def __init__(self, inner, runner_input, future, retries: int):
        super().__init__()
        self.inner, self.runner_input = inner, runner_input
        self.future, self.retries = future, retries

    def done(self) -> bool:
        return self.future.done()

    def result(self):
        result = self.future.result()
        while self.retries > 0 and result.error_msg and any(
                mark in result.error_msg.lower() for mark in _DEVICE_FAILURES):
            self.retries -= 1
            self.future = self.inner.run([self.runner_input])[0]
            result = self.future.result()
        return result


@derived_object
class MedianRunner(PyRunner):
    """Wraps a runner: each candidate's result carries the median of its repeats as its one
    time. Why: MetaSchedule's database ranks records by the mean of their repeats, and on
    these VMs one repeat in several is a spike (of 79 new-best records of a MobileNetV2 run,
    a quarter had their slowest repeat 1.7x their fastest, and the mean 12% or more above
    the median); its cost model and our reference timings already take the median."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def run(self, runner_inputs):
        return [MedianFuture(future) for future in self.inner.run(runner_inputs)]


@derived_object
class MedianFuture(PyRunnerFuture):
    def __init__(self, future):
        super().__init__()
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def result(self):
        result = self.future.result()
        seconds = measure.measured_seconds(result)  # the median; None: failed or untimed
        if seconds is None:
            return result
        return ms.runner.RunnerResult(run_secs=[seconds], error_msg=None)


def evaluator_config(settings: MeasureSettings) -> ms.runner.EvaluatorConfig:
    return ms.runner.EvaluatorConfig(number=settings.number, repeat=settings.repeat,
                                     min_repeat_ms=settings.min_repeat_ms,
                                     enable_cpu_cache_flush=settings.cache_flush)


@dataclass
class LocalMeasurement:
    """Candidates in local worker processes (each with a timeout), references in-process."""
    settings: MeasureSettings = TUNE

    def runner(self):
        start_tvm_workers_here()
        return MedianRunner(ms.runner.LocalRunner(
            timeout_sec=RUN_TIMEOUT_S, evaluator_config=evaluator_config(self.settings)))

    def builder_options(self) -> dict:
        return {}

    def kernel_seconds(self, func, target) -> float:
        return measure.kernel_seconds(func, target, self.settings)

    def compare(self, kernels: dict, target, rounds: int) -> dict[str, float]:
        """name -> median seconds of kernels of one workload, each built once and timed in
        turn for ``rounds`` rounds (one measurement each per round)."""
        times = retime.retime(kernels, target, rounds,
                              retime.one_measurement_per_round(self.settings))
        return {name: t["median"] for name, t in times.items()}

    def outputs(self, func, target) -> list:
        """Every argument's values after one run on the seeded inputs (measure.same_values
        compares two kernels' values)."""
        return measure.kernel_outputs(func, target)

    def describe(self) -> str:
        return "this machine"

    def close(self) -> None:
        pass


@dataclass
class FarmMeasurement:
    """Candidates on the farm's servers of one key, one per server at a time (MetaSchedule's
    RPCRunner, a worker per candidate killed at the session deadline; a candidate that failed
    for a device's reason is retried once); references there too."""
    farm: Farm
    linker: str | None = None   # the target's cross linker (None: the host cc)
    settings: MeasureSettings = TUNE

    def __post_init__(self):
        self.reference = remote.RemoteReference(self.farm, self.linker, self.settings)

    def builder_options(self) -> dict:
        """Candidates as shared libraries linked here: a board may have no compiler."""
        return {"shared": True, "linker": self.linker}

    def runner(self):
        start_tvm_workers_here()
        config = ms.runner.RPCConfig(tracker_host=self.farm.host, tracker_port=self.farm.port,
                                     tracker_key=self.farm.key, session_priority=1,
                                     session_timeout_sec=self.farm.session_timeout_s)
        return MedianRunner(RetryingRunner(ms.runner.RPCRunner(
            rpc_config=config, max_workers=servers_of(self.farm),
            evaluator_config=evaluator_config(self.settings))))

    def kernel_seconds(self, func, target) -> float:
        return self.reference.kernel_seconds(func, target)

    def compare(self, kernels: dict, target, rounds: int) -> dict[str, float]:
        return self.reference.compare(kernels, target, rounds)

    def outputs(self, func, target) -> list:
        return self.reference.outputs(func, target)

    def close(self) -> None:
        self.reference.close()

    def describe(self) -> str:
        return f"{servers_of(self.farm)} servers of key {self.farm.key!r} at {self.farm.address}"


def create(farm: Farm | None = None, linker: str | None = None,
           settings: MeasureSettings = TUNE):
    """Local measurement, or the farm's (checked first: FarmError within seconds when the
    tracker is down or has no server of the key), both as ``settings`` say."""
    if farm is None:
        return LocalMeasurement(settings)
    servers_of(farm)
    return FarmMeasurement(farm, linker, settings)
