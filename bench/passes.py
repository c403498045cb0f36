"""What aotc's pipeline is worth against TVM's default one, and each pass within it.

    python bench/passes.py [--models resnet18,mobilenetv2,bert,vit,light_resnet50] [--rounds 3]
        [--runs 10] [--passes FoldChannelAffine,ConvertLayoutNHWC,...] [--out
        bench/results/passes.json]

Per model, builds: TVM's default pipeline on aotc's imported Relax (``relax.build`` with
``relax_pipeline="default"``: legalize, fuse, no schedules), aotc at its default level, and
aotc with each listed pass disabled. For each: kernel count (fused PrimFuncs), planned and
unplanned activation memory, and the median latency, every build timed in its own process,
alternating with onnxruntime for --rounds rounds (order reversed every other round); the
ratio to onnxruntime is the median of the per-round ratios. Default thread counts. Prints a
table per model and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_models import median_ms_in_subprocess, scratch_folder, source_model  # noqa: E402

DEFAULT_PASSES = ("FoldChannelAffine,ConvertLayoutNHWC,FuseAttention,PrepackWeights,FuseOps,"
                  "ApplyRulesSafely,VectorMath,FoldConstantsNumpy")
TIMER = """
import json, sys, time, numpy as np
kind, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
saved = np.load(sys.argv[4] + "/feed.npz")
names = json.load(open(sys.argv[4] + "/names.json"))
feed = {n: saved[f"in{i}"] for i, n in enumerate(names)}
if kind == "onnxruntime":
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, feed)
elif kind == "tvm":
    import tvm
    from tvm import relax
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    args = [tvm.runtime.tensor(feed[n]) for n in names]
    run = lambda: vm["main"](*args)
else:
    import aotc
    model = aotc.load(path)
    run = lambda: model.run(feed)
run()
times = []
for _ in range(runs):
    start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
print(float(np.median(times)) * 1e3)
"""


def build_variants(onnx_path: Path, work: Path, passes: list[str]) -> list[dict]:
    """[{name, kind, path, kernels, memory}] for TVM's default pipeline, aotc, aotc without
    each pass."""
    import aotc
    variants = [_tvm_default(onnx_path, work)]
    for disabled in [None] + passes:
        name = "aotc" if disabled is None else f"aotc -{disabled}"
        out = work / f"{onnx_path.stem}_{disabled or 'all'}.so"
        meta = aotc.compile(onnx_path, output=out, options=aotc.CompileOptions(
            disabled_passes=(disabled,) if disabled else ()))
        variants.append({"name": name, "kind": "aotc", "path": str(out),
                         "kernels": len(meta["kernels"]), "memory": meta["memory"]})
    return variants


def _tvm_default(onnx_path: Path, work: Path) -> dict:
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline

    from aotc.compiler import import_model
    from aotc.compiler.memory_report import memory_report
    from aotc.targets import resolve
    target = tvm.target.Target(resolve("x86").tvm_target)
    mod = import_model(onnx_path).mod
    with target:
        fused = tvm.transform.Sequential(cpu_pipeline.library_dispatch_passes(target)
                                         + cpu_pipeline.legalize_passes(target))(mod)
    kernels = sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in fused.functions_items())
    out = work / f"{onnx_path.stem}_tvm_default.so"
    relax.build(mod, target, relax_pipeline="default").export_library(str(out))
    return {"name": "tvm default", "kind": "tvm", "path": str(out), "kernels": kernels,
            "memory": memory_report(fused, target)}


def time_variant(variant: dict, feed_dir: Path, runs: int) -> float:
    return median_ms_in_subprocess([TIMER, variant["kind"], variant["path"], str(runs),
                                    str(feed_dir)], variant["name"])


def bench_model(name: str, work: Path, passes: list[str], rounds: int, runs: int) -> dict:
    import numpy as np

    import aotc
    from aotc.runtime.inputs import random_inputs
    onnx_path = source_model(name, work)
    variants = build_variants(onnx_path, work, passes)
    signature = aotc.load(variants[1]["path"]).signature
    feed_dir = work / f"{name}_feed"
    feed_dir.mkdir(exist_ok=True)
    feed = random_inputs(signature, seed=0)  # input names may hold "/": stored by position
    np.savez(feed_dir / "feed.npz", **{f"in{i}": v for i, v in enumerate(feed.values())})
    (feed_dir / "names.json").write_text(json.dumps(list(feed)))
    reference = {"name": "onnxruntime", "kind": "onnxruntime", "path": str(onnx_path)}
    everyone = [reference] + variants
    per_round = []
    for k in range(rounds):
        order = everyone if k % 2 == 0 else everyone[::-1]
        # TVM's default pipeline leaves naive loop nests: time it with few runs
        per_round.append({v["name"]: time_variant(v, feed_dir,
                                                  3 if v["kind"] == "tvm" else runs)
                          for v in order})
        print(f"  {name} round {k}: " + ", ".join(f"{n} {t:.1f}" for n, t in
                                                  per_round[-1].items()), flush=True)
    for v in variants:
        v["ms"] = statistics.median(r[v["name"]] for r in per_round)
        v["vs_onnxruntime"] = statistics.median(r[v["name"]] / r["onnxruntime"] for r in per_round)
    return {"model": name, "onnxruntime_ms": statistics.median(r["onnxruntime"] for r in per_round),
            "variants": variants, "rounds": per_round}


def table(result: dict) -> str:
    lines = [f"{result['model']} (onnxruntime {result['onnxruntime_ms']:.2f} ms)",
             f"  {'build':28s} {'kernels':>7s} {'planned MB':>10s} {'unplanned MB':>12s} "
             f"{'ms':>9s} {'vs ort':>7s}"]
    for v in result["variants"]:
        planned, unplanned = v["memory"]["planned_bytes"], v["memory"]["unplanned_bytes"]
        lines.append(f"  {v['name']:28s} {v['kernels']:7d} {_mb(planned):>10s} "
                     f"{_mb(unplanned):>12s} {v['ms']:9.2f} {v['vs_onnxruntime']:6.2f}x")
    return "\n".join(lines)


def _mb(value) -> str:
    return f"{value / 1e6:.2f}" if value else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,mobilenetv2,bert,vit,light_resnet50")
    parser.add_argument("--passes", default=DEFAULT_PASSES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default="bench/results/passes.json")
    args = parser.parse_args()
    work = scratch_folder("aotc-passes-")
    results = []
    for name in args.models.split(","):
        results.append(bench_model(name, work, args.passes.split(","), args.rounds, args.runs))
        print(table(results[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
