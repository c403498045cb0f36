"""The tuning report (``aotc tune-report LOG``): per-task results and tuning curves from a
log, as a table and as PNG plots (best latency against trials, per task and for the model's
kernels end to end, with the default rules' time as the line to beat)."""

from __future__ import annotations

from pathlib import Path

from .log import Record


def best_at(curve: list, trials: int, column: int = 0) -> float | None:
    """Best seconds after ``trials`` trials (of the task, or of the run with column=1)."""
    best = None
    for point in curve:
        if point[column] <= trials:
            best = point[2]
    return best


def latest_per_task(records: list[Record]) -> list[Record]:
    """One record per workload and target: the last one written (a log appends)."""
    latest: dict[tuple[str, str], Record] = {}
    for record in records:
        latest[(record.workload, record.target)] = record
    return list(latest.values())


def table(records: list[Record]) -> list[str]:
    lines = [f"{'task':40s} {'calls':>5s} {'trials':>6s} {'search':>12s} {'default ms':>10s} "
             f"{'tuned ms':>9s} {'speed-up':>8s}"]
    for r in records:
        lines.append(f"{r.task[:40]:40s} {r.calls:5d} {r.trials:6d} {r.search:>12s} "
                     f"{r.default_seconds * 1e3:10.4f} {r.seconds * 1e3:9.4f} "
                     f"{r.default_seconds / r.seconds:7.2f}x")
    default = sum(r.calls * r.default_seconds for r in records)
    tuned = sum(r.calls * (r.seconds if r.beats_default else r.default_seconds)
                for r in records)  # what compile applies
    lines.append(f"these kernels, weighted by calls: default {default * 1e3:.3f} ms, "
                 f"with the log {tuned * 1e3:.3f} ms ({default / max(tuned, 1e-12):.2f}x)")
    return lines


def end_to_end_curve(records: list[Record]) -> list[tuple[int, float]]:
    """(run trials, weighted kernel time) after each improvement of any task: every kernel
    counts at its best so far, or at its default time when that is still better."""
    total = max((p[1] for r in records for p in r.curve), default=0)
    points = sorted({p[1] for r in records for p in r.curve} | {total})
    return [(n, sum(r.calls * min(best_at(r.curve, n, 1) or r.default_seconds,
                                  r.default_seconds) for r in records)) for n in points]


def plot(records: list[Record], out_dir: str | Path) -> list[Path]:
    """tasks.png (one panel a task) and end_to_end.png; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "tasks.png", out_dir / "end_to_end.png"]
    columns = min(4, max(1, len(records)))
    rows = (len(records) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    for ax, record in zip(axes.flat, records):
        draw_curve(ax, {record.search: extended([(p[0], p[2]) for p in record.curve],
                                                record.trials)},
                   record.default_seconds, record.task[:32])
    for ax in list(axes.flat)[len(records):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)
    fig, ax = plt.subplots(figsize=(6, 4))
    draw_curve(ax, {"tuned": end_to_end_curve(records)},
               sum(r.calls * r.default_seconds for r in records),
               "these kernels end to end (weighted by calls)")
    ax.set_xlabel("trials of the run")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close("all")
    return paths


def extended(points: list[tuple[int, float]], trials: int) -> list[tuple[int, float]]:
    """A curve of improvements carried on flat to the last trial."""
    return points + [(trials, points[-1][1])] if points and trials > points[-1][0] else points


def draw_curve(ax, series: dict[str, list[tuple[int, float]]], default_seconds, title) -> None:
    """Step curves of best ms against trials (log scale: the first candidates are often 10x
    off), and the default rules' time dashed."""
    for label, points in series.items():
        if points:
            xs, ys = zip(*points)
            ax.step(xs, [y * 1e3 for y in ys], where="post", label=label)
    if default_seconds:
        ax.axhline(default_seconds * 1e3, linestyle="--", color="grey", label="default rules")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("trials")
    ax.set_ylabel("best ms")
    ax.legend(fontsize=7)
