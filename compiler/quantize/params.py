"""Quantization arithmetic shared by annotate, realize and the report: activation ranges to
u8 scale/zero point, per-channel symmetric s8 weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

U8_MAX, S8_MAX = 255, 127


@dataclass(frozen=True)
class ActivationParams:
    """u8 quantization of one activation tensor: q = clip(round(x / scale) + zero_point)."""
    scale: float
    zero_point: int

    @staticmethod
    def from_range(low: float, high: float) -> ActivationParams:
        """The range widened to hold 0.0 exactly (zero padding must stay zero)."""
        low, high = min(float(low), 0.0), max(float(high), 0.0)
        if high - low < 1e-12:
            return ActivationParams(1.0, 0)
        scale = (high - low) / U8_MAX
        return ActivationParams(scale, int(np.clip(round(-low / scale), 0, U8_MAX)))

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        q = np.clip(np.rint(x / self.scale) + self.zero_point, 0, U8_MAX)  # half to even
        return ((q - self.zero_point) * self.scale).astype(np.float32)


def quantize_weight(weight: np.ndarray, channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per channel): symmetric over [-127, 127] per output channel.
    An all-zero channel gets scale 1 (any scale represents it)."""
    other = tuple(a for a in range(weight.ndim) if a != channel_axis % weight.ndim)
    peak = np.abs(weight).max(axis=other)
    scale = np.where(peak > 0, peak / S8_MAX, 1.0).astype(np.float32)
    shape = [1] * weight.ndim
    shape[channel_axis] = -1
    q = np.clip(np.round(weight / scale.reshape(shape)), -S8_MAX, S8_MAX).astype(np.int8)
    return q, scale


def sqnr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when exact)."""
    noise = float(np.mean((reference.astype(np.float64) - approx) ** 2))
    signal = float(np.mean(reference.astype(np.float64) ** 2))
    if noise == 0.0:
        return float("inf")
    return 10.0 * np.log10(max(signal, 1e-30) / noise)
