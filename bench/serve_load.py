"""Load test of ``aotc serve`` on loopback: a BERT-class encoder with variable-length requests,
with and without dynamic batching, next to onnxruntime behind the same server.

    python bench/serve_load.py [--model small|base] [--lengths 8,128] [--buckets 32,64,128]
        [--rates 10,20,40,80,160] [--seconds 6] [--slo-ms 250]
        [--out bench/results/serve_load.json]

Each configuration is a fresh ``aotc serve`` process. The client (one asyncio process,
aiohttp, the binary tensor data extension) sends requests at a fixed rate with Poisson
arrivals for ``--seconds`` per step and rates from ``--rates``; every request's latency and
status is recorded, and a step stops the sweep once its P99 passes the SLO. "Throughput at the
SLO" is the highest completed-requests rate of a step whose P99 stayed within it. Last, a
burst of 4x the best rate against a queue limit of 64 checks that everything past capacity is
answered 503 and nothing is lost. Lengths are uniform in ``--lengths``. ``--model small`` is a
4-layer, 256-wide encoder (its weights fit in cache); ``base`` is BERT-base (12 layers, 768
wide: 85M parameters, read once per run, so a batch shares that read). Client and server share
the machine's cores. Writes JSON and a plot."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import host, versions  # noqa: E402

MODELS = {"small": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "intermediate_size": 1024, "vocab_size": 30522},
          "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "intermediate_size": 3072, "vocab_size": 30522}}
VOCAB = 30522
NAMES = ["input_ids", "attention_mask", "token_type_ids"]
SETUPS = {  # name -> (library kind, serve flags)
    "aotc_batching": ("so", ["--max-batch", "16", "--max-delay-ms", "5"]),
    "aotc_no_batching": ("so", ["--max-batch", "1"]),
    "onnxruntime_batching": ("onnx", ["--max-batch", "16", "--max-delay-ms", "5"]),
    "onnxruntime_no_batching": ("onnx", ["--max-batch", "1"]),
}


def free_port() -> int:
    from aotc.farm_daemons import free_port as port
    return port()


class Server:
    def __init__(self, model: Path, flags: list[str]):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aotc.cli", "serve", str(model), "--no-grpc",
             "--http-port", str(self.port), *flags], stderr=subprocess.PIPE, text=True)
        import urllib.request
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.proc.stderr.read()) from None
                time.sleep(0.2)
        raise RuntimeError("aotc serve did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def request_body(seed: int, lengths: tuple[int, int]) -> tuple[bytes, str]:
    rng = np.random.default_rng(seed)
    length = int(rng.integers(lengths[0], lengths[1] + 1))
    arrays = {"input_ids": rng.integers(0, VOCAB, (1, length)),
              "attention_mask": np.ones((1, length), np.int64),
              "token_type_ids": np.zeros((1, length), np.int64)}
    blobs = [arrays[n].astype("<i8").tobytes() for n in NAMES]
    header = json.dumps({"inputs": [{"name": n, "shape": [1, length], "datatype": "INT64",
                                     "parameters": {"binary_data_size": len(b)}}
                                    for n, b in zip(NAMES, blobs)],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(blobs), str(len(header))


async def load_step(port: int, model: str, rate: float, seconds: float, seed: int,
                    lengths: tuple[int, int]) -> dict:
    """Poisson arrivals at ``rate`` for ``seconds``; every request awaited (bounded by count)."""
    import aiohttp
    rng = np.random.default_rng(seed)
    count = max(1, int(rate * seconds))
    gaps = rng.exponential(1 / rate, count)
    bodies = [request_body(seed * 100_000 + k, lengths) for k in range(min(count, 512))]
    url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    latencies, statuses = [], []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def one(k: int) -> None:
            body, header_length = bodies[k % len(bodies)]
            start = time.perf_counter()
            async with session.post(url, data=body, headers={
                    "Inference-Header-Content-Length": header_length,
                    "Content-Type": "application/octet-stream"}) as answer:
                await answer.read()
                statuses.append(answer.status)
            latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        tasks = []
        for k, at in enumerate(np.cumsum(gaps)):
            await asyncio.sleep(max(0.0, began + float(at) - time.perf_counter()))
            tasks.append(asyncio.create_task(one(k)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - began
    ok = [lat for lat, s in zip(latencies, statuses) if s == 200]
    return {"rate": rate, "sent": count, "answered": len(statuses),
            "ok": len(ok), "refused_503": statuses.count(503),
            "other": len(statuses) - len(ok) - statuses.count(503),
            "throughput": len(ok) / elapsed,
            "p50_ms": float(np.percentile(ok, 50) * 1e3) if ok else None,
            "p99_ms": float(np.percentile(ok, 99) * 1e3) if ok else None}


def build(work: Path, args) -> dict[str, Path]:
    import aotc
    from aotc.examples.dynamic_transformers import export
    onnx_path = export("bert", work / "encoder.onnx", **MODELS[args.model])
    print("compiling the encoder with buckets", args.buckets, flush=True)
    aotc.compile(onnx_path, output=work / "encoder.so",
                 options=aotc.CompileOptions(buckets={"seq": tuple(args.buckets)}))
    return {"so": work / "encoder.so", "onnx": onnx_path}


def sweep(setup: str, model: Path, flags: list[str], args) -> list[dict]:
    server = Server(model, flags)
    steps = []
    try:
        for k, rate in enumerate(args.rates):
            step = asyncio.run(load_step(server.port, "encoder", rate, args.seconds, k + 1,
                                         args.lengths))
            step["setup"] = setup
            steps.append(step)
            print(f"{setup:26s} rate {rate:6.1f}/s: {step['throughput']:6.1f}/s done, "
                  f"p50 {step['p50_ms']:.0f} ms, p99 {step['p99_ms']:.0f} ms, "
                  f"{step['refused_503']} refused", flush=True)
            if step["p99_ms"] is None or step["p99_ms"] > args.slo_ms:
                break
    finally:
        server.stop()
    return steps


def burst(model: Path, rate: float, args) -> dict:
    server = Server(model, ["--max-batch", "16", "--max-delay-ms", "5", "--queue-limit", "64"])
    try:
        step = asyncio.run(load_step(server.port, "encoder", rate, 3.0, 99, args.lengths))
    finally:
        server.stop()
    step["setup"] = "aotc_batching_burst"
    print(f"burst at {rate:.0f}/s: {step['ok']} answered 200, {step['refused_503']} refused "
          f"503, {step['other']} other, {step['sent'] - step['answered']} lost", flush=True)
    return step


def at_slo(steps: list[dict], slo_ms: float) -> float:
    return max((s["throughput"] for s in steps if s["p99_ms"] is not None
                and s["p99_ms"] <= slo_ms), default=0.0)


def plot(steps: list[dict], slo_ms: float, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for setup in SETUPS:
        mine = [s for s in steps if s["setup"] == setup and s["p99_ms"] is not None]
        ax.plot([s["throughput"] for s in mine], [s["p99_ms"] for s in mine], marker="o",
                label=setup.replace("_", " "))
    ax.axhline(slo_ms, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo_ms:.0f} ms")
    ax.set_xlabel("completed requests / s")
    ax.set_ylabel("P99 latency, ms")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--lengths", default="8,128",
                        type=lambda s: tuple(int(x) for x in s.split(",")))
    parser.add_argument("--buckets", default="32,64,128",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--rates", default="10,20,40,80,160,320",
                        type=lambda s: [float(x) for x in s.split(",")])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--slo-ms", type=float, default=250.0)
    parser.add_argument("--out", default="bench/results/serve_load.json")
    args = parser.parse_args()
    from aotc.atomic import write_bytes
    with tempfile.TemporaryDirectory(prefix="aotc-serve-load-") as tmp:
        models = build(Path(tmp), args)
        steps = []
        for setup, (kind, flags) in SETUPS.items():
            steps += sweep(setup, models[kind], flags, args)
        best = at_slo([s for s in steps if s["setup"] == "aotc_batching"], args.slo_ms)
        burst_step = burst(models["so"], max(4 * best, 40.0), args)
    summary = {setup: at_slo([s for s in steps if s["setup"] == setup], args.slo_ms)
               for setup in SETUPS}
    out = Path(args.out)
    write_bytes(out, json.dumps({
        "host": host(), "versions": versions(), "command": " ".join(["python", *sys.argv]),
        "model": {"config": MODELS[args.model], "buckets": args.buckets,
                  "lengths": list(args.lengths)},
        "slo_ms": args.slo_ms, "throughput_at_slo": summary, "steps": steps,
        "burst": burst_step, "cores": os.cpu_count()}, indent=1).encode())
    config = MODELS[args.model]
    plot(steps, args.slo_ms, out.with_suffix(".png"),
         f"Encoder {config['num_hidden_layers']}x{config['hidden_size']}, lengths "
         f"{args.lengths[0]}-{args.lengths[1]}, on loopback")
    print(json.dumps(summary, indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
