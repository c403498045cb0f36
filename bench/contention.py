"""Latency when the CPU is shared: aotc (default, adaptive parallelism), aotc with TVM's pool
always on (AOTC_PARALLELISM=pool: what aotc did before runtime/parallelism.py) and
onnxruntime, each engine in its own process, batch 1.

    python bench/contention.py [--models mobilenetv2,resnet18,bert,light_inception_v1]
        [--rounds 2] [--runs 100] [--out bench/results/contention.json]

Scenarios: quiet; one and two busy neighbours (``python -c "while True: pass"``, as many
processes); a CPU quota of one core (a cgroup with cpu.cfs_quota_us = period, or cpu.max, where
this process may create one; else ``taskset`` to one core, and the JSON says which); two
processes of the same engine running the model at once. Engines alternate within a round
(order reversed every other round); the table gives the median over rounds of each engine's
p50 and p99 (of ``--runs`` runs after 10 warm-up runs) and of the per-round ratio aotc /
onnxruntime. Nothing else should run beside it: the neighbours are the measurement."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_models import scratch_folder, source_model

ENGINES = {"aotc": {}, "aotc_pool": {"AOTC_PARALLELISM": "pool"}, "onnxruntime": {}}
SCENARIOS = ("quiet", "1 neighbour", "2 neighbours", "quota 1 core", "2 processes")
WORKER = """
import json, sys, time
import numpy as np
import aotc
from aotc.runtime.inputs import random_inputs
engine, artifact, onnx_path, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
feed = random_inputs(aotc.load(artifact, verify=False).signature, seed=0)
if engine == "onnxruntime":
    import onnxruntime as ort
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, feed)
else:
    model = aotc.load(artifact)
    run = lambda: model.run(feed)
for _ in range(10):
    run()
times = []
for _ in range(runs):
    start = time.perf_counter(); run(); times.append((time.perf_counter() - start) * 1e3)
print(json.dumps(times))
"""


class Quota:
    """A cgroup holding one CPU of quota, or None where none can be made (then taskset)."""

    def __init__(self):
        self.procs = None
        for base, write, marker in (("/sys/fs/cgroup", self._v2, "cgroup.controllers"),
                                    ("/sys/fs/cgroup/cpu", self._v1, "cpu.cfs_quota_us")):
            if not (Path(base) / marker).is_file():
                continue  # not a mounted hierarchy of that version
            folder = Path(base) / f"aotc-bench-{os.getpid()}"
            try:
                folder.mkdir()
                write(folder)
                self.procs, self.folder = folder / "cgroup.procs", folder
                return
            except OSError:
                if folder.exists():
                    folder.rmdir()

    @staticmethod
    def _v2(folder: Path) -> None:
        (folder / "cpu.max").write_text("100000 100000")

    @staticmethod
    def _v1(folder: Path) -> None:
        (folder / "cpu.cfs_period_us").write_text("100000")
        (folder / "cpu.cfs_quota_us").write_text("100000")

    @property
    def kind(self) -> str:
        return f"cgroup {self.folder}" if self.procs else "taskset (no writable cgroup)"

    def command(self, cmd: list[str]) -> list[str]:
        if self.procs:
            return cmd
        return ["taskset", "-c", str(min(os.sched_getaffinity(0))), *cmd]

    def enter(self):
        procs = self.procs
        return (lambda: procs.write_text(str(os.getpid()))) if procs else None

    def close(self) -> None:
        if self.procs:
            self.folder.rmdir()


def latencies(engine: str, artifact: Path, onnx_path: Path, runs: int, scenario: str,
              quota: Quota) -> list[float]:
    cmd = [sys.executable, "-c", WORKER, engine, str(artifact), str(onnx_path), str(runs)]
    env = {**os.environ, **ENGINES[engine]}
    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                   start_new_session=True)
                  for _ in range({"1 neighbour": 1, "2 neighbours": 2}.get(scenario, 0))]
    try:
        time.sleep(0.3 if neighbours else 0)
        copies = 2 if scenario == "2 processes" else 1
        quota_on = scenario == "quota 1 core"
        workers = [subprocess.Popen(quota.command(cmd) if quota_on else cmd, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=quota.enter() if quota_on else None)
                   for _ in range(copies)]
        times = []
        for worker in workers:
            out, err = worker.communicate(timeout=1800)
            if worker.returncode != 0:
                raise RuntimeError(f"{engine} ({scenario}) failed: {err.strip()[-600:]}")
            times += json.loads(out.strip().splitlines()[-1])
        return times
    finally:
        for neighbour in neighbours:
            os.killpg(neighbour.pid, signal.SIGKILL)
            neighbour.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def bench_model(name: str, work: Path, rounds: int, runs: int, quota: Quota) -> list[dict]:
    import aotc
    onnx_path = source_model(name, work)
    artifact = work / f"{name}.so"
    aotc.compile(onnx_path, output=artifact)
    rows = []
    for scenario in SCENARIOS:
        per_round = []
        for k in range(rounds):
            order = list(ENGINES) if k % 2 == 0 else list(ENGINES)[::-1]
            stats = {}
            for engine in order:
                times = latencies(engine, artifact, onnx_path, runs, scenario, quota)
                stats[engine] = {"p50": percentile(times, 50), "p99": percentile(times, 99)}
            per_round.append(stats)
        row = {"model": name, "scenario": scenario, "rounds": per_round}
        for engine in ENGINES:
            for q in ("p50", "p99"):
                row[f"{engine}_{q}"] = statistics.median(r[engine][q] for r in per_round)
        for q in ("p50", "p99"):
            row[f"aotc_vs_onnxruntime_{q}"] = statistics.median(
                r["aotc"][q] / r["onnxruntime"][q] for r in per_round)
        rows.append(row)
        print(_format(row), flush=True)
    return rows


def _format(row: dict) -> str:
    cells = "  ".join(f"{e} {row[f'{e}_p50']:7.2f}/{row[f'{e}_p99']:7.2f}" for e in ENGINES)
    return (f"{row['model']:20s} {row['scenario']:13s} {cells}  aotc/ort p50 "
            f"{row['aotc_vs_onnxruntime_p50']:5.2f}x p99 {row['aotc_vs_onnxruntime_p99']:5.2f}x")


def _plot(rows: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = sorted({r["model"] for r in rows}, key=[r["model"] for r in rows].index)
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        xs = range(len(mine))
        for i, engine in enumerate(ENGINES):
            ax.bar([x + (i - 1) * 0.27 for x in xs], [r[f"{engine}_p50"] for r in mine], 0.27,
                   label=engine)
        ax.set_yscale("log")
        ax.set_xticks(list(xs), [r["scenario"] for r in mine], rotation=30, fontsize=8)
        ax.set_title(model)
        ax.set_ylabel("p50 latency, ms (log)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mobilenetv2,resnet18,bert,light_inception_v1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out", default="bench/results/contention.json")
    args = parser.parse_args()
    work = scratch_folder("aotc-contention-")
    quota = Quota()
    try:
        rows = [row for name in args.models.split(",")
                for row in bench_model(name, work, args.rounds, args.runs, quota)]
    finally:
        quota.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    host = {"machine": platform.machine(), "cpu": _cpu_name(),
            "cores": len(os.sched_getaffinity(0))}
    out.write_text(json.dumps({"host": host, "command": " ".join(["python", *sys.argv]),
                               "quota": quota.kind, "rounds": args.rounds,
                               "runs": args.runs, "rows": rows}, indent=2))
    print(f"wrote {out}")
    plot = _plot(rows, out.with_suffix(".png"))
    print(f"wrote {plot}" if plot else "no matplotlib: no plot")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    main()
