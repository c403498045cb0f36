"""aotc untuned and tuned vs onnxruntime vs torch, batch 1, same inputs, each engine in its
own process.

    python bench/bench_models.py [--models resnet18,vit,...] [--rounds 3] [--runs 30]
        [--out bench/results/latest.json]

Timings on these VMs swing 2-3x between runs, and two engines timed in one process disturb each
other (onnxruntime's threads spin after each run). So every engine runs in a fresh process, the
engines alternate for --rounds rounds (order reversed every other round), and the reported
ratio is the median of the per-round ratios. Every engine runs with its defaults, as users get
them (aotc: every allowed core; no thread count is set here). "aotc" is compiled without
tuning logs; "aotc_tuned" (only where a shipped log in tuning_logs/ applies) with them.

Models: the examples, the architecture classes of examples/architectures.py (vit,
efficientnet, convnext, gpt, unet) and any model of onnx's light zoo (light_resnet50, ...;
no torch column for those). Prints a table, writes JSON and a bar plot next to it."""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_MODELS = "resnet18,mobilenetv2,bert,vit,efficientnet,convnext,gpt,unet,light_resnet50"

# One timer per engine; each prints its median latency in ms as its last line.
TIMERS = {
    "aotc_tuned": """
import aotc
from aotc.runtime.inputs import random_inputs
model = aotc.load(TUNED); feed = random_inputs(model.signature, seed=0)
run = lambda: model.run(feed)
""",
    "aotc": """
import aotc
from aotc.runtime.inputs import random_inputs
model = aotc.load(ARTIFACT); feed = random_inputs(model.signature, seed=0)
run = lambda: model.run(feed)
""",
    "onnxruntime": """
import aotc, onnxruntime as ort
from aotc.runtime.inputs import random_inputs
feed = random_inputs(aotc.load(ARTIFACT).signature, seed=0)
session = ort.InferenceSession(ONNX, providers=["CPUExecutionProvider"])
run = lambda: session.run(None, feed)
""",
    "torch": """
import aotc, torch
from aotc.examples import models
from aotc.runtime.inputs import random_inputs
feed = random_inputs(aotc.load(ARTIFACT).signature, seed=0)
module, _ = models.build(NAME); tensors = [torch.from_numpy(v) for v in feed.values()]
def run():
    with torch.no_grad():
        module(*tensors)
""",
}
MEASURE = """
import time, numpy as np
for _ in range(WARMUP): run()
times = []
for _ in range(RUNS):
    start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
print(float(np.median(times)) * 1e3)
"""


def source_model(name: str, work: Path) -> Path:
    """The ONNX file of an example/architecture (exported once) or of onnx's light zoo."""
    if name.startswith("light_"):
        import onnx
        return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"
    from aotc.examples.export_onnx import export
    return export(name, work)


def time_engine(engine: str, name: str, onnx_path: Path, artifact: Path, runs: int) -> float:
    """Median latency (ms) of one engine, measured in a fresh process."""
    tuned = artifact.with_name(artifact.stem + ".tuned.so")
    script = (TIMERS[engine] + MEASURE).replace("TUNED", repr(str(tuned))).replace(
        "ARTIFACT", repr(str(artifact))).replace(
        "ONNX", repr(str(onnx_path))).replace("NAME", repr(name)).replace(
        "WARMUP", "5").replace("RUNS", str(runs))
    return median_ms_in_subprocess([script], f"{engine} on {name}")


def median_ms_in_subprocess(args: list[str], what: str) -> float:
    """Run ``python -c *args`` in a fresh process; its last line of output is a latency in ms."""
    out = subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed: {out.stderr.strip()[-800:]}")
    return float(out.stdout.strip().splitlines()[-1])


def bench_model(name: str, work: Path, rounds: int, runs: int) -> dict:
    import aotc
    from aotc.examples import models
    onnx_path = source_model(name, work)
    artifact = work / f"{name}.so"
    meta = aotc.compile(onnx_path, output=artifact, shipped_logs=False)
    tuned = aotc.compile(onnx_path, output=artifact.with_name(f"{name}.tuned.so"))
    engines = (["aotc"] + (["aotc_tuned"] if tuned["tuned_kernels"] else []) + ["onnxruntime"]
               + (["torch"] if name in models.MODELS else []))
    per_round = []
    for k in range(rounds):
        order = engines if k % 2 == 0 else engines[::-1]
        per_round.append({e: time_engine(e, name, onnx_path, artifact, runs) for e in order})
    row = {"model": name, "compile_s": meta["compile_seconds"], "rounds": per_round,
           "tuned_kernels": len(tuned["tuned_kernels"])}
    for engine in engines:
        row[f"{engine}_ms"] = statistics.median(r[engine] for r in per_round)
        if engine != "aotc":
            row[f"aotc_vs_{engine}"] = statistics.median(r["aotc"] / r[engine] for r in per_round)
        if engine != "aotc_tuned" and "aotc_tuned" in engines:
            row[f"aotc_tuned_vs_{engine}"] = statistics.median(
                r["aotc_tuned"] / r[engine] for r in per_round)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", default="bench/results/latest.json")
    args = parser.parse_args()
    from aotc.runtime._tvm_runtime import num_threads
    work = scratch_folder("aotc-bench-")
    bench_all(args.models.split(","), lambda name: bench_model(name, work, args.rounds, args.runs),
              _format, Path(args.out), _plot,
              {"aotc_threads": num_threads(), "rounds": args.rounds, "runs": args.runs})


def scratch_folder(prefix: str) -> Path:
    """A new temporary folder for a bench's models and artifacts, removed when the bench
    exits (a run over the standard models leaves several GB)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def bench_all(names, bench, format_row, out: Path, plot, settings: dict) -> list[dict]:
    """``bench(name)`` for every model, each row printed as it comes; then the JSON (settings
    plus rows) at ``out`` and ``plot(rows, png path)`` next to it (None: no matplotlib)."""
    rows = []
    for name in names:
        rows.append(bench(name))
        print(format_row(rows[-1]), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**settings, "rows": rows}, indent=2))
    print(f"wrote {out}")
    path = plot(rows, out.with_suffix(".png"))
    print(f"wrote {path}" if path else "matplotlib not installed: no plot (pip install '.[bench]')")
    return rows


def _plot(rows: list[dict], path: Path) -> Path | None:
    """Bars of aotc's latency relative to onnxruntime (and torch) per model; None without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(9, 4))
    series = [("aotc_vs_onnxruntime", "aotc untuned / onnxruntime"),
              ("aotc_tuned_vs_onnxruntime", "aotc tuned / onnxruntime"),
              ("aotc_vs_torch", "aotc untuned / torch")]
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        xs = [j + (i - 1) * width for j, row in enumerate(rows) if key in row]
        ax.bar(xs, [row[key] for row in rows if key in row], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [row["model"] for row in rows], rotation=20)
    ax.set_ylabel("latency ratio, median of rounds (lower is better)")
    ax.set_title("aotc, batch 1, default threads, one process per engine")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _format(row: dict) -> str:
    torch_ms = f"{row['torch_ms']:8.2f}" if "torch_ms" in row else "       -"
    vs_torch = f"{row['aotc_vs_torch']:5.2f}x" if "aotc_vs_torch" in row else "     -"
    tuned = (f"  tuned {row['aotc_tuned_ms']:8.2f} ms ({row['tuned_kernels']} kernels) "
             f"tuned/ort {row['aotc_tuned_vs_onnxruntime']:5.2f}x "
             f"tuned/untuned {row['aotc_tuned_vs_aotc']:5.2f}x"
             if "aotc_tuned_ms" in row else "")
    return (f"{row['model']:16s} aotc {row['aotc_ms']:8.2f} ms  onnxruntime "
            f"{row['onnxruntime_ms']:8.2f} ms  torch {torch_ms} ms  aotc/ort "
            f"{row['aotc_vs_onnxruntime']:5.2f}x  aotc/torch {vs_torch}{tuned}")


if __name__ == "__main__":
    main()
