"""Cost of GuardIndices (the range check on every gather/scatter index) on in-range inputs.

    python bench/guard_overhead.py [--model bert] [--rounds 5] [--runs 30]

Compiles the model twice, with and without the pass, then times each build in its own process,
alternating them for several rounds (timings on these VMs swing 2-3x between runs; two engines
in one process disturb each other). Prints the median of the per-round ratios and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TIMER = """
import sys, time, numpy as np, aotc
from aotc.runtime.inputs import random_inputs
m = aotc.load(sys.argv[1]); feed = random_inputs(m.signature, seed=0)
for _ in range(5): m.run(feed)
t = []
for _ in range(int(sys.argv[2])):
    s = time.perf_counter(); m.run(feed); t.append(time.perf_counter() - s)
print(np.median(t) * 1e3)
"""


def build(name: str, work: Path, guarded: bool) -> Path:
    import aotc
    from aotc.compiler import pipeline
    from aotc.compiler.passes import GuardIndices
    from aotc.examples.export_onnx import export

    onnx_path = export(name, work)
    original = pipeline.phases
    if not guarded:
        def phases(spec):
            return [(phase, [p for p in passes if not isinstance(p, type(GuardIndices()))])
                    for phase, passes in original(spec)]
        pipeline.phases = phases
    try:
        out = work / f"{name}_{'guarded' if guarded else 'unguarded'}.so"
        aotc.compile(onnx_path, output=out)
    finally:
        pipeline.phases = original
    return out


def time_in_process(artifact: Path, runs: int) -> float:
    out = subprocess.run([sys.executable, "-c", TIMER, str(artifact), str(runs)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="bert")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", default="bench/results/guard_overhead.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aotc-guard-"))
    guarded, unguarded = build(args.model, work, True), build(args.model, work, False)
    rows = []
    for k in range(args.rounds):
        pair = [(guarded, "guarded"), (unguarded, "unguarded")]
        timings = {label: time_in_process(path, args.runs)
                   for path, label in (pair if k % 2 == 0 else pair[::-1])}
        timings["ratio"] = timings["guarded"] / timings["unguarded"]
        rows.append(timings)
        print(f"round {k}: guarded {timings['guarded']:.2f} ms, unguarded "
              f"{timings['unguarded']:.2f} ms, ratio {timings['ratio']:.3f}", flush=True)
    median = statistics.median(r["ratio"] for r in rows)
    print(f"{args.model}: guarded / unguarded, median of per-round ratios: {median:.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "runs": args.runs, "rounds": rows,
                               "median_ratio": median}, indent=2))


if __name__ == "__main__":
    main()
