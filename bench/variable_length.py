"""One library for every length (symbolic batch and sequence; the same with shape buckets) vs
one library per length vs onnxruntime on the same dynamic-axes export: BERT and GPT-2 from
transformers configs.

    python bench/variable_length.py [--models bert,gpt2] [--lengths 16,128,384] [--batch 1]
        [--buckets 16,32,64,128,256,512] [--rounds 3] [--runs 20] [--small]
        [--out bench/results/variable_length.json]

Engines: ``aotc_dynamic`` (compiled once from the export, symbolic dims), ``aotc_buckets``
(the same plus --buckets seq=... and batch=BATCH: a call runs padded in the smallest bucket
that fits), ``aotc_fixed`` (compiled per length with --input-shape), ``onnxruntime`` (the
export as it is). The lengths are timed as given, so a length between buckets pays for its
padding. Each
measurement runs in a fresh process; the engines alternate (order reversed every other
round); ratios are medians of the per-round ratios. --small uses 2-layer, 128-wide configs
(a quick check); the default is BERT-base and GPT-2 small. Writes JSON and a plot."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import MEASURE, median_ms_in_subprocess, scratch_folder  # noqa: E402

SMALL = {"bert": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "intermediate_size": 512},
         "gpt2": {"n_embd": 128, "n_layer": 2, "n_head": 4}}
ENGINES = ("aotc_dynamic", "aotc_buckets", "aotc_fixed", "onnxruntime")
# One engine's run() on one length; bench_models.MEASURE times it and prints the median ms.
TIMER = """
from aotc.examples.dynamic_transformers import feed
ENGINE, PATH, NAMES, BATCH, LENGTH, VOCAB = {args}
inputs = feed(NAMES, BATCH, LENGTH, VOCAB)
if ENGINE == "onnxruntime":
    import onnxruntime as ort
    session = ort.InferenceSession(PATH, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, inputs)
else:
    import aotc
    model = aotc.load(PATH)
    run = lambda: model.run(inputs)
"""


def bench_model(name: str, work: Path, args) -> list[dict]:
    import aotc
    from aotc.examples.dynamic_transformers import ARCHITECTURES, export
    config = dict(SMALL[name]) if args.small else {}
    onnx_path = export(name, work / f"{name}.onnx", **config)
    names = ARCHITECTURES[name][2]
    vocab = 30522 if name == "bert" else 50257
    dynamic = aotc.compile(onnx_path, output=work / f"{name}.so")
    bucketed = aotc.compile(onnx_path, output=work / f"{name}_buckets.so",
                            options=aotc.CompileOptions(buckets={"seq": tuple(args.buckets),
                                                                 "batch": (args.batch,)}))
    rows = []
    for length in args.lengths:
        shapes = {n: (args.batch, length) for n in names}
        fixed_path = work / f"{name}_{length}.so"
        fixed = aotc.compile(onnx_path, output=fixed_path, input_shapes=shapes)
        paths = {"aotc_dynamic": work / f"{name}.so", "aotc_fixed": fixed_path,
                 "aotc_buckets": work / f"{name}_buckets.so", "onnxruntime": onnx_path}
        per_round = []
        for k in range(args.rounds):
            order = ENGINES if k % 2 == 0 else ENGINES[::-1]
            per_round.append({engine: median_ms_in_subprocess(
                [_script(engine, paths[engine], names, args.batch, length, vocab, args.runs)],
                f"{engine} {name} {length}")
                for engine in order})
        row = {"model": name, "batch": args.batch, "seq": length, "rounds": per_round,
               "compile_s": {"dynamic": dynamic["compile_seconds"],
                             "buckets": bucketed["compile_seconds"],
                             "fixed": fixed["compile_seconds"]}}
        for engine in ENGINES:
            row[f"{engine}_ms"] = statistics.median(r[engine] for r in per_round)
        for a, b in [("aotc_dynamic", "aotc_fixed"), ("aotc_buckets", "aotc_fixed"),
                     ("aotc_dynamic", "onnxruntime"), ("aotc_buckets", "onnxruntime"),
                     ("aotc_fixed", "onnxruntime")]:
            row[f"{a}_vs_{b}"] = statistics.median(r[a] / r[b] for r in per_round)
        print(f"{name} seq {length}: " + ", ".join(
            f"{e} {row[e + '_ms']:.2f} ms" for e in ENGINES) +
            f"; dynamic/fixed {row['aotc_dynamic_vs_aotc_fixed']:.2f}, "
            f"buckets/fixed {row['aotc_buckets_vs_aotc_fixed']:.2f}, "
            f"buckets/ORT {row['aotc_buckets_vs_onnxruntime']:.2f}", flush=True)
        rows.append(row)
    return rows


def _script(engine: str, path: Path, names, batch: int, length: int, vocab: int,
            runs: int) -> str:
    setup = TIMER.format(args=repr((engine, str(path), names, batch, length, vocab)))
    return setup + MEASURE.replace("WARMUP", "3").replace("RUNS", str(runs))


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['model']}\nseq {r['seq']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.3), 4))
    width = 0.2
    for k, engine in enumerate(ENGINES):
        ax.bar([i + (k - 1.5) * width for i in range(len(rows))],
               [r[f"{engine}_ms"] for r in rows], width, label=engine)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("ms per call (median)")
    ax.set_yscale("log")
    ax.set_title(f"variable-length transformers, batch {rows[0]['batch']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt2")
    parser.add_argument("--lengths", default="16,128,384",
                        type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--buckets", default="16,32,64,128,256,512",
                        type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", default="bench/results/variable_length.json")
    args = parser.parse_args()
    work = scratch_folder("aotc-varlen-")
    rows = [row for name in args.models.split(",") for row in bench_model(name, work, args)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from aotc.atomic import write_bytes
    host = {"cpu": _cpu_name(), "cores": _cores(), "python": platform.python_version()}
    write_bytes(out, json.dumps({"host": host, "command": " ".join(["python", *sys.argv]),
                                 "rows": rows}, indent=1).encode())
    _plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _cores() -> int:
    import os
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
