"""The aotc command line: parses, validates, calls the API. No logic lives here.

Exit codes: 0 success, 1 failure (one-line reason; full trace with --verbose), 2 usage error.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from pathlib import Path

import click

from aotc import settings
from aotc.errors import AotcError
from aotc.measure_settings import BENCH as BENCH_MEASURE
from aotc.measure_settings import TUNE as TUNE_MEASURE
from aotc.options import CALIBRATION_METHODS, PRECISIONS, QUANTIZE_MODES


class _Ctx:
    verbose = False


class Duration(click.ParamType):
    """90, 90s, 30m or 2h: seconds as a float."""
    name = "duration"
    UNITS = {"s": 1, "m": 60, "h": 3600}

    def convert(self, value, param, ctx):
        text = str(value).strip().lower()
        unit = self.UNITS.get(text[-1:], None)
        try:
            seconds = float(text[:-1] if unit else text) * (unit or 1)
        except ValueError:
            self.fail(f"{value!r} is not a duration (e.g. 90s, 30m, 2h)", param, ctx)
        if seconds <= 0:
            self.fail(f"{value!r}: a duration must be positive", param, ctx)
        return seconds


DURATION = Duration()


def _fail(err: BaseException) -> None:
    if _Ctx.verbose or settings.VERBOSE.get() == "1":
        traceback.print_exception(err)
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _guard(func):
    """Turn any exception into the one-line failure (exit 1)."""
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except AotcError as err:
            _fail(err)
        except Exception as err:
            _fail(RuntimeError(f"internal error ({type(err).__name__}): {err}"))
    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


def _progress(start: float):
    def say(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.1f}s] {message}", err=True)
    return say


@click.group()
@click.option("--verbose", is_flag=True, help="Print full tracebacks on failure.")
@click.version_option(package_name="aotc")
def main(verbose: bool) -> None:
    """aotc: compile ONNX / PyTorch models to one .so and run them."""
    _Ctx.verbose = verbose


def quantize_options(command):
    """--quantize and its calibration options, shared by compile and tune (tune needs them to
    see the int8 kernels compile will make). The command receives them as keyword arguments
    for _quantize_options."""
    options = [
        click.option("--quantize", type=click.Choice(QUANTIZE_MODES),
                     help="Run conv2d/matmul layers in int8, calibrated on --calib (int8-dynamic: "
                          "matmuls measure their range per run); compile prints and writes an "
                          "accuracy report (OUTPUT.quant.json)."),
        click.option("--calib", type=click.Path(exists=True),
                     help="Calibration samples: a .npz of named arrays or a folder of .npy files "
                          "(int8-dynamic: optional, for the convolutions)."),
        click.option("--calib-method", type=click.Choice(CALIBRATION_METHODS),
                     default="percentile", show_default=True,
                     help="How activation ranges are chosen."),
        click.option("--percentile", type=float, default=99.99, show_default=True,
                     help="With --calib-method percentile: the share of values kept in range."),
        click.option("--skip-layers", "skip_layers", metavar="NAME[,NAME...]", default="",
                     help="Layers kept in float32 (names as the accuracy report prints them)."),
        click.option("--keep-first-last", is_flag=True,
                     help="Keep the first and last quantizable layers in float32."),
        click.option("--eval", "evaluation", type=click.Path(exists=True),
                     help="Held-out samples for the accuracy report (default: the --calib "
                          "ones)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


# shared by compile and tune (tune must see the bf16 kernels compile will make)
TRUST_PICKLE_OPTION = click.option(
    "--trust-pickle", is_flag=True,
    help="Load a .pt2 even where torch would unpickle part of it (a pickle runs code: only "
         "for files you trust).")
PRECISION_OPTION = click.option(
    "--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True,
    help="bf16: conv/matmul layers with constant weights take bfloat16 operands with float32 "
         "sums (needs AVX512-BF16); fp16: float16 operands and sums (needs AVX512-FP16).")


@main.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", "-t", default="x86", show_default=True, help="See `aotc targets`.")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False))
@click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1,D2,...",
              help="Fix an input's shape (repeatable).")
@click.option("--input-range", "input_range", multiple=True, metavar="DIM=MIN:MAX",
              help="Sizes a symbolic dim (by its name in the model) may take; the runtime "
                   "refuses others (repeatable).")
@click.option("--buckets", "buckets", multiple=True, metavar="DIM=S1,S2,...",
              help="Also build kernels specialized for these sizes of a symbolic dim; a call "
                   "runs in the smallest that fits, its inputs padded with zeros (for models "
                   "that mask padding: checked when compiling) (repeatable).")
@click.option("--kv-capacity", "kv_capacity", type=click.IntRange(2), metavar="TOKENS",
              help="For a decoder exported with past keys and values: add prefill and decode "
                   "entries that keep a KV cache of this many tokens (prompt and generated) in "
                   "place; `aotc run --generate N` and Model.generate use them.")
@click.option("--bind", "bind", multiple=True, metavar="NAME=V[,V...]",
              help="Make an input a constant of the model (then folded: an If on it keeps "
                   "one branch); it leaves the signature (repeatable).")
@click.option("--dump-ir", type=click.Path(file_okay=False), help="Write the IR after each pass.")
@click.option("--opt-level", "-O", default=3, show_default=True, type=click.IntRange(0, 3),
              help="0: only passes correctness needs (to bisect a wrong answer) ... 3: all.")
@click.option("--disable-pass", "disabled", multiple=True, metavar="NAME",
              help="Skip one pass (repeatable; names as --explain prints them).")
@click.option("--explain", is_flag=True,
              help="Print, pass by pass, the time and what changed (ops, kernels).")
@click.option("--tuning-log", "tuning_logs", multiple=True, type=click.Path(dir_okay=False),
              help="Apply the records of this log (aotc tune) where they match (repeatable).")
@click.option("--encrypt-key-file", "encrypt_key", type=click.Path(exists=True, dir_okay=False),
              help="Write the library encrypted (AES-256-GCM) with this key (aotc keygen).")
@click.option("--no-shipped-logs", "no_shipped", is_flag=True,
              help="Do not apply the tuning logs shipped with aotc (tuning_logs/).")
@TRUST_PICKLE_OPTION
@PRECISION_OPTION
@quantize_options
@_guard
def compile_cmd(model, target, output, input_shape, tuning_logs, no_shipped, encrypt_key,
                **opts):
    """Compile MODEL (.onnx or .pt2) into one shared library."""
    if encrypt_key:
        from aotc.runtime import encrypted
        encrypted.read_key(encrypt_key)  # a bad key fails before the compile
        import tempfile
        with tempfile.TemporaryDirectory(prefix="aotc-", dir=encrypted.staging_folder()) as tmp:
            plain = Path(tmp) / Path(output).name
            _compile(model, target, plain, input_shape, tuning_logs, no_shipped, **opts)
            encrypted.encrypt_file(plain, output, encrypt_key)
        click.echo(f"encrypted {output} (AES-256-GCM)")
        return
    _compile(model, target, output, input_shape, tuning_logs, no_shipped, **opts)


def _compile(model, target, output, input_shape, tuning_logs, no_shipped, **opts):
    from aotc.api import compile as compile_model
    from aotc.compiler.frontends.shapes import parse_input_shape

    int8 = _quantize_options(**{name: opts.pop(name) for name in QUANTIZE_FLAGS})
    options = _compile_options(**opts)
    start = time.perf_counter()
    meta = compile_model(model, target, output,
                         input_shapes=dict(parse_input_shape(s) for s in input_shape),
                         options=options, tuning_logs=list(tuning_logs),
                         shipped_logs=not no_shipped, quantize=int8, progress=_progress(start))
    if options.explain:
        click.echo(meta["explain"]["table"])
    if int8 is not None:
        click.echo(meta["quantization_report"]["table"])
    if "precision_report" in meta:
        click.echo(meta["precision_report"]["table"])
    tuned = f", {len(meta['tuned_kernels'])} from tuning logs" if meta["tuned_kernels"] else ""
    share = meta.get("tuning", {})
    if tuned and share.get("tuned_share") is not None:
        tuned += (f" ({share['tuned_share']:.0%} of the run time the logs measured, which covers "
                  f"{share['kernels_estimated']} of {share['kernels']} kernels)")
    click.echo(f"wrote {output} ({Path(output).stat().st_size / 1e6:.1f} MB, target "
               f"{meta['target']['name']}, {meta['compile_seconds']} s, "
               f"{len(meta['kernels'])} kernels{tuned})")


def _compile_options(input_range, buckets, bind, disabled, **fields):
    """CompileOptions from compile's flags: the parsed ones, and the rest by field name."""
    from aotc.compiler.frontends.shapes import parse_bind, parse_buckets, parse_input_range
    from aotc.options import CompileOptions
    return CompileOptions(disabled_passes=disabled,
                          dim_ranges=dict(parse_input_range(r) for r in input_range),
                          bound_inputs=dict(parse_bind(b) for b in bind),
                          buckets=dict(parse_buckets(b) for b in buckets), **fields)


# the flags quantize_options adds, as the command receives them
QUANTIZE_FLAGS = ("quantize", "calib", "calib_method", "percentile", "skip_layers",
                  "keep_first_last", "evaluation")
# the flags measure_options adds
MEASURE_FLAGS = ("number", "repeat", "min_repeat_ms", "cache_flush")


def _quantize_options(quantize, calib, calib_method, percentile, skip_layers, keep_first_last,
                      evaluation):
    from aotc.options import QuantizeOptions
    mode, method = quantize, calib_method
    if mode is None:
        if calib or evaluation:
            raise click.UsageError("--calib/--eval need --quantize int8")
        return None
    if not calib and mode == "int8":
        raise click.UsageError("--quantize int8 needs --calib SAMPLES (a .npz or a folder of "
                               ".npy files) to measure activation ranges")
    skip = tuple(n.strip() for n in skip_layers.split(",") if n.strip())
    return QuantizeOptions(calib, mode, method, percentile, skip, keep_first_last, evaluation)


def measure_options(defaults, repeat_names=("--repeat",)):
    """--number/--repeat/--min-repeat-ms/--cache-flush, shared by tune and bench
    (aotc.measure_settings); bench also keeps its older name for --repeat, --runs."""
    def decorate(command):
        options = [
            click.option("--number", type=click.IntRange(1), default=defaults.number,
                         show_default=True, help="Runs averaged into one measurement."),
            click.option(*repeat_names, "repeat",
                         type=click.IntRange(1), default=defaults.repeat, show_default=True,
                         help="Measurements."),
            click.option("--min-repeat-ms", type=click.IntRange(0), default=defaults.min_repeat_ms,
                         show_default=True,
                         help="Grow --number until one measurement lasts this long."),
            click.option("--cache-flush", is_flag=True,
                         help="Flush CPU caches before each measurement."),
        ]
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def _measure_settings(number, repeat, min_repeat_ms, cache_flush):
    from aotc.measure_settings import MeasureSettings
    return MeasureSettings(number, repeat, min_repeat_ms, cache_flush)


@main.command("tune")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--target", "-t", default="x86", show_default=True, help="See `aotc targets`.")
@click.option("--trials", type=click.IntRange(1),
              help="Measurements in all, spread over the model's kernels by weight "
                   "(default 64 when no --time-budget is given).")
@click.option("--time-budget", "time_budget", type=DURATION, metavar="DURATION",
              help="Wall-clock budget for the search, e.g. 90s, 30m, 2h.")
@click.option("--search", type=click.Choice(["rl", "evolutionary"]), default="rl",
              show_default=True, help="Search strategy: our RL search or MetaSchedule's "
                                      "evolutionary search (the baseline).")
@click.option("--log", "log_path", required=True, type=click.Path(dir_okay=False),
              help="Tuning log to append to (resumed: kernels it has are skipped).")
@click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1,D2,...",
              help="Fix an input's shape (repeatable).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--rpc", metavar="HOST:PORT", help="Measure on a device farm: its RPC tracker.")
@click.option("--key", help="With --rpc: the tracker key of the devices to measure on.")
@measure_options(TUNE_MEASURE)
@TRUST_PICKLE_OPTION
@PRECISION_OPTION
@quantize_options
@_guard
def tune_cmd(model, target, log_path, input_shape, trust_pickle, precision, **opts):
    """Tune MODEL's kernels and log the best schedules (checkpoints as found; compile applies
    those that beat the default rules). Resumes: finished kernels in the log are skipped."""
    if opts["rpc"]:  # before anything imports TVM: a dead tracker is reported in seconds
        from aotc.farm_daemons import check_tracker
        check_tracker(opts["rpc"])
    from aotc.api import tune
    from aotc.compiler.frontends.shapes import parse_input_shape
    from aotc.options import CompileOptions, TuneOptions

    quantize = _quantize_options(**{name: opts.pop(name) for name in QUANTIZE_FLAGS})
    measure = _measure_settings(*(opts.pop(name) for name in MEASURE_FLAGS))
    start = time.perf_counter()
    report = tune(model, target, log_path, TuneOptions(measure=measure, **opts),
                  input_shapes=dict(parse_input_shape(s) for s in input_shape),
                  options=CompileOptions(precision=precision, trust_pickle=trust_pickle),
                  quantize=quantize, progress=_progress(start))
    for line in report.lines():
        click.echo(line)
    click.echo(f"appended to {log_path}; compile with --tuning-log {log_path}")


@main.command("tune-report")
@click.argument("log", type=click.Path(exists=True, dir_okay=False))
@click.option("--out-dir", "-o", type=click.Path(file_okay=False),
              help="Write tasks.png and end_to_end.png (best latency against trials).")
@_guard
def tune_report_cmd(log, out_dir):
    """Per-task results of a tuning log, and tuning-curve plots."""
    from aotc.schedules import log as tuning_log
    from aotc.schedules import report

    records, warnings = tuning_log.read(log)
    for warning in warnings:
        click.echo(warning, err=True)
    records = report.latest_per_task([r for r in records if r.final])
    if not records:
        raise click.ClickException(f"{log}: no finished tuning records")
    for line in report.table(records):
        click.echo(line)
    if out_dir:
        paths = report.plot(records, out_dir)
        click.echo("wrote " + ", ".join(map(str, paths)) if paths
                   else "matplotlib not installed: no plots (pip install '.[bench]')")


@main.command("run")
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy")
@click.option("--output-dir", type=click.Path(file_okay=False), help="Write outputs as .npy.")
@click.option("--generate", "generate", type=click.IntRange(1), metavar="N",
              help="A decoder compiled with --kv-capacity: greedily generate N tokens after "
                   "the prompt (--prompt, or random token ids) and print them with the time to "
                   "the first token and the decode rate.")
@click.option("--prompt", metavar="ID,ID,...|LENGTH", default="16", show_default=True,
              help="With --generate: the prompt's token ids, or a length for random ids.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False),
              help="With --generate: write the tokens and timings as JSON.")
@_guard
def run_cmd(artifact, inputs, output_dir, generate, prompt, json_out):
    """Run a compiled model once (random inputs unless --input is given), or generate."""
    import numpy as np

    from aotc.runtime import load
    from aotc.runtime.inputs import load_npy_inputs, npy_file_name, random_inputs

    model = load(artifact)
    if generate:
        _generate(model, generate, prompt, json_out)
        return
    feed = load_npy_inputs(inputs) if inputs else random_inputs(model.signature)
    outputs = model.run(feed)
    for name, value in outputs.items():
        click.echo(f"{name}: {value.dtype}{list(value.shape)} mean={value.mean():.6g} "
                   f"min={value.min():.6g} max={value.max():.6g}")
        if output_dir:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            np_path = Path(output_dir) / npy_file_name(name)
            np.save(np_path, value)
            click.echo(f"  -> {np_path}")


def _generate(model, new_tokens: int, prompt: str, json_out: str | None) -> None:
    import json

    from aotc.atomic import write_bytes

    ids = _prompt_ids(model, prompt)
    result = model.generate(ids, new_tokens)
    report = result.to_json()
    click.echo(f"prompt ({len(ids)} tokens): {' '.join(str(int(t)) for t in ids)}")
    click.echo(f"generated ({len(result.tokens)} tokens): "
               f"{' '.join(str(t) for t in result.tokens)}")
    median = report["decode_ms_median"]
    click.echo(f"first token {report['first_token_ms']:.1f} ms; "
               + (f"then {report['tokens_per_second']:.1f} tokens/s "
                  f"(median {median:.2f} ms a token)" if median else "no later tokens"))
    if json_out:
        write_bytes(Path(json_out), json.dumps({**report, "prompt": [int(t) for t in ids]},
                                               indent=1).encode())


def _prompt_ids(model, prompt: str):
    import numpy as np
    parts = [p for p in prompt.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise click.UsageError(f"--prompt {prompt!r}: token ids (1,2,3) or a length") from None
    if len(values) == 1 and "," not in prompt:
        if values[0] < 1:
            raise click.UsageError("--prompt: a length of at least 1")
        vocabulary = _vocabulary(model)
        return np.random.default_rng(0).integers(0, vocabulary, values[0])
    return np.array(values, dtype="int64")


def _vocabulary(model) -> int:
    table = model.metadata.get("generation")
    if table is None:
        raise click.UsageError(f"{model.path.name} was compiled without --kv-capacity: it "
                               "cannot generate")
    logits = next(o for o in model.signature.outputs if o.name == table["logits"])
    size = logits.shape[-1]
    return size if isinstance(size, int) else 2


@main.command("bench")
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--compare-onnx", type=click.Path(exists=True, dir_okay=False),
              help="Also time this ONNX model in onnxruntime on the same inputs.")
@measure_options(BENCH_MEASURE, repeat_names=("--repeat", "--runs"))
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(0))
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write results as JSON.")
@_guard
def bench_cmd(artifact, compare_onnx, number, repeat, min_repeat_ms, cache_flush, warmup,
              json_out):
    """Latency percentiles and throughput, optionally against onnxruntime (measured as
    aotc tune measures: see --number, --repeat, --min-repeat-ms, --cache-flush)."""
    from aotc.bench import run_bench
    report = run_bench(artifact, compare_onnx, warmup=warmup,
                       settings=_measure_settings(number, repeat, min_repeat_ms, cache_flush))
    click.echo(report.table())
    if json_out:
        Path(json_out).write_text(report.to_json())


@main.command("profile")
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--runs", default=10, show_default=True, type=click.IntRange(1),
              help="Timed repeats per kernel (the median is kept).")
@click.option("--top", default=25, show_default=True, type=click.IntRange(0),
              help="Rows to print, slowest first (0: all).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write results as JSON.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE",
              help="Size of a symbolic dim (repeatable; 1 where not given), e.g. seq=128.")
@click.option("--entry", type=click.Choice(["decode", "prefill", "main"]),
              help="A decoder compiled with --kv-capacity: the entry to profile (default "
                   "decode: one token after a prompt of the sequence dim's size).")
@_guard
def profile_cmd(artifact, runs, top, json_out, dims, entry):
    """Time every kernel of a compiled model: calls, ms, share, GFLOP/s."""
    from aotc.runtime import load
    from aotc.runtime.profile import profile
    sizes = {}
    for item in dims:
        name, _, size = item.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise click.BadParameter(f"{item!r}: expected NAME=SIZE with SIZE >= 1",
                                     param_hint="--dim")
        sizes[name] = int(size)
    try:
        report = profile(load(artifact), repeats=runs, dims=sizes, entry=entry)
    except ValueError as err:  # no kernel table, or a --dim the model does not have
        raise click.ClickException(str(err)) from None
    click.echo(report.table(top or None))
    if json_out:
        Path(json_out).write_text(report.to_json())


@main.command("keygen")
@click.argument("key_file", type=click.Path(dir_okay=False))
@_guard
def keygen_cmd(key_file):
    """Write a new random 256-bit key (hex, mode 0600) for encrypted models."""
    from aotc.runtime.encrypted import new_key_file
    try:
        new_key_file(key_file)
    except FileExistsError:
        raise click.ClickException(f"{key_file} exists; keys are never overwritten") from None
    click.echo(f"wrote {key_file}")


@main.command("serve")
@click.argument("models", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="YAML/JSON: models (path, name, version, batching), limits, ports.")
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None,
              help="Open Inference Protocol over HTTP (default 8000).")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None,
              help="Open Inference Protocol over gRPC (default 8001).")
@click.option("--no-grpc", is_flag=True, help="Serve HTTP only.")
@click.option("--max-batch", type=click.IntRange(1), default=None,
              help="Rows per model run for models with a symbolic batch dim (default 1: "
                   "no batching).")
@click.option("--max-delay-ms", type=click.FloatRange(0), default=None,
              help="How long a request waits for others to batch with (default 2).")
@click.option("--queue-limit", type=click.IntRange(1), default=None,
              help="Queued requests per model before 503 + Retry-After (default 256).")
@click.option("--access-log", is_flag=True, help="One JSON line per request on stderr.")
@click.option("--key-file", type=click.Path(exists=True, dir_okay=False),
              help="Key of encrypted models (also AOTC_MODEL_KEY / AOTC_MODEL_KEY_FILE).")
@click.option("--ray", "on_ray", is_flag=True,
              help="Deploy on Ray Serve instead (HTTP only): a deployment per model with "
                   "its replicas or autoscaling from the config's 'ray:' settings.")
@click.option("--ray-address", default=None,
              help="With --ray: the cluster to join (default: start one on this machine).")
@click.option("--ray-cpus", type=click.IntRange(1), default=None,
              help="With --ray and no --ray-address: logical cores of the cluster started "
                   "here (default: this machine's cores).")
@click.option("--replicas", type=click.IntRange(1), default=None,
              help="With --ray: replicas of each model given on the command line.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="With --ray: cores each replica reserves and runs on (default 1).")
@_guard
def serve_cmd(models, config_path, host, http_port, grpc_port, no_grpc, max_batch,
              max_delay_ms, queue_limit, access_log, key_file, on_ray, ray_address, ray_cpus,
              replicas, threads):
    """Serve compiled models over the Open Inference Protocol (KServe v2), HTTP and gRPC,
    with dynamic batching and Prometheus metrics at /metrics. Stops on SIGTERM/SIGINT after
    answering every request it has received."""
    from aotc import serve
    from aotc.serve import config as serve_config
    from aotc.serve.metrics import log_to_stderr
    flags = {k: v for k, v in (("max_batch", max_batch), ("max_delay_ms", max_delay_ms),
                               ("queue_limit", queue_limit)) if v is not None}
    base = serve.BatchSettings(**flags)
    if not on_ray and (ray_address or ray_cpus or replicas or threads):
        raise click.UsageError("--ray-address, --ray-cpus, --replicas and --threads go with "
                               "--ray")
    if on_ray and grpc_port is not None:
        raise click.UsageError("--ray serves HTTP only (Ray's proxy); drop --grpc-port")
    config = serve_config.read(config_path, base) if config_path else serve.ServeConfig()
    ray = serve.RaySettings(replicas or 1, threads or 1)
    config.models += [serve.ModelConfig(Path(m), batching=base, ray=ray) for m in models]
    if key_file:
        config.models = [m if m.key_file else dataclasses.replace(m, key_file=Path(key_file))
                         for m in config.models]
    if not config.models:
        raise click.UsageError("give a model (MODEL.so) or a --config that lists models")
    config.host = host or config.host
    config.http_port = http_port if http_port is not None else config.http_port
    config.grpc_port = None if no_grpc else (grpc_port if grpc_port is not None
                                             else config.grpc_port)
    if access_log:
        log_to_stderr()
    if on_ray:
        from aotc.serve.ray_app import serve_on_ray
        serve_on_ray(config, ray_address, ray_cpus)
        return
    serve.serve(config)


@main.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False))
@_guard
def inspect_cmd(model):
    """Op table (op, count, supported) and signature of an ONNX model or compiled .so."""
    from aotc.inspect import describe
    click.echo(describe(model))


@main.command("targets")
@_guard
def targets_cmd():
    """List every target family and preset: what it needs, whether it builds and runs here."""
    from aotc.targets import all_targets, runs_here
    click.echo(f"{'target':17s} {'family':6s} {'builds here':12s} {'runs here':10s} description")
    for spec in all_targets():
        build_missing, run_missing = spec.toolchain.missing(), runs_here(spec)
        click.echo(f"{spec.name:17s} {spec.family:6s} {'yes' if not build_missing else 'no':12s} "
                   f"{'yes' if not run_missing else 'no':10s} {spec.description}")
        for why in filter(None, (build_missing, run_missing)):
            click.echo(f"{'':17s} needs: {why}")


@main.command("package")
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
              help="New folder for the bundle.")
@click.option("--farm-server", is_flag=True,
              help="Also bin/aotc-rpc-server: the target machine can then serve a tuning farm.")
@click.option("--key-file", type=click.Path(exists=True, dir_okay=False),
              help="An encrypted model's key, to read its metadata (the bundle keeps the "
                   "model encrypted and holds no key).")
@_guard
def package_cmd(artifact, output, farm_server, key_file):
    """Bundle a compiled model with the C++ runner and the TVM runtime for its architecture,
    to run on a machine without Python (bin/aotc-run)."""
    from aotc.package import package
    bundle = package(artifact, output, farm_server=farm_server, key_file=key_file)
    click.echo(f"wrote {bundle.folder} ({bundle.arch}): "
               f"runtime {bundle.runtime_bytes / 1e6:.1f} MB "
               f"+ model {bundle.model_bytes / 1e6:.1f} MB")
    click.echo(f"run: {bundle.runner} {bundle.model.relative_to(bundle.folder)} --runs 10")


@main.group("farm")
def farm_group():
    """A device farm: TVM RPC tracker and servers (each stops with its workers)."""


@farm_group.command("tracker")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (a private network only: servers run what they are sent).")
@click.option("--port", default=9190, show_default=True, type=int)
@_guard
def farm_tracker_cmd(host, port):
    """Run a tracker in the foreground until Ctrl-C / SIGTERM."""
    from aotc import farm_daemons as farm
    from aotc.schedules.farm_target import summary
    tracker = farm.start_tracker(host, port, log=sys.stderr)
    farm.wait_for(lambda: summary(host, port), 30, f"tracker {host}:{port}", tracker)
    click.echo(f"tracker on {host}:{port}")
    sys.exit(farm.run_foreground(tracker))


@farm_group.command("server")
@click.option("--tracker", "tracker", required=True, metavar="HOST:PORT")
@click.option("--key", required=True, help="What the device is, e.g. x86-avx512 or rk3588.")
@click.option("--target", "-t", help="The aotc target this device runs (checked to exist).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9300, show_default=True, type=int,
              help="First port to try (the next free one of 100 is used).")
@click.option("--cpp", is_flag=True,
              help="Serve with aotc's C++ server (libtvm_runtime only) instead of TVM's "
                   "Python one.")
@click.option("--arch", help="Serve as a board of this architecture (e.g. aarch64): the C++ "
                             "server for it, under its emulator when foreign (qemu-aarch64).")
@_guard
def farm_server_cmd(tracker, key, target, host, port, cpp, arch):
    """Run a server for this machine (or an emulated board), registered under KEY, until
    Ctrl-C / SIGTERM. Waits for the tracker as long as it takes, and restarts the server when
    it exits (a tracker restart)."""
    from aotc import farm_daemons as farm
    from aotc.schedules.farm_target import Farm, summary
    if target:
        from aotc.targets import resolve
        resolve(target)
    located = Farm.parse(tracker, key)

    def start():
        server = farm.start_cpp_server(tracker, key, arch, host, port, log=sys.stderr) \
            if cpp or arch else farm.start_server(tracker, key, host, port, log=sys.stderr)
        click.echo(f"started {server.name}", err=True)
        return server

    sys.exit(farm.supervise(start, lambda: summary(located.host, located.port),
                            f"tracker {tracker}", say=lambda m: click.echo(m, err=True)))


@farm_group.command("status")
@click.argument("tracker", metavar="HOST:PORT")
@_guard
def farm_status_cmd(tracker):
    """Servers per key (free / busy / pending requests) of a tracker."""
    from aotc.schedules.farm_target import Farm, summary
    located = Farm.parse(tracker, "")
    info = summary(located.host, located.port)
    servers = info.get("server_info", [])
    click.echo(f"tracker {located.address}: {len(servers)} servers")
    click.echo(f"{'key':20s} {'servers':>7s} {'free':>5s} {'busy':>5s} {'pending':>7s}")
    queues = info.get("queue_info", {})
    # a server is in server_info from its first message, in its key's queue only once it has
    # offered itself: list the keys of both (the status test once caught the gap)
    keys = set(queues) | {s.get("key", "").split(":")[-1] for s in servers if s.get("key")}
    for key in sorted(keys):
        queue = queues.get(key, {})
        count = sum(1 for s in servers if s.get("key", "").split(":")[-1] == key)
        free = queue.get("free", 0)
        click.echo(f"{key:20s} {count:7d} {free:5d} {max(count - free, 0):5d} "
                   f"{queue.get('pending', 0):7d}")


if __name__ == "__main__":
    main()
