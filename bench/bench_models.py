"""aotc (untuned) vs onnxruntime vs torch, batch 1, same inputs, same run.

    python bench/bench_models.py [--threads N] [--runs 30] [--out bench/results/latest.json]

Without --threads every engine runs with its own defaults, as users get them (aotc: every
allowed core). Engines share one process here; issue 6 asks for one process per engine.

Prints a table of medians and ratios and writes JSON. Models: the three examples and the onnx
package's light ResNet-50 (no torch definition of that one, so no torch column)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--models", default="resnet18,mobilenetv2,bert,light_resnet50")
    parser.add_argument("--out", default="bench/results/latest.json")
    args = parser.parse_args()
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before the TVM runtime starts

    import numpy as np
    import onnx
    import torch

    import aotc
    from aotc.bench import onnxruntime_session, time_callable
    from aotc.examples import models
    from aotc.examples.export_onnx import export
    from aotc.runtime.inputs import random_inputs

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="aotc-bench-"))
    light = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    rows = []
    for name in args.models.split(","):
        onnx_path = light if name == "light_resnet50" else export(name, work)
        meta = aotc.compile(onnx_path, output=work / f"{name}.so")
        model = aotc.load(work / f"{name}.so")
        feed = random_inputs(model.signature, seed=0)
        median = lambda fn: float(np.median(time_callable(fn, args.runs, 3))) * 1e3  # noqa: E731
        row = {"model": name, "compile_s": meta["compile_seconds"],
               "aotc_ms": median(lambda: model.run(feed))}
        session = onnxruntime_session(str(onnx_path), args.threads)
        row["onnxruntime_ms"] = median(lambda: session.run(None, feed))
        if name in models.MODELS:
            module, _ = models.build(name)
            tensors = [torch.from_numpy(v) for v in feed.values()]
            with torch.no_grad():
                row["torch_ms"] = median(lambda: module(*tensors))
        row["aotc_vs_onnxruntime"] = row["aotc_ms"] / row["onnxruntime_ms"]
        if "torch_ms" in row:
            row["aotc_vs_torch"] = row["aotc_ms"] / row["torch_ms"]
        rows.append(row)
        print(_format(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"threads": args.threads, "runs": args.runs, "rows": rows}, indent=2))
    print(f"wrote {out}")
    plot = _plot(rows, out.with_suffix(".png"), args.threads)
    print(f"wrote {plot}" if plot else "matplotlib not installed: no plot (pip install '.[bench]')")


def _plot(rows: list[dict], path: Path, threads: int) -> Path | None:
    """Grouped bars of median latency per model and engine; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    engines = [("aotc_ms", "aotc (untuned)"), ("onnxruntime_ms", "onnxruntime"), ("torch_ms", "torch")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for i, (key, label) in enumerate(engines):
        xs = [j + (i - 1) * width for j, row in enumerate(rows) if key in row]
        ys = [row[key] for row in rows if key in row]
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks(range(len(rows)), [row["model"] for row in rows])
    ax.set_ylabel("median latency, ms (lower is better)")
    ax.set_yscale("log")
    ax.set_title(f"batch 1, {threads or 'default'} threads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _format(row: dict) -> str:
    torch_ms = f"{row['torch_ms']:8.2f}" if "torch_ms" in row else "       -"
    vs_torch = f"{row['aotc_vs_torch']:5.2f}x" if "aotc_vs_torch" in row else "     -"
    return (f"{row['model']:16s} aotc {row['aotc_ms']:8.2f} ms  onnxruntime "
            f"{row['onnxruntime_ms']:8.2f} ms  torch {torch_ms} ms  aotc/ort "
            f"{row['aotc_vs_onnxruntime']:5.2f}x  aotc/torch {vs_torch}")


if __name__ == "__main__":
    main()
