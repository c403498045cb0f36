"""Per-kernel timing of a compiled model (``aotc profile``).

TVM removed its VM profiler in v0.24. Instead, every kernel listed in the model's kernel table
(recorded at compile time: argument shapes and dtypes, calls per run, FLOPs) is called on its
own from the loaded library with synthetic arguments, and its median time is multiplied by
its calls per run. Kernels run in isolation here (their inputs may be warmer in cache than in
the model), so the sum of kernel times is printed next to the measured end-to-end latency:
the difference is the VM's own overhead plus that effect.

Synthetic arguments: floats uniform in [0.5, 1) (positive, so that sqrt/log/divide kernels
take their normal path), integers and bools zero (valid indices for any guarded gather)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .exotic_dtypes import to_tvm
from .inputs import random_inputs
from .buffers import aligned
from .model import Model
from .thread_placement import PLACEMENT

_MIN_REPEAT_SECONDS = 2e-3  # each timed repeat calls a kernel often enough to last this long


@dataclass
class KernelTiming:
    name: str
    calls: int
    ms_per_call: float | None
    flops: int | None
    note: str = ""

    @property
    def total_ms(self) -> float:
        return (self.ms_per_call or 0.0) * self.calls

    @property
    def gflops(self) -> float | None:
        if not self.flops or not self.ms_per_call:
            return None
        return self.flops / (self.ms_per_call * 1e-3) / 1e9


@dataclass
class ProfileReport:
    model: str
    end_to_end_ms: float
    kernels: list[KernelTiming] = field(default_factory=list)

    @property
    def kernel_total_ms(self) -> float:
        return sum(k.total_ms for k in self.kernels)

    def table(self, top: int | None = None) -> str:
        rows = sorted(self.kernels, key=lambda k: -k.total_ms)
        total = self.kernel_total_ms or 1.0
        lines = [f"{'kernel':56s} {'calls':>5s} {'ms/call':>9s} {'total ms':>9s} "
                 f"{'share':>6s} {'GFLOP/s':>8s}"]
        for k in rows[:top] if top else rows:
            if k.ms_per_call is None:
                lines.append(f"{k.name[:56]:56s} {k.calls:5d} {'-':>9s} {'-':>9s} {'-':>6s} "
                             f"{'-':>8s}  {k.note}")
                continue
            gflops = f"{k.gflops:8.1f}" if k.gflops is not None else f"{'-':>8s}"
            lines.append(f"{k.name[:56]:56s} {k.calls:5d} {k.ms_per_call:9.4f} "
                         f"{k.total_ms:9.3f} {100 * k.total_ms / total:5.1f}% {gflops}")
        if top and len(rows) > top:
            lines.append(f"... {len(rows) - top} more kernels (--top 0 shows all)")
        lines.append(f"{len(rows)} kernels, sum {self.kernel_total_ms:.2f} ms; end-to-end "
                     f"{self.end_to_end_ms:.2f} ms (VM overhead and cache effects: the difference)")
        return "\n".join(lines)

    def to_json(self) -> str:
        kernels = [{**asdict(k), "total_ms": k.total_ms, "gflops": k.gflops} for k in self.kernels]
        return json.dumps({"model": self.model, "end_to_end_ms": self.end_to_end_ms,
                           "kernel_total_ms": self.kernel_total_ms, "kernels": kernels}, indent=2)


def profile(model: Model, repeats: int = 10) -> ProfileReport:
    """Time every kernel of ``model`` (median of ``repeats``) and the whole model."""
    table = model.metadata.get("kernels")
    if table is None:
        raise ValueError(f"{model.path}: no kernel table (built by an aotc older than the "
                         "profiler); recompile it")
    feed = random_inputs(model.signature, seed=0)
    end_to_end = _median_ms(lambda: model.run(feed), repeats)
    timings = [_time_kernel(model, entry, repeats) for entry in table]
    return ProfileReport(str(model.path), end_to_end, timings)


def _time_kernel(model: Model, entry: dict, repeats: int) -> KernelTiming:
    timing = KernelTiming(entry["name"], entry["calls"], None, entry.get("flops"))
    if any(arg["shape"] is None for arg in entry["args"]):
        timing.note = "symbolic shape: not timed"
        return timing
    function = model.kernel(entry["name"])
    if function is None:
        timing.note = "not found in the library"
        return timing
    try:
        args = [to_tvm(model.ffi, _synthetic(arg["shape"], arg["dtype"])) for arg in entry["args"]]
        function(*args)  # warm-up; also surfaces a kernel's own checks
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        timing.note = f"could not run: {type(err).__name__}: {str(err).strip()[:80]}"
        return timing
    timing.ms_per_call = _median_ms(lambda: PLACEMENT.run(lambda: function(*args)), repeats)
    return timing


def _synthetic(shape: list[int], dtype: str) -> np.ndarray:
    if dtype.startswith(("float", "bfloat")):
        np_dtype = _float_dtype(dtype)
        values = np.random.default_rng(0).uniform(0.5, 1.0, size=shape)
        return aligned(values.astype(np_dtype))
    return aligned(np.zeros(shape, dtype="bool" if dtype == "bool" else dtype))


def _float_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes  # pylint: disable=import-outside-toplevel
        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _median_ms(call, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of a batch of calls lasting >= 2 ms."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(_MIN_REPEAT_SECONDS / once))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples) * 1e3
