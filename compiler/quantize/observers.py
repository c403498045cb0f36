"""Observers: what calibration keeps of one activation tensor across samples, and the range
it quantizes to. Each sample is folded in as it comes (a min/max pair or a fixed-size
histogram), so calibrating over many samples never holds more than one sample's activations.

  minmax      the full range seen: no clipping, coarse steps when a few values are far out
  percentile  the range holding all but (100 - p)% of the values at either end (p = 99.99)
  entropy     the clipping threshold whose quantized distribution is closest, by KL
              divergence, to the observed one (TensorRT's calibrator)"""

from __future__ import annotations

import numpy as np

from aotc.options import CALIBRATION_METHODS as METHODS

_BINS = 2048


class MinMax:
    def __init__(self):
        self.low, self.high = np.inf, -np.inf

    def update(self, x: np.ndarray) -> None:
        if x.size:
            self.low, self.high = min(self.low, float(x.min())), max(self.high, float(x.max()))

    def range(self) -> tuple[float, float]:
        if self.low > self.high:
            return 0.0, 0.0
        return self.low, self.high


class Histogram(MinMax):
    """A histogram over [low, high] that widens as samples arrive: the old counts move to the
    bins of the wider range that hold their bin centres."""

    def __init__(self):
        super().__init__()
        self.counts = np.zeros(_BINS, np.float64)

    def update(self, x: np.ndarray) -> None:
        if not x.size:
            return
        old_low, old_high = self.low, self.high
        super().update(x)
        if self.high <= self.low:
            self.counts[0] += x.size
            return
        if np.isfinite(old_low) and (old_low, old_high) != (self.low, self.high):
            self._rebin(old_low, old_high)
        self.counts += np.histogram(x, _BINS, (self.low, self.high))[0]

    def _rebin(self, old_low: float, old_high: float) -> None:
        centres = old_low + (np.arange(_BINS) + 0.5) * (old_high - old_low) / _BINS
        index = np.clip(((centres - self.low) / self.bin_width).astype(np.int64), 0, _BINS - 1)
        counts = np.zeros(_BINS, np.float64)
        np.add.at(counts, index, self.counts)
        self.counts = counts

    @property
    def bin_width(self) -> float:
        return (self.high - self.low) / _BINS

    def quantile(self, q: float) -> float:
        cdf = np.cumsum(self.counts) / max(self.counts.sum(), 1.0)
        return self.low + float(np.searchsorted(cdf, q)) * self.bin_width


class Percentile(Histogram):
    def __init__(self, percentile: float = 99.99):
        super().__init__()
        self.percentile = percentile

    def range(self) -> tuple[float, float]:
        low, high = super().range()
        if high <= low:
            return low, high
        tail = (100.0 - self.percentile) / 100.0
        return max(low, self.quantile(tail)), min(high, self.quantile(1.0 - tail))


class Entropy(Histogram):
    def range(self) -> tuple[float, float]:
        low, high = super().range()
        if high <= low:
            return low, high
        absolute = self._absolute_histogram()
        levels = 255 if low >= 0 else 128  # u8 steps over [0, T], or half of them per side
        threshold = kl_threshold(absolute, levels) * max(abs(low), abs(high)) / _BINS
        return max(low, -threshold), min(high, threshold)

    def _absolute_histogram(self) -> np.ndarray:
        top = max(abs(self.low), abs(self.high))
        centres = np.abs(self.low + (np.arange(_BINS) + 0.5) * self.bin_width)
        index = np.clip((centres / top * _BINS).astype(np.int64), 0, _BINS - 1)
        counts = np.zeros(_BINS, np.float64)
        np.add.at(counts, index, self.counts)
        return counts


def kl_threshold(counts: np.ndarray, levels: int, stride: int = 16) -> float:
    """The number of bins (of ``counts``, a histogram of |x|) to keep so that quantizing them to
    ``levels`` steps, the clipped tail folded into the last bin, loses the least information."""
    best, best_kl = len(counts), np.inf
    for keep in range(levels, len(counts) + 1, stride):
        reference = counts[:keep].copy()
        reference[-1] += counts[keep:].sum()
        kl = _kl(reference, _quantized(counts[:keep], levels))
        if kl < best_kl:
            best, best_kl = keep, kl
    return float(best)


def _quantized(counts: np.ndarray, levels: int) -> np.ndarray:
    """``counts`` merged into ``levels`` groups, each group's total spread over its nonzero
    bins (what dequantized values would show)."""
    out = np.zeros_like(counts)
    for chunk in np.array_split(np.arange(len(counts)), levels):
        nonzero = counts[chunk] > 0
        if nonzero.any():
            out[chunk[nonzero]] = counts[chunk].sum() / nonzero.sum()
    return out


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p, q = p / max(p.sum(), 1e-30), q / max(q.sum(), 1e-30)
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))


def create(method: str, percentile: float = 99.99):
    if method == "minmax":
        return MinMax()
    if method == "percentile":
        return Percentile(percentile)
    if method == "entropy":
        return Entropy()
    raise ValueError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
