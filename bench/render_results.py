"""Renders the benches' JSON in ``bench/results/`` into ``docs/results.md`` (a table per file,
with the host, versions and command that produced it, and its plot) and the short results
table of README.md (between ``<!-- results:start -->`` and ``<!-- results:end -->``).

    python bench/render_results.py            # rewrite docs/results.md and the README table
    python bench/render_results.py --check    # exit 1 when either is out of date (CI)

Every number in the docs comes from these files: a bench run, then this script, then a commit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
README = ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
ENGINE_NAMES = {"aotc": "aotc", "aotc_bf16": "aotc `--precision bf16`",
                "onnxruntime": "onnxruntime", "openvino_fp32": "OpenVINO, f32 hint",
                "openvino_default": "OpenVINO, default (bf16 on AVX512-BF16)",
                "aoti": "torch AOTInductor", "iree": "IREE llvm-cpu"}


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def _provenance(data: dict) -> list[str]:
    host = data.get("host", {})
    features = ", ".join(host.get("features", [])) or "not recorded"
    lines = [f"Host: {host.get('cpu', '?')}, {host.get('cores', '?')} cores "
             f"(CPU features: {features})."]
    if data.get("versions"):
        lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items())
                     + ".")
    lines.append(f"Command: `{data.get('command', 'not recorded')}`.")
    return [" ".join(lines)]


def _ratio_columns(rows: list[dict]) -> list[str]:
    keys = []
    for row in rows:
        keys += [k for k in row if "_vs_" in k and k not in keys and not k.endswith("_compile")]
    return keys


def _compile_ratios(rows: list[dict]) -> list[str]:
    """aotc's compile time over each peer's, the median of per-round ratios (with
    --compile-rounds above 1)."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k.endswith("_compile") and "_vs_" in k and k not in keys]
    if not keys:
        return []
    header = ["model", *(k[:-len("_compile")].replace("_vs_", " / ") + " compile" for k in keys)]
    rounds = max(len(r.get("compile_rounds", [])) for r in rows)
    return [f"Compile time ratio (median of {rounds} alternated builds):", "",
            *_table(header, [[r["model"], *(_f(r.get(k)) for k in keys)] for r in rows]), ""]


def peers_table(data: dict) -> list[str]:
    """Latency of each engine and aotc's ratios to the others (medians of per-round ratios;
    lower is better for aotc), then each engine's compile seconds and the cosine of its
    output to torch's (the accuracy of bf16 next to OpenVINO's default)."""
    rows, ratios = data["rows"], _ratio_columns(data["rows"])
    engines = [e for e in ENGINE_NAMES if any(f"{e}_ms" in r for r in rows)]
    header = ["model", *(f"{e} ms" for e in engines), *(k.replace("_vs_", " / ") for k in ratios)]
    body = [[row["model"], *(_f(row.get(f"{e}_ms"), 1) for e in engines),
             *(_f(row.get(k)) for k in ratios)] for row in rows]
    slow = [f"{r['model']}: {len(r['slow_kernels'])}" for r in rows if r.get("slow_kernels")]
    notes = [f"Kernels the bench flags as far below their class: {', '.join(slow)}.", ""] \
        if slow else []
    failures = [f"- {r['model']}, {engine}: {_last_line(error)}" for r in rows
                for engine, error in r.get("errors", {}).items()]
    if failures:
        notes += ["Engines that failed (their last line of error):", "", *failures, ""]
    return [*_table(header, body), "", *notes,
            "Compile seconds:", "", *_per_engine(rows, engines, _compile_seconds, 1), "",
            *_compile_ratios(rows),
            "Cosine of each engine's output to torch's:", "",
            *_per_engine(rows, engines, _cosine, 5)]


def _last_line(error: str) -> str:
    lines = [line.strip(" -") for line in error.splitlines() if line.strip(" -")]
    return lines[-1] if lines else "?"


def _compile_seconds(row: dict, engine: str) -> float | None:
    return row.get("compile_s", {}).get(engine)


def _cosine(row: dict, engine: str) -> float | None:
    return row.get("accuracy", {}).get(engine, {}).get("cosine")


def _per_engine(rows: list[dict], engines: list[str], value, digits: int) -> list[str]:
    """A table of ``value(row, engine)`` per model and engine."""
    return _table(["model", *engines],
                  [[r["model"], *(_f(value(r, e), digits) for e in engines)] for r in rows])


def generate_table(data: dict) -> list[str]:
    """Time to the first token and decode tokens/s per engine, and aotc's ratios."""
    model = data["model"]
    intro = (f"GPT-style decoder ({model['layers']} layers, width {model['width']}, vocabulary "
             f"{model['vocabulary']}), batch 1, {data['prompt']}-token prompt, "
             f"{data['new_tokens']} new tokens, greedy, {data['rounds']} rounds; "
             f"aotc built with `--kv-capacity {data['kv_capacity']}`.")
    body = [[ENGINE_NAMES.get(e, e), _f(v["first_token_ms"], 1), _f(v["tokens_per_second"], 1),
             f"{v['tokens_agreeing_with_onnxruntime']} of {v['tokens']}"]
            for e, v in data["engines"].items()]
    ratios = [[k.replace("_vs_", " / "), _f(v["tokens_per_second"]), _f(v["first_token_time"])]
              for k, v in data.items() if "_vs_" in k]
    return [intro, "", *_table(["engine", "first token ms", "decode tokens/s",
                                "tokens equal to onnxruntime's"], body), "",
            *_table(["ratio (medians of per-round ratios)", "tokens/s", "first-token time"],
                    ratios)]


def variable_length_table(data: dict) -> list[str]:
    """Fixed-length, bucketed and symbolic builds against onnxruntime, per sequence length."""
    body = [[str(r["seq"]), _f(r["aotc_fixed_ms"], 1), _f(r["aotc_buckets_ms"], 1),
             _f(r["aotc_dynamic_ms"], 1), _f(r["onnxruntime_ms"], 1),
             _f(r["aotc_buckets_vs_onnxruntime"]), _f(r["aotc_dynamic_vs_onnxruntime"])]
            for r in data["rows"]]
    model = data["rows"][0]["model"] if data["rows"] else "?"
    return [f"{model}, batch 1, ms (medians over rounds, each build in a fresh process).", "",
            *_table(["seq", "fixed-length build", "buckets", "symbolic", "onnxruntime",
                     "buckets / onnxruntime", "symbolic / onnxruntime"], body)]


def contention_table(data: dict) -> list[str]:
    """aotc / onnxruntime at p50 and p99 in each scenario (lower is better for aotc)."""
    scenarios = list(dict.fromkeys(r["scenario"] for r in data["rows"]))
    by_model: dict[str, dict] = {}
    for row in data["rows"]:
        by_model.setdefault(row["model"], {})[row["scenario"]] = (
            f"{_f(row['aotc_vs_onnxruntime_p50'])}, {_f(row['aotc_vs_onnxruntime_p99'])}")
    body = [[m, *(cells.get(s, "-") for s in scenarios)] for m, cells in by_model.items()]
    return [f"aotc / onnxruntime, p50 and p99 latency ratios; {data['rounds']} rounds of "
            f"{data['runs']} runs; CPU quota through {data.get('quota', '?')}.", "",
            *_table(["model", *scenarios], body)]


def serve_load_table(data: dict) -> list[str]:
    """Throughput at the P99 SLO per server setup, every step of the sweeps, and the burst."""
    summary = data["throughput_at_slo"]
    base = summary.get("onnxruntime_no_batching") or None
    top = [[setup.replace("_", " "), _f(value, 1),
            _f(value / base if base else None)] for setup, value in summary.items()]
    steps = [[s["setup"].replace("_", " "), _f(s["rate"], 0), _f(s["throughput"], 1),
              _f(s["p50_ms"], 0), _f(s["p99_ms"], 0), str(s["refused_503"])]
             for s in data["steps"]]
    b = data["burst"]
    model = data["model"]["config"]
    return [f"Encoder ({model['num_hidden_layers']} layers, "
            f"{model['hidden_size']} wide), request lengths {data['model']['lengths'][0]}-"
            f"{data['model']['lengths'][1]}, buckets {data['model']['buckets']}; Poisson "
            f"arrivals, P99 SLO {data['slo_ms']:.0f} ms; client and server on the same cores.",
            "", *_table(["setup", "requests/s at the SLO", "/ onnxruntime, no batching"], top),
            "", *_table(["setup", "offered /s", "done /s", "p50 ms", "p99 ms", "503s"], steps),
            "", f"Burst at {b['rate']:.0f}/s for 3 s against a queue limit of 64: {b['sent']} "
            f"sent, {b['ok']} answered 200, {b['refused_503']} refused 503 with Retry-After, "
            f"{b['other']} other, {b['sent'] - b['answered']} lost."]


def batch_cost_table(data: dict) -> list[str]:
    """Per engine and batch size: time per run, per row, and per row against batch 1."""
    model = data["model"]
    body = [[ENGINE_NAMES.get(r["engine"], r["engine"]), str(r["batch"]), _f(r["ms_per_run"], 1),
             _f(r["ms_per_row"], 1), _f(r["per_row_vs_batch_1"])] for r in data["rows"]]
    return [f"Encoder ({model['num_hidden_layers']} layers, {model['hidden_size']} wide), "
            f"{data['seq']} tokens per request; medians of {data['runs']} runs, median over "
            f"{data['rounds']} alternated rounds. Batching pays where the last column is below "
            "1.0.", "",
            *_table(["engine", "batch", "ms per run", "ms per row", "per row / batch 1"], body)]


def parallel_grain_table(data: dict) -> list[str]:
    """One elementwise kernel per size: TVM's pool against the calling thread."""
    body = [[str(r["elements"]), r["op"], _f(r["pool_us"]), _f(r["inline_us"]),
             _f(r["pool_vs_inline"])] for r in data["rows"]]
    return [f"`y = x + 1` (add) and `y = exp(x) * 0.5 + 1` (exp), float32, "
            f"{data['threads']} pool threads; microseconds per run, medians of TVM's time "
            "evaluator.", "",
            *_table(["elements", "op", "pool us", "calling thread us", "pool / calling thread"],
                    body)]


def quantize_table(data: dict) -> list[str]:
    """Milliseconds per precision and engine, int8's speed-ups, and each reduced precision's
    cosine to its engine's float32 on held-out inputs."""
    engines = ["aotc_fp32", "aotc_int8", "aotc_bf16", "aotc_fp16", "ort_fp32", "ort_int8"]
    engines = [e for e in engines if any(f"{e}_ms" in r for r in data["rows"])]
    speedups = ["speedup_vs_aotc_fp32", "speedup_vs_ort_fp32", "speedup_vs_ort_int8"]
    times = [[r["model"], *(_f(r.get(f"{e}_ms")) for e in engines),
              *(_f(r.get(k)) for k in speedups)] for r in data["rows"]]
    accuracy = ["aotc_int8", "ort_int8", "aotc_bf16", "aotc_fp16"]
    cosines = [[r["model"], *(_f((r.get(f"{a}_accuracy") or {}).get("cosine"), 5)
                              for a in accuracy)] for r in data["rows"]]
    return [f"Batch 1, median of {data['runs']} runs in a fresh process per engine, "
            f"{data['rounds']} alternated rounds; aotc int8's speed-up over each (median of "
            "per-round ratios).", "",
            *_table(["model", *(f"{e} ms" for e in engines),
                     *(f"int8 {k.replace('speedup_vs_', 'vs ')}" for k in speedups)], times),
            "", "Cosine of each reduced precision's output to its engine's float32 on held-out "
            "inputs:", "", *_table(["model", *accuracy], cosines)]


def call_overhead_table(data: dict) -> list[str]:
    """Whole-call latency of models whose kernels take microseconds, per engine."""
    engines = [e for e in ENGINE_NAMES if any(f"{e}_us" in r for r in data["rows"])]
    ratios = [k for k in data["rows"][0] if k.startswith("aotc_vs_")]
    body = [[r["model"], *(_f(r.get(f"{e}_us"), 1) for e in engines),
             *(_f(r.get(k)) for k in ratios)] for r in data["rows"]]
    return [f"Median microseconds per call (Python API, {data['runs']} calls in a fresh "
            f"process, median over {data['rounds']} alternated rounds); ratios are medians of "
            "per-round ratios.", "",
            *_table(["model", *(f"{e} us" for e in engines),
                     *(k.replace("_vs_", " / ") for k in ratios)], body)]


RENDERERS: dict[str, tuple[str, Callable[[dict], list[str]]]] = {
    "peers": ("Standard architectures against peer engines", peers_table),
    "peers_iree": ("Compile time and latency against IREE", peers_table),
    "peers_iree_avx2": ("AVX2 host: compile time and latency against IREE", peers_table),
    "peers_iree_amx": ("Sapphire Rapids host: compile time against IREE, float32 and bf16 builds",
                       peers_table),
    "peers_gpt2_power": ("GPT-2 small after the constant-power rewrite", peers_table),
    "peers_efficientnet_auto_pad": ("EfficientNet-B0 after the Conv auto_pad rewrite",
                                    peers_table),
    "peers_efficientnet_pad": ("EfficientNet-B0 (explicit pads) after Pad became the Relax op",
                               peers_table),
    "peers_bf16_winograd_residual": (
        "bf16 ResNet-50 and MobileNetV3 after Winograd forms and bf16 residual paths",
        peers_table),
    "peers_bf16_transformers": ("bf16 BERT-base and ViT-B/16 against OpenVINO's default",
                                peers_table),
    "peers_bert_combined_qkv": ("BERT-base with Q, K and V as one matmul", peers_table),
    "peers_mobilenetv3_bf16_residual": ("bf16 MobileNetV3-Large, 6 rounds", peers_table),
    "peers_bf16_attention": ("bf16 BERT-base and ViT-B/16 with bf16 attention", peers_table),
    "peers_avx2": ("Standard architectures on an AVX2 host without AVX-512", peers_table),
    "peers_fp32_vit_whisper": ("float32 ViT-B/16 and Whisper-base encoder, 8 rounds",
                               peers_table),
    "peers_avx2_epilogues": (
        "AVX2 host: long-sequence attention tasks, softmax and constant divisions as "
        "multiplies, hard-swish fused into its conv", peers_table),
    "peers_avx2_wide_vectors": (
        "AVX2 host: softmax passes 4 vectors a step, transposing copies by tiles of rows",
        peers_table),
    "peers_avx2_whisper_10_rounds": (
        "AVX2 host: Whisper-base encoder against onnxruntime and OpenVINO fp32, 10 rounds",
        peers_table),
    "peers_new_architectures": (
        "Architectures the tables above lack: Swin-T, wav2vec2-base, a Llama-style decoder, "
        "T5-small's encoder", peers_table),
    "peers_spr_before_amx": (
        "Sapphire Rapids host (AMX) before aotc's AMX kernels: bf16 on vdpbf16ps", peers_table),
    "peers_amx": ("Sapphire Rapids host: bf16 matmuls and convs on AMX tiles", peers_table),
    "peers_amx_bf16_activations": (
        "Sapphire Rapids host: bf16 activations through the stem's max pool and the conv "
        "shortcuts, pools reading their input in place", peers_table),
    "peers_amx_gpt2": ("Sapphire Rapids host: GPT-2 small with its attention fused (the "
                       "probabilities' identity cast removed)", peers_table),
    "peers_amx_other_architectures": (
        "Sapphire Rapids host: MobileNetV3-Large, ConvNeXt-T and Swin-T, 2 rounds", peers_table),
    "peers_amx_final": ("Sapphire Rapids host: ResNet-50, BERT-base, ViT-B/16 and GPT-2 small "
                        "with AMX crops right after each tile", peers_table),
    "peers_amx_matmul_rows": (
        "Sapphire Rapids host: float32 matmul tiles of 8 rows, crops right after each tile",
        peers_table),
    "peers_amx_more_architectures": (
        "Sapphire Rapids host: eight more architectures (CNNs, audio encoders, a Llama-style "
        "decoder, T5's encoder), 2 rounds", peers_table),
    "peers_amx_issue35": (
        "Sapphire Rapids host: the seven architectures of issue 35's table, 4 rounds",
        peers_table),
    "peers_amx_resnet50_flat_conv": (
        "Sapphire Rapids host: ResNet-50 with its 14x14 and 7x7 bf16 convs over the flattened "
        "padded image, 4 rounds", peers_table),
    "peers_amx_issue35_padded_image": (
        "Sapphire Rapids host: the seven architectures of issue 35's table with padded copies "
        "in power-of-two vectors and convs reading their padded input in place, 4 rounds",
        peers_table),
    "peers_amx_resnet50_bf16_8_rounds": (
        "Sapphire Rapids host: ResNet-50 bf16 against OpenVINO's default, 8 rounds",
        peers_table),
    "peers_amx_vgg16": ("Sapphire Rapids host: VGG-16 with batch norm, 4 rounds", peers_table),
    "quantize_amx": ("Sapphire Rapids host: int8, bf16 and fp16 against float32 and "
                     "onnxruntime's int8, AMX kernels", quantize_table),
    "generate": ("Generation with a KV cache", generate_table),
    "generate_avx2": ("AVX2 host: generation with a KV cache", generate_table),
    "generate_amx": ("Sapphire Rapids host (AMX): generation with a KV cache", generate_table),
    "variable_length_bert": ("Variable-length inputs: BERT-base", variable_length_table),
    "variable_length_gpt2": ("Variable-length inputs: GPT-2 small", variable_length_table),
    "contention": ("Shared CPUs: busy neighbours, a CPU quota, two processes",
                   contention_table),
    "contention_mobilenetv2": ("Shared CPUs: MobileNetV2 with more rounds", contention_table),
    "serve_load": ("Serving: dynamic batching under load", serve_load_table),
    "serve_load_bert_base": ("Serving: BERT-base under load, short requests", serve_load_table),
    "batch_cost": ("Serving: what a batch costs per request, small encoder", batch_cost_table),
    "batch_cost_bert_base": ("Serving: what a batch costs per request, BERT-base",
                             batch_cost_table),
    "call_overhead": ("What a call costs: models whose kernels take microseconds",
                      call_overhead_table),
    "parallel_grain": ("Where a parallel loop pays: one kernel on the pool or the calling thread",
                       parallel_grain_table),
}


def results_page() -> tuple[str, list[Path]]:
    """docs/results.md's text and the plots it shows."""
    lines = ["# Results", "",
             "Generated by `python bench/render_results.py` from the JSON the benches write into "
             "`bench/results/`; do not edit by hand. Latency ratios are medians of per-round "
             "ratios, each engine in its own fresh process, engines alternating by round, "
             "default thread settings. Figures from one host do not transfer to another: "
             "each table names its host.", ""]
    plots = []
    for name, (title, render) in RENDERERS.items():
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        lines += [f"## {title}", "", *_provenance(data), "", *render(data), ""]
        plot = path.with_suffix(".png")
        if plot.exists():
            plots.append(plot)
            lines += [f"![{title}](results/{plot.name})", ""]
    unknown = sorted(p.stem for p in RESULTS.glob("*.json") if p.stem not in RENDERERS)
    if unknown:
        raise SystemExit(f"no renderer for bench/results/{unknown[0]}.json: add one to RENDERERS")
    return "\n".join(lines).rstrip() + "\n", plots


def readme_table() -> str:
    """The README's short table: aotc's latency and its main ratios from peers.json."""
    data = json.loads((RESULTS / "peers.json").read_text())
    host = data["host"]
    body = [[r["model"], _f(r.get("aotc_ms"), 1), _f(r.get("aotc_vs_onnxruntime")),
             _f(r.get("aotc_vs_openvino_fp32")), _f(r.get("aotc_vs_aoti")),
             _f(r.get("aotc_bf16_vs_openvino_default"))] for r in data["rows"]]
    return "\n".join([
        f"Batch 1, {host['cpu']}, {host['cores']} cores ({', '.join(host['features'])}); "
        f"`{data['command']}`; latency ratios, lower is better for aotc. More, and how it is "
        "measured: [docs/results.md](docs/results.md).", "",
        *_table(["model", "aotc ms", "/ onnxruntime", "/ OpenVINO fp32", "/ AOTInductor",
                 "bf16 / OpenVINO default"], body)])


def readme_text() -> str:
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{readme_table()}\n{END}{rest.split(END, 1)[1]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/results.md or the README table is out of date")
    args = parser.parse_args()
    page, plots = results_page()
    readme = readme_text()
    target = DOCS / "results.md"
    if args.check:
        stale = [str(p.relative_to(ROOT)) for p, text in ((target, page), (README, readme))
                 if not p.exists() or p.read_text() != text]
        stale += [f"docs/results/{p.name}" for p in plots
                  if not (DOCS / "results" / p.name).exists()
                  or (DOCS / "results" / p.name).read_bytes() != p.read_bytes()]
        if stale:
            print(f"out of date: {', '.join(stale)}; run python bench/render_results.py")
            return 1
        return 0
    (DOCS / "results").mkdir(parents=True, exist_ok=True)
    for plot in plots:
        shutil.copyfile(plot, DOCS / "results" / plot.name)
    target.write_text(page)
    README.write_text(readme)
    print(f"wrote {target.relative_to(ROOT)} ({len(plots)} plots) and the README table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
