"""What a batch costs per request: one run of B requests stacked vs B runs of one, for the
encoder bench/serve_load.py serves, in aotc (compiled with length buckets) and onnxruntime.

    python bench/batch_cost.py [--model small|base] [--seq 64] [--batches 1,2,4,8]
        [--rounds 3] [--out bench/results/batch_cost.json]

Dynamic batching pays when one run of B rows costs less than B runs of one row. Each engine
runs in its own process, rounds alternate the engines, each size is timed as the median of
several runs after a warm-up, and the table gives the median over rounds of the time per row
and of its ratio to batch 1 (below 1.0: batching saves time). Writes JSON."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import host, versions  # noqa: E402
from serve_load import MODELS  # noqa: E402

WORKER = r"""
import json, sys, time
import numpy as np
engine, path, seq, batches, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    [int(b) for b in sys.argv[4].split(",")], int(sys.argv[5])
if engine == "aotc":
    from aotc.runtime import load
    model = load(path)
    run = model.run
else:
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    run = lambda feed: session.run(None, feed)
out = {}
for b in batches:
    rng = np.random.default_rng(b)
    feed = {"input_ids": rng.integers(0, 30000, (b, seq)).astype(np.int64),
            "attention_mask": np.ones((b, seq), np.int64),
            "token_type_ids": np.zeros((b, seq), np.int64)}
    run(feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(feed)
        times.append(time.perf_counter() - start)
    out[b] = float(np.median(times)) * 1e3
print(json.dumps(out))
"""


def measure(engine: str, path: Path, args) -> dict[int, float]:
    done = subprocess.run([sys.executable, "-c", WORKER, engine, str(path), str(args.seq),
                           ",".join(map(str, args.batches)), str(args.runs)],
                          capture_output=True, text=True, check=True)
    return {int(b): ms for b, ms in json.loads(done.stdout.splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batches", default="1,2,4,8",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default="bench/results/batch_cost.json")
    args = parser.parse_args()
    import aotc
    from aotc.atomic import write_bytes
    from aotc.examples.dynamic_transformers import export
    with tempfile.TemporaryDirectory(prefix="aotc-batch-cost-") as tmp:
        onnx_path = export("bert", Path(tmp) / "encoder.onnx", **MODELS[args.model])
        buckets = tuple(sorted({16, 32, args.seq}))
        aotc.compile(onnx_path, output=Path(tmp) / "encoder.so",
                     options=aotc.CompileOptions(buckets={"seq": buckets}))
        paths = {"aotc": Path(tmp) / "encoder.so", "onnxruntime": onnx_path}
        rounds: dict[str, list[dict[int, float]]] = {e: [] for e in paths}
        for r in range(args.rounds):
            for engine, path in paths.items():
                rounds[engine].append(measure(engine, path, args))
                print(f"round {r + 1} {engine}: {rounds[engine][-1]}", flush=True)
    rows = []
    for engine, results in rounds.items():
        for b in args.batches:
            per_row = [res[b] / b for res in results]
            ratio = [res[b] / b / res[1] for res in results if 1 in res]
            rows.append({"engine": engine, "batch": b,
                         "ms_per_run": float(np.median([res[b] for res in results])),
                         "ms_per_row": float(np.median(per_row)),
                         "per_row_vs_batch_1": float(np.median(ratio)) if ratio else None})
    out = Path(args.out)
    write_bytes(out, json.dumps({
        "host": host(), "versions": versions(), "command": " ".join(["python", *sys.argv]),
        "model": MODELS[args.model], "seq": args.seq, "rounds": args.rounds,
        "runs": args.runs, "rows": rows}, indent=1).encode())
    for row in rows:
        print(row)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
