"""What one of aotc's passes is worth: the same model compiled with and without it.

    python bench/pass_ablation.py --pass FoldChannelAffine --model resnet50 [--rounds 5]
        [--runs 30] [--out bench/results/ablation_<pass>_<model>.json]

--model is an example (resnet18, mobilenetv2, bert) or a model of onnx's light zoo (resnet50,
densenet121, inception_v1, ...). Prints the kernel count of both builds (fused PrimFuncs after
the pipeline), then times each build in its own process, alternating them for several rounds
(timings on these VMs swing 2-3x between runs; two engines in one process disturb each other),
and reports the median of the per-round ratios (with / without). Writes JSON. Default thread
count, as users get it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_models import median_ms_in_subprocess, scratch_folder  # noqa: E402

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


def model_path(name: str, work: Path) -> Path:
    import onnx
    light = Path(onnx.__file__).parent / "backend/test/data/light" / f"light_{name}.onnx"
    if light.is_file():
        return light
    from aotc.examples.export_onnx import export
    return export(name, work)


def build(source: Path, work: Path, pass_name: str, keep: bool) -> tuple[Path, int]:
    """(artifact, kernel count) with or without the pass named ``pass_name``."""
    import aotc
    out = work / f"{source.stem}_{'with' if keep else 'without'}.so"
    options = aotc.CompileOptions(disabled_passes=() if keep else (pass_name,))
    meta = aotc.compile(source, output=out, options=options)
    return out, len(meta["kernels"])


def time_in_process(artifact: Path, runs: int) -> float:
    return median_ms_in_subprocess([TIMER, str(artifact), str(runs)], artifact.name)


def ablate(pass_name: str, model: str, rounds: int, runs: int) -> dict:
    work = scratch_folder("aotc-ablation-")
    source = model_path(model, work)
    (with_pass, k_with), (without, k_without) = (build(source, work, pass_name, True),
                                                 build(source, work, pass_name, False))
    print(f"{model}: kernels with {pass_name} {k_with}, without {k_without}", flush=True)
    rows = []
    for k in range(rounds):
        pair = [(with_pass, "with"), (without, "without")]
        timings = {label: time_in_process(path, runs)
                   for path, label in (pair if k % 2 == 0 else pair[::-1])}
        timings["ratio"] = timings["with"] / timings["without"]
        rows.append(timings)
        print(f"round {k}: with {timings['with']:.2f} ms, without {timings['without']:.2f} ms, "
              f"ratio {timings['ratio']:.3f}", flush=True)
    median = statistics.median(r["ratio"] for r in rows)
    print(f"{model}: with / without {pass_name}, median of per-round ratios: {median:.3f}")
    return {"pass": pass_name, "model": model, "runs": runs, "kernels_with": k_with,
            "kernels_without": k_without, "rounds": rows, "median_ratio": median}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pass", dest="pass_name", required=True)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    result = ablate(args.pass_name, args.model, args.rounds, args.runs)
    out = Path(args.out or f"bench/results/ablation_{args.pass_name}_{args.model}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
