"""aotc against its peers on full-size standard architectures (batch 1, random weights):
onnxruntime, OpenVINO (fp32 hint, and its default, bf16 on CPUs with AVX512-BF16 or AMX),
torch AOTInductor and, where installed, IREE (llvm-cpu); and aotc's ``--precision bf16`` build
against OpenVINO's default.

    python bench/peers.py [--models resnet50,vit_b16,...] [--rounds 4] [--runs 20]
        [--compile-rounds 1] [--engines aotc,onnxruntime,...] [--out bench/results/peers.json]

Method: every engine runs in a fresh process with its default threading; the engines
alternate for --rounds rounds (order reversed every other round) and each ratio is the median
of the per-round ratios. Every engine gets the same inputs and its output is compared with
torch's (max abs error and cosine). Compile time is the wall time of a fresh process that
builds the engine's artifact (``aotc compile``, ``iree-compile`` after ``iree-import-onnx``,
``aoti_compile_and_package`` after ``torch.export``), the median of --compile-rounds builds
with the engines alternating as above (and with more than one, ``aotc_vs_<engine>_compile`` is
the median of the per-round ratios); OpenVINO and onnxruntime build at load, and that load
time is reported as theirs.

For aotc the bench also lists the kernels that run far below their class: a kernel whose
GFLOP/s (``aotc profile``) is under a third of the median of its class (matmul, conv,
attention) in the same model, that takes at least 1% of the time and does at least 8 FLOP
per byte it touches (so it could be compute-bound) is reported under "slow_kernels", as is a
kernel other than a contraction that takes at least 5% of the time and moves under 1 GB/s.

Models: examples/standard.py. Prints a row per model; writes JSON and a plot."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_models import bench_all, scratch_folder  # noqa: E402

MODELS = ("resnet50,mobilenetv3_large,efficientnet_b0,convnext_t,vit_b16,bert_base,gpt2,"
          "whisper_base_encoder")
ENGINES = ("aotc", "aotc_bf16", "onnxruntime", "openvino_fp32", "openvino_default", "aoti",
           "iree")
# aotc_bf16 (--precision bf16) is compared with OpenVINO's default (bf16 on such CPUs); on a
# CPU without AVX512-BF16 its compile is refused and the row records that.

# Each timer defines run() from FEED (an .npz of the inputs, in input order) and the
# artifacts; it saves run()'s first output to OUTPUT and prints load seconds, then (MEASURE)
# the median latency in ms as its last line.
_LOAD_FEED = """
import numpy as np, time
feed = dict(np.load(FEED)); start = time.perf_counter()
"""
TIMERS = {
    "aotc": """
import aotc
model = aotc.load(ARTIFACT)
run = lambda: list(model.run(feed).values())
""",
    "aotc_bf16": """
import aotc
model = aotc.load(BF16_ARTIFACT)
run = lambda: list(model.run(feed).values())
""",
    "onnxruntime": """
import onnxruntime as ort
session = ort.InferenceSession(ONNX, providers=["CPUExecutionProvider"])
run = lambda: session.run(None, feed)
""",
    "openvino_fp32": """
import openvino as ov
compiled = ov.Core().compile_model(ONNX, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                 "INFERENCE_PRECISION_HINT": "f32"})
request = compiled.create_infer_request()
run = lambda: [request.infer(feed)[compiled.output(0)]]
""",
    "openvino_default": """
import openvino as ov
compiled = ov.Core().compile_model(ONNX, "CPU", {"PERFORMANCE_HINT": "LATENCY"})
request = compiled.create_infer_request()
run = lambda: [request.infer(feed)[compiled.output(0)]]
""",
    "aoti": """
import torch
package = torch._inductor.aoti_load_package(PT2)
tensors = [torch.from_numpy(v) for v in feed.values()]
def run():
    with torch.no_grad():
        out = package(*tensors)
    return [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
""",
    "iree": """
import iree.runtime as ireert
config = ireert.Config("local-task")
context = ireert.SystemContext(config=config)
context.add_vm_module(ireert.VmModule.mmap(config.vm_instance, VMFB))
function = context.modules.module["main_graph"]
def run():
    out = function(*feed.values())
    return [o.to_host() for o in (out if isinstance(out, (list, tuple)) else [out])]
""",
}
MEASURE = """
load_s = time.perf_counter() - start
first = run()
np.save(OUTPUT, np.asarray(first[0] if isinstance(first, (list, tuple)) else first))
for _ in range(3): run()
times = []
for _ in range(RUNS):
    begin = time.perf_counter(); run(); times.append(time.perf_counter() - begin)
print(load_s)
print(float(np.median(times)) * 1e3)
"""

AOTI_COMPILE = """
import sys, torch
from aotc.examples import standard
module, inputs = standard.build(sys.argv[1])
with torch.no_grad():
    program = torch.export.export(module, inputs)
    torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[2])
"""


def _wall(command: list[str], what: str, env: dict | None = None) -> float:
    """Seconds a fresh process running ``command`` takes; raises with its stderr if it fails."""
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed: {out.stderr.strip()[-800:]}")
    return time.perf_counter() - start


def build_engine(engine: str, name: str, work: Path) -> float | None:
    """Build ``engine``'s artifact for model ``name`` in ``work``; its compile seconds, None
    for engines that compile at load."""
    onnx_path = work / f"{name}.onnx"
    if engine == "aotc":
        return _wall([sys.executable, "-m", "aotc.cli", "compile", str(onnx_path), "-o",
                      str(work / f"{name}.so")], "aotc compile")
    if engine == "aotc_bf16":  # includes the float32 build its accuracy report compares with
        return _wall([sys.executable, "-m", "aotc.cli", "compile", str(onnx_path), "-o",
                      str(work / f"{name}.bf16.so"), "--precision", "bf16"],
                     "aotc compile --precision bf16")
    if engine == "aoti":
        return _wall([sys.executable, "-c", AOTI_COMPILE, name, str(work / f"{name}.pt2")],
                     "AOTInductor compile")
    if engine == "iree":
        mlir, bin_dir = work / f"{name}.mlir", Path(sys.executable).parent
        start = time.perf_counter()
        _wall([str(bin_dir / "iree-import-onnx"), str(onnx_path), "-o", str(mlir)],
              "iree-import-onnx")
        _wall([str(bin_dir / "iree-compile"), str(mlir), "--iree-hal-target-device=local",
               "--iree-hal-local-target-device-backends=llvm-cpu",
               "--iree-llvmcpu-target-cpu=host", "-o", str(work / f"{name}.vmfb")],
              "iree-compile")
        return time.perf_counter() - start
    return None


def time_engine(engine: str, name: str, work: Path, runs: int) -> dict:
    """{"ms": median latency, "load_s": seconds to load} of one engine in a fresh process;
    its first output lands in ``work/name.engine.npy``."""
    paths = {"FEED": work / f"{name}.npz", "BF16_ARTIFACT": work / f"{name}.bf16.so",
             "ARTIFACT": work / f"{name}.so",
             "ONNX": work / f"{name}.onnx", "PT2": work / f"{name}.pt2",
             "VMFB": work / f"{name}.vmfb", "OUTPUT": work / f"{name}.{engine}.npy"}
    script = _LOAD_FEED + TIMERS[engine] + MEASURE.replace("RUNS", str(runs))
    for key, path in paths.items():
        script = script.replace(key, repr(str(path)))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{engine} on {name} failed: {out.stderr.strip()[-800:]}")
    load_s, ms = out.stdout.strip().splitlines()[-2:]
    return {"ms": float(ms), "load_s": float(load_s)}


def accuracy(reference, output) -> dict:
    import numpy as np
    ref, out = np.asarray(reference, np.float64).ravel(), np.asarray(output, np.float64).ravel()
    if ref.shape != out.shape:
        return {"error": f"output shape {output.shape} != torch's {reference.shape}"}
    cosine = float(ref @ out / max(np.linalg.norm(ref) * np.linalg.norm(out), 1e-30))
    return {"max_abs": float(np.max(np.abs(ref - out))), "cosine": cosine,
            "max_abs_ref": float(np.max(np.abs(ref)))}


# A kernel other than a contraction that moves its bytes slower than this (and takes 5% of
# the time):
# far below any memory system (transformers' EfficientNet pooled 250 KB in 1.1 s).
MIN_MEMORY_GBS = 1.0


def slow_kernels(profile: dict) -> list[dict]:
    """Kernels under a third of their class's median GFLOP/s, and other kernels that move
    data far slower than memory does (see the module docstring)."""
    kernels = [k for k in profile["kernels"] if k.get("gflops")]
    total = sum(k["total_ms"] for k in profile["kernels"]) or 1.0
    classes: dict[str, list[dict]] = {}
    for kernel in kernels:
        classes.setdefault(kernel_class(kernel["name"]), []).append(kernel)
    slow = []
    for cls, members in classes.items():
        if cls == "other":
            continue
        median = statistics.median(k["gflops"] for k in members)
        for k in members:
            intensity = k["flops"] / max(k.get("bytes") or 1, 1)
            if (k["gflops"] < median / 3 and k["total_ms"] / total >= 0.01
                    and (k.get("bytes") is None or intensity >= 8)):
                slow.append({"name": k["name"], "class": cls, "gflops": round(k["gflops"], 1),
                             "class_median_gflops": round(median, 1),
                             "share": round(k["total_ms"] / total, 4)})
    for k in profile["kernels"]:
        # not a contraction (pooling, copies, reductions): bound by memory, a rate of bytes
        rate = (k.get("bytes") or 0) / max(k["ms_per_call"] or 0, 1e-9) / 1e6  # GB/s
        if (kernel_class(k["name"]) == "other" and k.get("bytes")
                and k["total_ms"] / total >= 0.05 and rate < MIN_MEMORY_GBS):
            slow.append({"name": k["name"], "class": "memory", "gb_per_s": float(f"{rate:.3g}"),
                         "share": round(k["total_ms"] / total, 4)})
    return slow


def kernel_class(name: str) -> str:
    if "softmax" in name:
        return "attention"
    if "conv" in name:
        return "conv"
    if "matmul" in name or "dense" in name or "dot" in name:
        return "matmul"
    return "other"


def bench_model(name: str, work: Path, engines: list[str], rounds: int, runs: int,
                compile_rounds_wanted: int = 1) -> dict:
    import numpy as np
    import torch

    from aotc.examples import standard
    onnx_path = standard.export(name, work)
    module, inputs = standard.build(name)
    with torch.no_grad():
        reference = module(*inputs).numpy()
    np.savez(work / f"{name}.npz", **{n: t.numpy() for n, t in
                                      zip(standard.MODELS[name][2], inputs)})
    row: dict = {"model": name, "onnx": onnx_path.name, "compile_s": {}, "errors": {}}
    ready = list(engines)
    compile_rounds = []
    for k in range(compile_rounds_wanted):
        seconds = {}
        for engine in (ready if k % 2 == 0 else ready[::-1]):
            try:
                seconds[engine] = build_engine(engine, name, work)
            except Exception as exc:  # one engine failing must not stop the others
                row["errors"][engine] = str(exc)[-400:]
                print(f"  {engine} on {name}: {row['errors'][engine][-200:]}", flush=True)
        ready = [e for e in ready if e in seconds]
        compile_rounds.append(seconds)
    for engine in ready:
        times = [r[engine] for r in compile_rounds]
        row["compile_s"][engine] = None if None in times else statistics.median(times)
    if compile_rounds_wanted > 1:
        row["compile_rounds"] = compile_rounds
        for engine in ready:
            if engine != "aotc" and "aotc" in ready and row["compile_s"][engine] is not None:
                row[f"aotc_vs_{engine}_compile"] = statistics.median(
                    r["aotc"] / r[engine] for r in compile_rounds)
    per_round = []
    for k in range(rounds):
        order = ready if k % 2 == 0 else ready[::-1]
        timings = {}
        for engine in order:
            try:
                timings[engine] = time_engine(engine, name, work, runs)
            except Exception as exc:
                row["errors"][engine] = str(exc)[-400:]
        ready = [e for e in ready if e in timings]
        per_round.append(timings)
    row["rounds"] = per_round
    for engine in ready:
        row[f"{engine}_ms"] = statistics.median(r[engine]["ms"] for r in per_round)
        row.setdefault("load_s", {})[engine] = statistics.median(
            r[engine]["load_s"] for r in per_round)
        row.setdefault("accuracy", {})[engine] = accuracy(
            reference, np.load(work / f"{name}.{engine}.npy"))
        if engine not in ("aotc", "aotc_bf16") and "aotc" in ready:
            row[f"aotc_vs_{engine}"] = statistics.median(
                r["aotc"]["ms"] / r[engine]["ms"] for r in per_round)
        if engine != "aotc_bf16" and "aotc_bf16" in ready:
            row[f"aotc_bf16_vs_{engine}"] = statistics.median(
                r["aotc_bf16"]["ms"] / r[engine]["ms"] for r in per_round)
    if "aotc" in ready:
        profile_json = work / f"{name}.profile.json"
        _wall([sys.executable, "-m", "aotc.cli", "profile", str(work / f"{name}.so"), "--runs",
               "5", "--json", str(profile_json)], f"aotc profile on {name}")
        row["slow_kernels"] = slow_kernels(json.loads(profile_json.read_text()))
    return row


def host() -> dict:
    flags = ""
    if Path("/proc/cpuinfo").exists():
        text = Path("/proc/cpuinfo").read_text()
        model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                      if line.startswith("model name")), "")
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    else:
        model = platform.processor()
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
              "amx_int8", "avx512_fp16")
    return {"cpu": model, "cores": os.cpu_count(),
            "features": [f for f in wanted if f" {f}" in flags]}


def versions() -> dict:
    from importlib import metadata
    found = {}
    for package in ("apache-tvm", "onnxruntime", "openvino", "torch", "iree-base-compiler"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def _plot(rows: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series = [f"aotc_vs_{e}" for e in ENGINES[2:]] + ["aotc_bf16_vs_openvino_default"]
    series = [key for key in series if any(key in row for row in rows)]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / max(len(series), 1)
    for i, key in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, row in enumerate(rows)
              if key in row]
        ax.bar(xs, [row[key] for row in rows if key in row], width,
               label=key.replace("_vs_", " / "))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [row["model"] for row in rows], rotation=20)
    ax.set_ylabel("latency ratio (lower: aotc faster)")
    ax.set_title("aotc vs peers, batch 1, default threads, one process per engine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _format(row: dict) -> str:
    parts = [f"{row['model']:22s}"]
    if "aotc_ms" in row:
        parts.append(f"aotc {row['aotc_ms']:8.2f} ms")
    for engine in ENGINES[2:]:
        if f"aotc_vs_{engine}" in row:
            parts.append(f"/{engine} {row[f'aotc_vs_{engine}']:.2f}x")
    if "aotc_bf16_ms" in row:
        parts.append(f"| bf16 {row['aotc_bf16_ms']:.2f} ms")
        if "aotc_bf16_vs_openvino_default" in row:
            parts.append(f"/openvino_default {row['aotc_bf16_vs_openvino_default']:.2f}x")
    parts += [f"{e} failed" for e in row["errors"]]
    if row.get("slow_kernels"):
        parts.append(f"slow kernels: {', '.join(k['name'] for k in row['slow_kernels'])}")
    return "  ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--compile-rounds", type=int, default=1,
                        help="build every artifact this many times, the engines alternating; "
                        "compile seconds are the median, the ratio the median per round")
    parser.add_argument("--work", default=None, help="folder for models and artifacts "
                        "(default: a temporary folder, removed at the end)")
    parser.add_argument("--out", default="bench/results/peers.json")
    args = parser.parse_args()
    engines = args.engines.split(",")
    unknown = set(engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; known: {', '.join(ENGINES)}")
    work = Path(args.work) if args.work else scratch_folder("aotc-peers-")
    work.mkdir(parents=True, exist_ok=True)
    bench_all(args.models.split(","), lambda name: bench_model(name, work, engines, args.rounds,
                                                                 args.runs, args.compile_rounds),
              _format, Path(args.out), _plot,
              {"host": host(), "versions": versions(), "command": " ".join(["python", *sys.argv]),
               "rounds": args.rounds, "runs": args.runs, "compile_rounds": args.compile_rounds})


if __name__ == "__main__":
    main()
