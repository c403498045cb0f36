"""Tuning throughput through a device farm on loopback: trials per minute with 1, 2 and 3
TVM RPC servers of one key (real tracker and servers, this machine's CPU as the devices).

    python bench/farm_throughput.py [--servers 1,2,3] [--trials 32] [--model resnet18|tiny]
        [--out bench/results/farm.json]     (servers 0: the same tuning locally)

Here the servers, the builder and the tuner share 2 cores, so more servers cannot scale the
way separate boards would: the figure shows the overhead of remote measurement and how much
parallel measuring still buys on one machine."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import aotc
from aotc.farm_daemons import LoopbackFarm


def model_path(name: str, folder: Path) -> Path:
    if name == "tiny":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import onnx
        from onnx_builders import tiny_cnn
        path = folder / "tiny.onnx"
        onnx.save(tiny_cnn(), path)
        return path
    from aotc.examples.export_onnx import export
    return export(name, folder)


def one_run(model: Path, servers: int, trials: int, folder: Path) -> dict:
    """Tune through a farm of ``servers`` servers (0: locally, without a farm)."""
    if servers == 0:
        start = time.perf_counter()
        report = aotc.tune(model, "x86", folder / "local.jsonl", trials=trials)
        return _row(0, report, time.perf_counter() - start)
    farm = LoopbackFarm(servers, key="bench")
    try:
        start = time.perf_counter()
        report = aotc.tune(model, "x86", folder / f"farm{servers}.jsonl", trials=trials,
                           rpc=farm.address, key="bench")
        seconds = time.perf_counter() - start
    finally:
        farm.stop()
    return _row(servers, report, seconds)


def _row(servers: int, report, seconds: float) -> dict:
    """Seconds are the whole aotc.tune call: task extraction, search and the reference
    measurements."""
    return {"servers": servers, "trials": report.trials, "seconds": round(seconds, 1),
            "trials_per_minute": round(60 * report.trials / seconds, 1),
            "failed": sum(1 for r in report.results if r.tuned_seconds is None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="0,1,2,3", help="0: tune locally, no farm")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", type=Path, default=Path("bench/results/farm.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aotc-farm-bench-") as tmp:
        model = model_path(args.model, Path(tmp))
        rows = [one_run(model, int(n), args.trials, Path(tmp)) for n in args.servers.split(",")]
    print(f"{'servers':>7s} {'trials':>6s} {'seconds':>8s} {'trials/min':>10s}")
    for row in rows:
        print(f"{row['servers']:7d} {row['trials']:6d} {row['seconds']:8.1f} "
              f"{row['trials_per_minute']:10.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
