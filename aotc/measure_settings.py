"""How a latency is measured, the same way in ``aotc tune`` (each candidate and each reference
kernel, here or on a farm's device) and ``aotc bench`` (the whole model):

- ``repeat`` measurements, each the mean over ``number`` consecutive runs;
- ``number`` is grown until one measurement lasts at least ``min_repeat_ms`` (TVM's
  time_evaluator does the same), so that tiny kernels are not timed at the clock's resolution;
- with ``cache_flush``, the CPU caches are flushed before each measurement (cold-cache figures:
  what a model that runs rarely, between other work, sees).

Both commands take the same flags (``--number``, ``--repeat``, ``--min-repeat-ms``,
``--cache-flush``); their defaults differ because their questions do: the tuner compares
kernels, ``bench`` reports a distribution of whole-model latencies."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasureSettings:
    number: int = 1
    repeat: int = 5
    min_repeat_ms: int = 20
    cache_flush: bool = False

    def __post_init__(self):
        if self.number < 1 or self.repeat < 1 or self.min_repeat_ms < 0:
            raise ValueError(f"measurement settings out of range: {self}")


# Kernels: 5 means of >= 20 ms each (MetaSchedule's runner default was 1 mean of >= 100 ms;
# five give the median something to work with).
TUNE = MeasureSettings(number=1, repeat=5, min_repeat_ms=20)
# Whole models: 50 single runs (after a warm-up), for percentiles.
BENCH = MeasureSettings(number=1, repeat=50, min_repeat_ms=0)
