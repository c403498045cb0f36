"""C++ runner (bin/aotc-run of a bundle) vs the Python runtime on the same compiled model:
start-up (a fresh process until its first result: load + one run) and latency (median over
--runs), each engine in its own process, alternated for --rounds rounds; ratios are medians of
the per-round ratios. Both use their defaults (every allowed core).

    python bench/cpp_runner.py [--models resnet18,mobilenetv2,bert] [--rounds 3] [--runs 50]
        [--out bench/results/cpp_runner.json]"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON_TIMER = """
import sys, time
start = time.perf_counter()
import aotc.runtime
from aotc.runtime.inputs import random_inputs
model = aotc.runtime.load(sys.argv[1]); feed = random_inputs(model.signature, seed=0)
model.run(feed)
first = time.perf_counter() - start
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); model.run(feed); times.append((time.perf_counter() - t) * 1e3)
times.sort()
print(f"first {first * 1e3:.1f} p50 {times[len(times) // 2]:.3f}")
"""


def time_process(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return (time.perf_counter() - start) * 1e3, done.stdout


def one_round(engine: str, so: Path, runner: Path, runs: int) -> dict:
    """{"startup_ms": wall time of a process that loads and runs once, "p50_ms": ...}."""
    if engine == "python":
        startup, _ = time_process([sys.executable, "-c", PYTHON_TIMER, str(so), "1"])
        _, out = time_process([sys.executable, "-c", PYTHON_TIMER, str(so), str(runs)])
        return {"startup_ms": startup, "p50_ms": float(re.search(r"p50 ([0-9.]+)", out).group(1))}
    startup, _ = time_process([str(runner), str(so), "--runs", "1"])
    _, out = time_process([str(runner), str(so), "--runs", str(runs), "--warmup", "3"])
    return {"startup_ms": startup, "p50_ms": float(re.search(r"p50 ([0-9.]+)", out).group(1))}


def bench_model(name: str, folder: Path, rounds: int, runs: int) -> dict:
    import aotc
    from aotc.examples.export_onnx import export
    from aotc.package import package
    so = folder / f"{name}.so"
    aotc.compile(export(name, folder), target="x86", output=so)
    bundle = package(so, folder / f"{name}_bundle")
    results = {"python": [], "cpp": []}
    for r in range(rounds):
        for engine in (("python", "cpp") if r % 2 == 0 else ("cpp", "python")):
            results[engine].append(one_round(engine, so, bundle.runner, runs))

    def ratio(key):
        return statistics.median(c[key] / p[key] for c, p in zip(results["cpp"], results["python"]))

    def med(engine, key):
        return statistics.median(x[key] for x in results[engine])
    return {"model": name, "rounds": results,
            "bundle_runtime_mb": round(bundle.runtime_bytes / 1e6, 2),
            **{f"{e}_{k}": round(med(e, k), 3) for e in results for k in ("startup_ms", "p50_ms")},
            "startup_ratio_cpp_over_python": round(ratio("startup_ms"), 3),
            "p50_ratio_cpp_over_python": round(ratio("p50_ms"), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenetv2,bert")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpp_runner.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aotc-cpp-bench-") as tmp:
        rows = [bench_model(m, Path(tmp), args.rounds, args.runs) for m in args.models.split(",")]
    print(f"{'model':12s} {'startup py ms':>13s} {'startup C++ ms':>14s} {'ratio':>6s} "
          f"{'p50 py ms':>10s} {'p50 C++ ms':>10s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['model']:12s} {r['python_startup_ms']:13.1f} {r['cpp_startup_ms']:14.1f} "
              f"{r['startup_ratio_cpp_over_python']:6.2f} {r['python_p50_ms']:10.3f} "
              f"{r['cpp_p50_ms']:10.3f} {r['p50_ratio_cpp_over_python']:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rounds": args.rounds, "runs": args.runs, "rows": rows},
                                   indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
