"""`aotc bench`: latency of a compiled model, and of onnxruntime on the same inputs in the
same process and run, so the ratio is measured, not remembered."""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from aotc.measure_settings import BENCH, MeasureSettings


@dataclass
class Timing:
    name: str
    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    throughput_per_s: float

    @staticmethod
    def from_samples(name: str, samples_s: list[float]) -> Timing:
        ms = np.array(samples_s) * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return Timing(name, len(ms), float(p50), float(p90), float(p99), float(ms.mean()),
                      float(1e3 / p50))


@dataclass
class BenchReport:
    artifact: str
    threads: int
    timings: list[Timing] = field(default_factory=list)
    max_abs_diff: float | None = None
    peak_rss_mb: float | None = None  # of this process after the aotc runs (before onnxruntime)
    planned_activation_mb: float | None = None  # from the compiled model's metadata

    def ratio(self) -> float | None:
        """aotc p50 / onnxruntime p50 (>1 means aotc is slower)."""
        if len(self.timings) < 2:
            return None
        return self.timings[0].p50_ms / self.timings[1].p50_ms

    def table(self) -> str:
        lines = [f"{'engine':14s} {'p50 ms':>9s} {'p90 ms':>9s} {'p99 ms':>9s} {'runs/s':>9s}"]
        for t in self.timings:
            lines.append(f"{t.name:14s} {t.p50_ms:9.3f} {t.p90_ms:9.3f} {t.p99_ms:9.3f} "
                         f"{t.throughput_per_s:9.1f}")
        lines.append(f"aotc threads: {self.threads}, runs: {self.timings[0].runs} (after warm-up)")
        if self.peak_rss_mb is not None:
            planned = (f", planned activations {self.planned_activation_mb:.1f} MB"
                       if self.planned_activation_mb is not None else "")
            lines.append(f"peak RSS after the aotc runs: {self.peak_rss_mb:.1f} MB{planned}")
        if self.ratio() is not None:
            lines.append(f"aotc / onnxruntime (p50): {self.ratio():.2f}x; max |diff| of outputs "
                         f"{self.max_abs_diff:.3g}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ratio_vs_onnxruntime": self.ratio()}, indent=2)


# Larger than the last-level cache of the CPUs we target (this VM's: 32 MiB at most).
_FLUSH_BYTES = 64 << 20


def time_callable(fn, settings: MeasureSettings = BENCH, warmup: int = 5) -> list[float]:
    """``settings.repeat`` samples (seconds per run), as aotc.measure_settings describes: each
    the mean of ``number`` runs, grown until a sample lasts ``min_repeat_ms``; caches flushed
    before each sample with ``cache_flush``."""
    for _ in range(warmup):
        fn()
    flush = np.zeros(_FLUSH_BYTES // 8) if settings.cache_flush else None
    number = settings.number
    samples: list[float] = []
    while len(samples) < settings.repeat:
        if flush is not None:
            flush += 1.0  # touches every line: the model's weights and activations leave the caches
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed * 1e3 < settings.min_repeat_ms and not samples:
            number *= 2  # too short to time: more runs per sample (before the first one counts)
            continue
        samples.append(elapsed / number)
    return samples


def onnxruntime_session(onnx_path: str, threads: int | None = None):
    """onnxruntime as users get it (default session options, its own thread count) unless a
    thread count is asked for."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])


def run_bench(artifact: str, onnx_path: str | None = None, runs: int | None = None,
              warmup: int = 5, settings: MeasureSettings = BENCH) -> BenchReport:
    """``runs``: a shortcut for ``settings.repeat``."""
    if runs is not None:
        settings = dataclasses.replace(settings, repeat=runs)
    from aotc.runtime import load
    from aotc.runtime._tvm_runtime import num_threads
    from aotc.runtime.inputs import random_inputs

    model = load(artifact)
    feed = random_inputs(model.signature)
    samples = time_callable(lambda: model.run(feed), settings, warmup)
    report = BenchReport(artifact, num_threads())  # read after the runs: what really ran
    report.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    planned = model.metadata.get("memory", {}).get("planned_bytes")
    report.planned_activation_mb = planned / 1e6 if planned else None
    report.timings.append(Timing.from_samples("aotc", samples))
    if onnx_path:
        session = onnxruntime_session(onnx_path)
        report.timings.append(Timing.from_samples("onnxruntime", time_callable(
            lambda: session.run(None, feed), settings, warmup)))
        ours = list(model.run(feed).values())
        theirs = session.run(None, feed)
        report.max_abs_diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    return report
