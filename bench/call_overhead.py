"""What one call costs around the kernels: aotc's Python runtime against onnxruntime and
OpenVINO on models whose kernels take microseconds (a multiply of 16 floats, of a 224x224
image, a two-layer MLP), where the runtime's own work (input checks, staging, the choice of
thread pool, building the outputs) is most of a call. A server calling a small model many
times a second pays it on every request.

    python bench/call_overhead.py [--models mul_16,mul_image,mlp] [--rounds 5] [--runs 2000]
        [--engines aotc,onnxruntime,openvino_fp32] [--out bench/results/call_overhead.json]

Method: as bench/peers.py (its timers): each engine in a fresh process with default threading,
engines alternating by round (order reversed every other round), the median of --runs calls a
process; ratios are medians of per-round ratios. Outputs are checked against onnxruntime's."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_models import bench_all, scratch_folder  # noqa: E402
from peers import build_engine, host, time_engine, versions  # noqa: E402

MODELS = ("mul_16", "mul_image", "mlp")
ENGINES = ("aotc", "onnxruntime", "openvino_fp32")


def write_model(name: str, work: Path) -> None:
    """``work/name.onnx`` and its feed ``work/name.npz`` (fixed seed)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if name == "mlp":
        shape, out_shape = [1, 256], [1, 10]
        w1 = rng.standard_normal((256, 512)).astype(np.float32) / 16
        w2 = rng.standard_normal((512, 10)).astype(np.float32) / 22
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
                 helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("MatMul", ["r", "w2"], ["y"])]
        weights = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    else:
        shape = [1, 16] if name == "mul_16" else [1, 3, 224, 224]
        out_shape = shape
        nodes = [helper.make_node("Mul", ["x", "c"], ["y"])]
        weights = [numpy_helper.from_array(np.array([2.0], np.float32), "c")]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, work / f"{name}.onnx")
    np.savez(work / f"{name}.npz", x=rng.standard_normal(shape).astype(np.float32))


def bench_model(name: str, work: Path, engines: list[str], rounds: int, runs: int) -> dict:
    write_model(name, work)
    for engine in engines:
        build_engine(engine, name, work)
    times: dict[str, list[float]] = {e: [] for e in engines}
    for r in range(rounds):
        for engine in engines if r % 2 == 0 else engines[::-1]:
            times[engine].append(time_engine(engine, name, work, runs)["ms"] * 1e3)
    row: dict = {"model": name}
    for engine in engines:
        row[f"{engine}_us"] = statistics.median(times[engine])
    if "aotc" in engines:
        for peer in engines:
            if peer != "aotc":
                row[f"aotc_vs_{peer}"] = statistics.median(
                    a / p for a, p in zip(times["aotc"], times[peer]))
    row["per_round"] = times  # microseconds
    if "onnxruntime" in engines:
        reference = np.load(work / f"{name}.onnxruntime.npy")
        row["max_abs_diff_to_onnxruntime"] = {
            e: float(np.abs(np.load(work / f"{name}.{e}.npy") - reference).max())
            for e in engines if e != "onnxruntime"}
    return row


def _format(row: dict) -> str:
    engines = [k[:-3] for k in row if k.endswith("_us")]
    ratios = [k for k in row if k.startswith("aotc_vs_")]
    return (f"{row['model']:10s} " + "  ".join(f"{e} {row[e + '_us']:8.1f} us" for e in engines)
            + "  " + "  ".join(f"{k} {row[k]:.2f}" for k in ratios))


def _plot(rows: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    engines = [e for e in ENGINES if any(f"{e}_us" in r for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        ax.bar([k + i * width for k in range(len(rows))],
               [r.get(f"{engine}_us", 0) for r in rows], width, label=engine)
    ax.set_xticks([k + width * (len(engines) - 1) / 2 for k in range(len(rows))],
                  [r["model"] for r in rows])
    ax.set_ylabel("median call, us (lower is better)")
    ax.set_title("Whole-call latency of models with microsecond kernels")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--out", default="bench/results/call_overhead.json")
    args = parser.parse_args()
    engines, models = args.engines.split(","), args.models.split(",")
    for given, known, what in ((engines, ENGINES, "engines"), (models, MODELS, "models")):
        unknown = set(given) - set(known)
        if unknown:
            parser.error(f"unknown {what} {sorted(unknown)}; known: {', '.join(known)}")
    work = scratch_folder("aotc-call-overhead-")
    bench_all(models, lambda name: bench_model(name, work, engines, args.rounds, args.runs),
              _format, Path(args.out), _plot,
              {"host": host(), "versions": versions(), "command": " ".join(["python", *sys.argv]),
               "rounds": args.rounds, "runs": args.runs})


if __name__ == "__main__":
    main()
