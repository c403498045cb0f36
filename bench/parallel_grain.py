"""Where a parallel loop starts to pay: one elementwise kernel of N elements, cheap (add) and
dear (exp), run with its loop on TVM's thread pool and on the calling thread.

    python bench/parallel_grain.py [--sizes 256,1024,...] [--out bench/results/parallel_grain.json]

Each size and variant is compiled by TVM directly and timed with its time evaluator (median of
repeats); variants alternate within a size. The default rules leave loop nests below
``cpu_blocks.MIN_PARALLEL_WORK`` iterations on the calling thread; this bench is what that
threshold rests on. Run it on an otherwise idle machine."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def kernel(n: int, op: str, parallel: bool, lanes: int = 16):
    import tvm
    from tvm import te

    a = te.placeholder((n,), name="A")
    if op == "exp":
        b = te.compute((n,), lambda i: te.exp(a[i]) * 0.5 + 1.0, name="B")
    else:
        b = te.compute((n,), lambda i: a[i] + 1.0, name="B")
    func = te.create_prim_func([a, b]).with_attr("global_symbol", "main")
    sch = tvm.s_tir.Schedule(func)
    (loop,) = sch.get_loops(sch.get_sblock("B"))
    outer, inner = sch.split(loop, factors=[None, lanes])
    sch.vectorize(inner)
    if parallel:
        sch.parallel(outer)
    return sch.mod


def measure(n: int, op: str, parallel: bool, target, number: int, repeat: int) -> float:
    import tvm
    lib = tvm.tirx.build(kernel(n, op, parallel), target=target)
    dev = tvm.cpu()
    a = tvm.runtime.tensor(np.random.rand(n).astype("float32"), dev)
    b = tvm.runtime.tensor(np.zeros(n, "float32"), dev)
    timer = lib.time_evaluator("main", dev, number=number, repeat=repeat)
    return float(np.median(timer(a, b).results))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,1024,4096,16384,65536,262144")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench/results/parallel_grain.json"))
    args = parser.parse_args(argv)
    from aotc.settings import apply_thread_setting
    apply_thread_setting()  # every allowed core, as aotc's runtime starts TVM's pool
    import tvm
    from peers import host

    from aotc.targets import resolve

    target = tvm.target.Target(resolve("x86").tvm_target)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for op in ("add", "exp"):
            times: dict[str, list[float]] = {"pool": [], "inline": []}
            for _ in range(args.rounds):
                for variant in ("pool", "inline"):
                    times[variant].append(measure(n, op, variant == "pool", target, 2000, 5))
            pool, inline = float(np.median(times["pool"])), float(np.median(times["inline"]))
            rows.append({"elements": n, "op": op, "pool_us": round(pool * 1e6, 3),
                         "inline_us": round(inline * 1e6, 3),
                         "pool_vs_inline": round(pool / inline, 3)})
            print(f"{n:>8} {op}: pool {pool * 1e6:8.2f} us, calling thread "
                  f"{inline * 1e6:8.2f} us", flush=True)
    data = {"bench": "parallel_grain", "host": host(),
            "threads": int(os.environ["TVM_NUM_THREADS"]), "python": platform.python_version(),
            "command": "python bench/parallel_grain.py",
            "unix_time": int(time.time()), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
