"""The accuracy report of an int8 compile: the int8 model against the float32 one on the
same samples (held-out ones when given), and the layers whose quantization loses the most.

  outputs  per output: max |int8 - fp32|, cosine similarity (over all samples), and for a
           classifier-shaped output ([batch, classes], classes > 1) the top-1 agreement
  layers   per int8 layer: SQNR (dB) of its activation's quantization on the samples and of
           its weights' (per-channel) quantization, worst first"""

from __future__ import annotations

import numpy as np

from aotc.options import DYNAMIC

from ..contraction_sites import Site
from .calibrate import CalibrationRun
from .params import ActivationParams, quantize_weight, sqnr_db


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))


def _classifier(shape: tuple) -> bool:
    return len(shape) == 2 and shape[1] > 1


def output_errors(names: list[str], reference: list[list[np.ndarray]],
                  quantized: list[list[np.ndarray]]) -> list[dict]:
    """Per output, over samples (each a list of outputs in signature order)."""
    rows = []
    for i, name in enumerate(names):
        ref = np.stack([r[i] for r in reference]).astype(np.float64)
        got = np.stack([q[i] for q in quantized]).astype(np.float64)
        row = {"output": name, "max_abs_error": float(np.abs(ref - got).max()),
               "cosine": _cosine(ref, got)}
        if _classifier(reference[0][i].shape):
            row["top1_agreement"] = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
        rows.append(row)
    return rows


def output_lines(rows: list[dict]) -> list[str]:
    """output_errors' rows as lines of a report table."""
    lines = []
    for row in rows:
        top1 = (f", argmax agreement {row['top1_agreement']:.1%} (top-1, for a classifier)"
                if "top1_agreement" in row else "")
        lines.append(f"  {row['output']}: max |diff| {row['max_abs_error']:.4g}, cosine "
                     f"{row['cosine']:.5f}{top1}")
    return lines


def layer_errors(run: CalibrationRun, sites: list[Site], ranges: dict, samples: list[dict],
                 owner_of: dict[str, str]) -> list[dict]:
    """Per int8 layer, worst activation SQNR first."""
    signal = {s.name: [] for s in sites}
    for feed in samples:
        _, activations = run.run(feed)
        for site in sites:
            x = activations[owner_of[site.name]]
            measured = ranges[site.name]
            params = ActivationParams.from_range(
                *((x.min(), x.max()) if measured == DYNAMIC else measured))
            signal[site.name].append(sqnr_db(x, params.fake_quantize(x)))
    rows = []
    for site in sites:
        weight = site.weight()
        wq, sw = quantize_weight(weight, site.weight_axis)
        shape = [1] * weight.ndim
        shape[site.weight_axis] = -1
        measured = ranges[site.name]
        rows.append({"layer": site.name,
                     "activation_range": measured if measured == DYNAMIC else list(measured),
                     "activation_sqnr_db": float(np.median(signal[site.name])),
                     "weight_sqnr_db": sqnr_db(weight, wq * sw.reshape(shape))})
    return sorted(rows, key=lambda r: r["activation_sqnr_db"])


def table(report: dict) -> str:
    ranges = ("per run for matmuls" if report["mode"] == "int8-dynamic" else "") + (
        f"{', ' if report['mode'] == 'int8-dynamic' else ''}{report['method']} calibration"
        if report["calibrated_layers"] else "")
    lines = [f"{report['mode']} accuracy on {report['samples']} {report['evaluated_on']} "
             f"(activation ranges: {ranges}):"]
    lines += output_lines(report["outputs"])
    lines.append(f"  {report['int8_layers']} int8 layers; float32: "
                 + (", ".join(f"{k} ({v})" for k, v in report["float32_layers"].items())
                    or "none"))
    lines.append("  largest error (activation / weight SQNR, dB): " + ", ".join(
        f"{r['layer']} {r['activation_sqnr_db']:.1f}/{r['weight_sqnr_db']:.1f}"
        for r in report["layers"][:5]))
    return "\n".join(lines)
