"""Calibration observers on known distributions, fed in several samples: min-max is exact,
percentile clips a rare outlier, entropy clips a heavy tail below its maximum; the widening
histogram keeps every count."""

import numpy as np
import pytest

from aotc.compiler.quantize import observers

RNG = np.random.default_rng(0)


def _feed(observer, chunks):
    for chunk in chunks:
        observer.update(chunk)
    return observer.range()


def test_minmax_exact():
    chunks = [RNG.standard_normal(1000) * (i + 1) for i in range(4)]
    low, high = _feed(observers.create("minmax"), chunks)
    assert low == min(c.min() for c in chunks) and high == max(c.max() for c in chunks)


def test_percentile_clips_outlier():
    chunks = [RNG.uniform(0, 1, 100_000), np.array([1000.0])]
    low, high = _feed(observers.create("percentile", 99.9), chunks)
    assert low == pytest.approx(0.0, abs=0.01) and high < 2.0


def test_entropy_clips_rare_large_values():
    """ReLU'd normal values with one in 10^4 fifty times larger: the threshold stays near the
    bulk (a few sigma), far below the maximum."""
    chunks = []
    for _ in range(3):
        x = np.maximum(RNG.standard_normal(50_000), 0)
        x[RNG.integers(0, x.size, 5)] *= 50
        chunks.append(x)
    low, high = _feed(observers.create("entropy"), chunks)
    assert low == 0.0 and 2.0 < high < 0.3 * max(c.max() for c in chunks)


def test_histogram_widening_keeps_counts():
    observer = observers.Histogram()
    _feed(observer, [RNG.uniform(0, 1, 500), RNG.uniform(-5, 3, 700), RNG.uniform(2, 9, 300)])
    assert observer.counts.sum() == 1500
    assert observer.range() == (pytest.approx(-5, abs=0.05), pytest.approx(9, abs=0.05))


def test_unknown_method_named():
    with pytest.raises(ValueError, match="median"):
        observers.create("median")
