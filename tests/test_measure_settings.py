"""One set of measurement settings for aotc tune and aotc bench: what each flag does to the
samples, and that both commands (and the farm) read the same settings."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import aotc.bench
from aotc.bench import time_callable
from aotc.cli import main
from aotc.measure_settings import MeasureSettings


def test_samples_follow_number_repeat_and_min_repeat_ms(monkeypatch):
    calls = []
    samples = time_callable(lambda: calls.append(1), MeasureSettings(number=3, repeat=4,
                                                                     min_repeat_ms=0), warmup=2)
    assert len(samples) == 4 and len(calls) == 2 + 3 * 4
    calls.clear()
    clock = [0.0]  # a fake clock: every call lasts exactly 1 ms, so nothing depends on load
    monkeypatch.setattr(aotc.bench.time, "perf_counter", lambda: clock[0])
    slow = time_callable(lambda: (calls.append(1), clock.__setitem__(0, clock[0] + 0.001)),
                         MeasureSettings(number=1, repeat=2, min_repeat_ms=10), warmup=0)
    assert len(slow) == 2 and len(calls) == 1 + 2 + 4 + 8 + 16 + 16  # doubled to 16 runs a sample
    assert slow == pytest.approx([0.001, 0.001])  # still seconds per run, not per sample
    flushed = time_callable(lambda: None, MeasureSettings(repeat=3, min_repeat_ms=0,
                                                          cache_flush=True), warmup=0)
    assert len(flushed) == 3


def test_out_of_range_settings_are_refused():
    with pytest.raises(ValueError):
        MeasureSettings(number=0)


def test_tuner_runners_take_the_settings():
    from aotc.schedules import runners
    settings = MeasureSettings(number=2, repeat=7, min_repeat_ms=5, cache_flush=True)
    runner = runners.create(settings=settings).runner()
    assert isinstance(runner, runners.MedianRunner)  # reports the median of the repeats
    config = runner.inner.evaluator_config
    assert (config.number, config.repeat, config.min_repeat_ms, config.enable_cpu_cache_flush) \
        == (2, 7, 5, True)


def test_bench_takes_the_same_flags(tiny_so):
    result = CliRunner().invoke(main, ["bench", str(tiny_so), "--repeat", "7", "--number", "2",
                                       "--cache-flush", "--warmup", "1"])
    assert result.exit_code == 0, result.output
    assert "runs: 7" in result.output
    old_name = CliRunner().invoke(main, ["bench", str(tiny_so), "--runs", "3", "--warmup", "0"])
    assert old_name.exit_code == 0 and "runs: 3" in old_name.output
