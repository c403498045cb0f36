"""RL search vs. MetaSchedule's evolutionary search on the same kernels, at equal budgets.

    python bench/tuning.py [--budgets 32,64,128,256] [--seeds 0,1,2] [--tasks conv,dense,dw]
        [--searches rl,evolutionary] [--out bench/results/tuning.json]

Kernels, as compile produces them (same passes): a 3x3 conv2d of ResNet-18 (28x28x128), a
dense of the BERT encoder's FFN (128x768x3072) and a 3x3 depthwise conv of MobileNetV2
(28x28x192). Each (kernel, search, seed) is one tuning run of the largest budget; the best
latency at each smaller budget is read off its tuning curve (the best measured after N
trials). Both searches use the same space, cost model, builder and runner. Prints a table
(median over seeds), how many trials the RL search needed to reach the evolutionary search's
best-at-N, writes JSON and a plot next to it."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# kernel -> (example model, task name in the compiled module)
TASKS = {
    "conv": ("resnet18", "fused_conv2d4_add3_relu2"),
    "dense": ("bert", "fused_matmul4_add3"),
    "dw": ("mobilenetv2", "fused_conv2d12_add9"),
}


def find_tasks(names: list[str]):
    """kernel -> (Task, target, default_schedule)."""
    from aotc.api import tuning_tasks
    from aotc.examples import models
    found = {}
    for model in sorted({TASKS[n][0] for n in names}):
        module, example = models.build(model)
        tasks, target, default_schedule = tuning_tasks(module, example_inputs=example)
        by_name = {t.name: t for t in tasks}
        for name in names:
            if TASKS[name][0] == model:
                found[name] = (by_name[TASKS[name][1]], target, default_schedule)
    return found


def tune_once(task, target, default_schedule, search: str, seed: int, trials: int) -> dict:
    from aotc.schedules.tune import Budget, tune
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        report = tune([task], target, Budget(trials), Path(work) / "log.jsonl",
                      default_schedule, search=search, seed=seed)
    result = report.results[0]
    return {"search": search, "seed": seed, "trials": report.trials,
            "seconds": time.perf_counter() - start, "default_s": result.default_seconds,
            "curve": result.curve, "ranking_accuracy": report.ranking_accuracy}


def summarize(runs: list[dict], budgets: list[int]) -> list[dict]:
    from aotc.schedules.report import best_at
    rows = []
    for kernel in sorted({r["kernel"] for r in runs}):
        mine = [r for r in runs if r["kernel"] == kernel]
        for n in budgets:
            row = {"kernel": kernel, "budget": n}
            for search in sorted({r["search"] for r in mine}):
                bests = [best_at(r["curve"], n) for r in mine if r["search"] == search]
                bests = [b for b in bests if b is not None]
                row[search] = statistics.median(bests) if bests else None
            row["rl_trials_to_evo_best"] = _trials_to_reach(mine, n)
            rows.append(row)
    return rows


def _trials_to_reach(runs: list[dict], n: int):
    """Median over seeds of the first RL trial whose best is at most the evolutionary
    search's best-at-n of the same seed (None where RL never got there)."""
    from aotc.schedules.report import best_at
    reached = []
    for evo in (r for r in runs if r["search"] == "evolutionary"):
        rl = next((r for r in runs if r["search"] == "rl" and r["seed"] == evo["seed"]), None)
        target = best_at(evo["curve"], n)
        if rl is None or target is None:
            continue
        hit = next((p[0] for p in rl["curve"] if p[2] <= target), None)
        reached.append(hit if hit is not None else float("inf"))
    if not reached:
        return None
    median = statistics.median(reached)
    return None if median == float("inf") else median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="32,64,128,256")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--searches", default="rl,evolutionary")
    parser.add_argument("--out", default="bench/results/tuning.json")
    parser.add_argument("--replot", metavar="JSON", help="Only redraw the plot of a result file.")
    args = parser.parse_args()
    if args.replot:
        print(f"wrote {_plot(json.loads(Path(args.replot).read_text())['runs'], Path(args.replot).with_suffix('.png'))}")
        return
    budgets = [int(b) for b in args.budgets.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.tasks.split(",")
    runs = []
    for name, (task, target, default_schedule) in find_tasks(names).items():
        for seed in seeds:
            for search in args.searches.split(","):
                run = tune_once(task, target, default_schedule, search, seed, max(budgets))
                runs.append({"kernel": name, "task": task.name, **run})
                print(f"{name} {search} seed {seed}: best "
                      f"{min((p[2] for p in run['curve']), default=float('nan')) * 1e3:.4f} ms "
                      f"(default {run['default_s'] * 1e3:.4f}) in {run['seconds']:.0f} s, "
                      f"{run['trials'] / run['seconds']:.2f} trials/s", flush=True)
    rows = summarize(runs, budgets)
    for line in _format(rows):
        print(line)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "runs": runs, "summary": rows},
                              indent=1))
    print(f"wrote {out}")
    plot = _plot(runs, out.with_suffix(".png"))
    if plot:
        print(f"wrote {plot}")


def _format(rows: list[dict]) -> list[str]:
    def ms(v):
        return f"{v * 1e3:10.4f}" if v else f"{'-':>10s}"
    lines = [f"{'kernel':6s} {'trials':>6s} {'rl ms':>10s} {'evo ms':>10s}  rl trials to evo best"]
    for r in rows:
        reach = r["rl_trials_to_evo_best"]
        lines.append(f"{r['kernel']:6s} {r['budget']:6d} {ms(r.get('rl'))} "
                     f"{ms(r.get('evolutionary'))}  "
                     + (f"{reach:.0f}" if reach is not None else "not reached"))
    return lines


def _plot(runs: list[dict], path: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from aotc.schedules.report import draw_curve, extended
    kernels = sorted({r["kernel"] for r in runs})
    fig, axes = plt.subplots(1, len(kernels), figsize=(5 * len(kernels), 3.5), squeeze=False)
    for ax, kernel in zip(axes.flat, kernels):
        mine = [r for r in runs if r["kernel"] == kernel]
        series = {f"{r['search']} seed {r['seed']}":
                  extended([(p[0], p[2]) for p in r["curve"]], r["trials"]) for r in mine}
        draw_curve(ax, series, mine[0]["default_s"], f"{kernel}: {mine[0]['task']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
