"""Greedy generation with a KV cache: aotc against onnxruntime and OpenVINO running the same
GPT-2 ONNX export with past keys and values (examples/decoders.py; random weights), batch 1.

    python bench/generate.py [--prompt 128] [--new 64] [--rounds 4]
        [--engines aotc,aotc_bf16,onnxruntime,openvino_fp32,openvino_default]
        [--layers 12 --heads 12 --width 768 --vocabulary 50257] [--out bench/results/generate.json]

aotc runs its ``--kv-capacity`` library (prefill and decode entries, the cache written in
place); onnxruntime and OpenVINO run the export as such: the prompt with an empty past, then
one token at a time, each step's present values fed back as the next step's past. Each engine
generates in a fresh process with its default threading, after one short warm-up generation;
the engines alternate for --rounds rounds (order reversed every other round) and each ratio
is the median of the per-round ratios. Reported per engine: the time to the first token (the
prompt's prefill), decode tokens per second (the tokens after the first), and how many of its
tokens agree with onnxruntime's before the first difference. Writes JSON and a plot."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_models import scratch_folder  # noqa: E402
from peers import host, versions  # noqa: E402

ENGINES = ("aotc", "aotc_bf16", "onnxruntime", "openvino_fp32", "openvino_default")
PEERS = {"aotc": ("onnxruntime", "openvino_fp32"), "aotc_bf16": ("openvino_default",)}

# Each worker generates greedily from PROMPT (.npy) for NEW tokens and prints one JSON line:
# {"first_token_ms", "tokens_per_second", "tokens", "load_s"}.
_AOTC = """
import aotc, json, numpy as np, time
start = time.perf_counter()
model = aotc.load(ARTIFACT)
load_s = time.perf_counter() - start
prompt = np.load(PROMPT)
model.generate(prompt, 2)  # warm-up
out = model.generate(prompt, NEW)
print(json.dumps({**out.to_json(), "load_s": load_s}))
"""
_PEER = """
import json, numpy as np, time
prompt = np.load(PROMPT)
start = time.perf_counter()
step = LOAD()
load_s = time.perf_counter() - start

def generate(new):
    past = {n: np.zeros(s, np.float32) for n, s in PAST.items()}
    feed = {"input_ids": prompt[None], "attention_mask": np.ones((1, len(prompt)), np.int64),
            "position_ids": np.arange(len(prompt))[None], **past}
    tokens, times = [], []
    for k in range(new):
        t = time.perf_counter()
        logits, present = step(feed)
        token = int(np.argmax(logits[0, -1]))
        times.append((time.perf_counter() - t) * 1e3)
        tokens.append(token)
        n = len(prompt) + k
        feed = {"input_ids": np.array([[token]]), "attention_mask": np.ones((1, n + 1), np.int64),
                "position_ids": np.array([[n]]), **present}
    return tokens, times

generate(2)  # warm-up
tokens, times = generate(NEW)
print(json.dumps({"tokens": tokens, "first_token_ms": times[0],
                  "tokens_per_second": len(times[1:]) / (sum(times[1:]) / 1e3),
                  "load_s": load_s}))
"""
_ORT_LOAD = """
def LOAD():
    import onnxruntime as ort
    session = ort.InferenceSession(ONNX)
    past_names = [i.name for i in session.get_inputs()][3:]
    def step(feed):
        out = session.run(None, feed)
        return out[0], dict(zip(past_names, out[1:]))
    return step
"""
_OV_LOAD = """
def LOAD():
    import openvino as ov
    config = {"PERFORMANCE_HINT": "LATENCY", **PRECISION_CONFIG}
    compiled = ov.Core().compile_model(ONNX, "CPU", config)
    request = compiled.create_infer_request()
    past_names = [i.get_any_name() for i in compiled.inputs][3:]
    def step(feed):
        result = request.infer(feed)
        outs = [result[o] for o in compiled.outputs]
        return outs[0], dict(zip(past_names, outs[1:]))
    return step
"""


def worker_script(engine: str, paths: dict, new: int, past_shapes: dict) -> str:
    if engine.startswith("aotc"):
        script = _AOTC
    else:
        load = _ORT_LOAD if engine == "onnxruntime" else _OV_LOAD
        hint = {"INFERENCE_PRECISION_HINT": "f32"} if engine == "openvino_fp32" else {}
        script = (load.replace("PRECISION_CONFIG", repr(hint))
                  + _PEER.replace("PAST", repr(past_shapes)))
    script = script.replace("ARTIFACT", repr(str(paths.get(engine, "")))).replace(
        "ONNX", repr(str(paths["onnx"]))).replace("PROMPT", repr(str(paths["prompt"])))
    return script.replace("NEW", str(new))


def run_worker(engine: str, paths: dict, new: int, past_shapes: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", worker_script(engine, paths, new, past_shapes)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{engine} failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_aotc(onnx_path: Path, output: Path, capacity: int, bf16: bool) -> float:
    command = [sys.executable, "-m", "aotc.cli", "compile", str(onnx_path), "-o", str(output),
               "--kv-capacity", str(capacity)] + (["--precision", "bf16"] if bf16 else [])
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"aotc compile failed: {out.stderr.strip()[-800:]}")
    return time.perf_counter() - start


def agreement(tokens: list[int], reference: list[int]) -> int:
    """Leading tokens equal to the reference's."""
    same = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        same += 1
    return same


def summarize(rounds: list[dict], engines: list[str]) -> dict:
    out: dict = {"engines": {}}
    reference = rounds[0].get("onnxruntime", {}).get("tokens")
    for engine in engines:
        runs = [r[engine] for r in rounds if engine in r]
        if not runs:
            continue
        out["engines"][engine] = {
            "first_token_ms": round(statistics.median(r["first_token_ms"] for r in runs), 2),
            "tokens_per_second": round(statistics.median(r["tokens_per_second"]
                                                         for r in runs), 2),
            "load_s": round(statistics.median(r["load_s"] for r in runs), 2),
            "tokens_agreeing_with_onnxruntime": (agreement(runs[0]["tokens"], reference)
                                                 if reference else None),
            "tokens": len(runs[0]["tokens"])}
    for ours, peers in PEERS.items():
        for peer in peers:
            both = [r for r in rounds if ours in r and peer in r]
            if not both:
                continue
            out[f"{ours}_vs_{peer}"] = {
                "tokens_per_second": round(statistics.median(
                    r[ours]["tokens_per_second"] / r[peer]["tokens_per_second"] for r in both), 3),
                "first_token_time": round(statistics.median(
                    r[ours]["first_token_ms"] / r[peer]["first_token_ms"] for r in both), 3)}
    return out


def plot(summary: dict, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    engines = list(summary["engines"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(engines, [summary["engines"][e]["tokens_per_second"] for e in engines])
    left.set_ylabel("decode tokens/s (higher is better)")
    right.bar(engines, [summary["engines"][e]["first_token_ms"] for e in engines])
    right.set_ylabel("time to first token, ms (lower is better)")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=25)
    fig.suptitle(f"GPT-2 greedy generation, {summary['prompt']}-token prompt, "
                 f"{summary['new_tokens']} new tokens, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocabulary", type=int, default=50257)
    parser.add_argument("--work", default=None, help="folder for the export and libraries "
                        "(default: a new temporary folder; kept ones are reused)")
    parser.add_argument("--out", default="bench/results/generate.json")
    args = parser.parse_args()
    engines = args.engines.split(",")
    unknown = set(engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; known: {', '.join(ENGINES)}")
    import numpy as np

    from aotc.examples import decoders
    work = Path(args.work) if args.work else scratch_folder("aotc-generate-")
    work.mkdir(parents=True, exist_ok=True)
    onnx_path = decoders.export_gpt2(work, args.layers, args.heads, args.width, args.vocabulary)
    capacity = args.prompt + args.new
    paths = {"onnx": onnx_path, "prompt": work / f"prompt{args.prompt}.npy",
             "aotc": work / f"{onnx_path.stem}.kv{capacity}.so",
             "aotc_bf16": work / f"{onnx_path.stem}.kv{capacity}.bf16.so"}
    np.save(paths["prompt"], np.random.default_rng(0).integers(0, args.vocabulary,
                                                                args.prompt))
    compile_s = {}
    for engine in ("aotc", "aotc_bf16"):
        if engine in engines and not paths[engine].exists():
            print(f"compiling {engine} ...", flush=True)
            compile_s[engine] = round(compile_aotc(onnx_path, paths[engine], capacity,
                                                   engine == "aotc_bf16"), 1)
    head_dim = args.width // args.heads
    past_shapes = {name: [1, args.heads, 0, head_dim]
                   for name in decoders.input_names(args.layers)[3:]}
    rounds = []
    for k in range(args.rounds):
        order = engines if k % 2 == 0 else engines[::-1]
        results = {}
        for engine in order:
            results[engine] = run_worker(engine, paths, args.new, past_shapes)
            print(f"round {k + 1}/{args.rounds} {engine:17s} first token "
                  f"{results[engine]['first_token_ms']:8.1f} ms  "
                  f"{results[engine]['tokens_per_second']:7.1f} tokens/s", flush=True)
        rounds.append(results)
    summary = {"host": host(), "versions": versions(),
               "command": " ".join(["python", *sys.argv]), "prompt": args.prompt,
               "new_tokens": args.new, "rounds": args.rounds, "kv_capacity": capacity,
               "model": {"layers": args.layers, "heads": args.heads, "width": args.width,
                         "vocabulary": args.vocabulary}, "compile_s": compile_s,
               **summarize(rounds, engines), "per_round": rounds}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from aotc.atomic import write_bytes
    write_bytes(out, json.dumps(summary, indent=1).encode())
    picture = plot(summary, out.with_suffix(".png"))
    for key, value in summary.items():
        if "_vs_" in key:
            print(f"{key}: tokens/s ratio {value['tokens_per_second']:.2f}x, "
                  f"first-token time ratio {value['first_token_time']:.2f}x")
    print(f"wrote {out}" + (f" and {picture}" if picture else ""))


if __name__ == "__main__":
    main()
