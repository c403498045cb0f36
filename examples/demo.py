"""The README's main job: compile the bundled MobileNetV2 example, run it, compare with
onnxruntime, print the latency of both.

    python -m aotc.examples.demo [--model resnet18|mobilenetv2|bert|vit|...] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

MODELS = ("resnet18", "mobilenetv2", "bert", "vit", "efficientnet", "convnext", "gpt", "unet")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mobilenetv2", choices=MODELS)
    parser.add_argument("--out", default="build/demo")
    parser.add_argument("--threads", type=int, default=None,
                        help="aotc's thread count (default: every core, as users get it)")
    args = parser.parse_args()
    if args.threads:
        os.environ["AOTC_NUM_THREADS"] = str(args.threads)

    import aotc
    from aotc.bench import run_bench
    from aotc.examples.export_onnx import export

    out = Path(args.out)
    onnx_path = export(args.model, out)
    print(f"exported {onnx_path}")
    meta = aotc.compile(onnx_path, target="x86", output=out / f"{args.model}.so",
                        progress=lambda msg: print(f"  {msg}", flush=True))
    print(f"compiled {out / (args.model + '.so')} in {meta['compile_seconds']} s")
    report = run_bench(str(out / f"{args.model}.so"), str(onnx_path), runs=30, warmup=3)
    print(report.table())
    # rtol/atol 1e-4: fp32 with reordered reductions (see tests/helpers.py)
    ok = report.max_abs_diff is not None and report.max_abs_diff < 1e-3
    print("outputs match onnxruntime" if ok else "OUTPUTS DIFFER FROM ONNXRUNTIME")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
