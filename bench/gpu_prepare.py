"""Prepare the GPU check (bench/gpu_check.sh) here, where TVM and nvcc are: compile models for a
CUDA target, bundle them with the C++ runner, and store inputs plus onnxruntime's CPU outputs
and latency as the reference. The GPU machine then needs no TVM, no Python packages beyond
numpy, and no network.

    python bench/gpu_prepare.py --out gpu_check [--target cuda-sm90] [--models mobilenetv2,vit]
    (GPU machine)  bash bench/gpu_check.sh gpu_check

Default models fit the device tool's 64 MiB transfer (runtime 8.7 MB): MobileNetV2 (14 MB),
ViT (9 MB), EfficientNet (9 MB), UNet (1 MB). ResNet-18 (47 MB) needs a call of its own and
the BERT encoder (120 MB) does not fit at all."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

import aotc
from aotc.examples.export_onnx import export
from aotc.package import package
from aotc.runtime.inputs import npy_file_name, random_inputs
from aotc.runtime.signature import ModelSignature

DEFAULT_MODELS = "mobilenetv2,vit,efficientnet,unet"


def onnxruntime_reference(onnx_path: Path, feed: dict, runs: int = 20) -> tuple[list, float]:
    import onnxruntime as ort
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    names = [o.name for o in session.get_outputs()]
    return list(zip(names, outputs)), statistics.median(times)


def prepare_model(name: str, target: str, work: Path, out: Path) -> dict:
    onnx_path = export(name, work / "onnx")
    so = work / f"{name}.so"
    meta = aotc.compile(onnx_path, target=target, output=so)
    feed = random_inputs(ModelSignature.from_json(meta["signature"]), seed=1)
    reference, ort_ms = onnxruntime_reference(onnx_path, feed)
    folder = out / "data" / name
    folder.mkdir(parents=True, exist_ok=True)
    for key, value in feed.items():
        np.save(folder / f"in_{npy_file_name(key)}", value)
    for key, value in reference:
        np.save(folder / f"ref_{npy_file_name(key)}", value)
    return {"model": name, "so": so, "inputs": list(feed), "outputs": [k for k, _ in reference],
            "onnxruntime_cpu_ms": round(ort_ms, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check"))
    parser.add_argument("--target", default="cuda-sm90")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    work = args.out.parent / f".{args.out.name}-work"
    prepared = [prepare_model(m, args.target, work, args.out) for m in args.models.split(",")]
    package(prepared[0]["so"], args.out / "bundle")
    for entry in prepared[1:]:
        shutil.copy2(entry["so"], args.out / "bundle" / "model" / entry["so"].name)
    manifest = [{**{k: v for k, v in e.items() if k != "so"}, "so": e["so"].name} for e in prepared]
    (args.out / "manifest.json").write_text(json.dumps({"target": args.target,
                                                        "models": manifest}, indent=1))
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"prepared {args.out} for {args.target}: {len(prepared)} models, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
