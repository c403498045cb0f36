"""The public API. Heavy imports (TVM, onnx, torch) happen inside the functions so that
``import aotc`` and ``aotc --help`` stay instant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def compile(model, target: str = "x86", output: str | Path = "model.so", *,
            input_shapes: dict[str, tuple[int, ...]] | None = None, example_inputs=None,
            dump_ir: str | Path | None = None, options=None,
            tuning_logs: list[str | Path] | None = None, shipped_logs: bool = True,
            quantize=None, precision: str | None = None,
            progress: Callable[[str], None] | None = None) -> dict:
    """Compile an ONNX file / ModelProto, a torch.nn.Module (with ``example_inputs``) or a
    ``.pt2`` ExportedProgram for ``target`` into one shared library at ``output``.

    ``options``: an ``aotc.CompileOptions`` (opt level, disabled passes, explain, IR dumps);
    ``dump_ir`` is a shortcut for its dump folder. ``tuning_logs``: tuning logs (``aotc
    tune``) whose records are applied where workload and target match, on top of the logs
    shipped in ``tuning_logs/`` (unless ``shipped_logs`` is False); the default rules
    schedule every other kernel. ``precision`` ("fp32", "bf16"): a shortcut for the options'
    precision; bf16 is refused, before the import, on targets without the instructions.
    Returns the metadata embedded in the library (signature, target, versions, hash...;
    ``tuned_kernels`` names the kernels a log scheduled)."""
    import dataclasses

    from aotc import settings
    from aotc.compiler import build, import_model
    from aotc.compiler.build import check_toolchain
    from aotc.compiler.pipeline import check_options
    from aotc.options import CompileOptions

    options = options or CompileOptions()
    if precision is not None:
        options = dataclasses.replace(options, precision=precision)
    # fail on a bad target, precision, toolchain or pass name before the import
    spec = _target_spec(target, options)
    check_toolchain(spec)
    check_options(spec, options)
    say = progress or (lambda _msg: None)
    say("importing model")
    imported = import_model(model, input_shapes=input_shapes, example_inputs=example_inputs,
                            options=options)
    dump = dump_ir or options.dump_ir or settings.DUMP_IR.get() or None
    options = dataclasses.replace(options, dump_ir=Path(dump) if dump else None)
    logs = _tuning_logs(tuning_logs, shipped_logs)
    if logs and options.schedules is None:
        import tvm

        from aotc.schedules import TunedSchedules
        options = dataclasses.replace(
            options, schedules=TunedSchedules(logs, tvm.target.Target(spec.tvm_target)))
    if quantize is not None:
        return _compile_int8(imported, spec, output, options, quantize, say)
    metadata = build(imported, spec, output, options=options, progress=say)
    if options.precision in ("bf16", "fp16"):
        metadata["precision_report"] = _precision_report(imported, spec, output, options, say)
    return metadata


PRECISION_SAMPLES = 4


def _precision_report(imported, spec, output, options, say) -> dict:
    """The bf16/fp16 model at ``output`` against a float32 build of the same model, on
    random inputs of its signature (symbolic dims 8), or for a decoder with a KV cache on
    teacher-forced generation of random tokens: per output, max |diff|, cosine and, for a
    classifier (or the next token), top-1 agreement (as the int8 report). Written next to
    the library as ``<output>.precision.json``; not measured where the target does not run
    here."""
    import dataclasses
    import json
    import tempfile

    from aotc.atomic import write_bytes
    from aotc.compiler import build
    from aotc.compiler.quantize.driver import host_twin
    from aotc.compiler.quantize.report import output_errors, output_lines
    from aotc.targets import runs_here

    why = runs_here(spec) or (None if host_twin(spec) is spec else "not this machine's CPU")
    if why is not None:
        return {"precision": options.precision, "measured": False,
                "table": f"{options.precision} accuracy: not measured ({spec.name}: {why})"}
    evaluated_on = ("teacher-forced generations of random tokens" if options.kv_capacity
                    else "random inputs")
    say(f"accuracy: {options.precision} vs float32 on {PRECISION_SAMPLES} {evaluated_on}")
    with tempfile.TemporaryDirectory(prefix="aotc-fp32-") as tmp:
        reference_path = Path(tmp) / "fp32.so"
        build(imported, spec, reference_path,
              options=dataclasses.replace(options, precision="fp32", explain=False,
                                          dump_ir=None),
              progress=lambda _msg: None)
        if options.kv_capacity:
            names, reference, reduced = _generation_samples(reference_path, output)
        else:
            names, reference, reduced = _random_samples(imported, reference_path, output)
    report = {"precision": options.precision, "measured": True, "samples": PRECISION_SAMPLES,
              "evaluated_on": evaluated_on,
              "outputs": output_errors(names, reference, reduced)}
    lines = [f"{options.precision} accuracy against float32 on {PRECISION_SAMPLES} "
             f"{evaluated_on}:",
             *output_lines(report["outputs"])]
    path = Path(f"{output}.precision.json")
    write_bytes(path, json.dumps(report, indent=1).encode())
    return {**report, "table": "\n".join(lines), "path": str(path)}


def _random_samples(imported, reference_path, output):
    """Each output of both builds on random inputs of the signature (symbolic dims 8)."""
    from aotc.runtime import load
    from aotc.runtime.inputs import random_inputs

    samples = [random_inputs(imported.signature, seed=k, dim_default=8)
               for k in range(PRECISION_SAMPLES)]
    names = [o.name for o in imported.signature.outputs]
    reference, reduced = [], []
    for path, results in ((reference_path, reference), (Path(output), reduced)):
        model = load(path)
        for feed in samples:
            outputs = model.run(feed)
            results.append([outputs[n] for n in names])
    return names, reference, reduced


def _generation_samples(reference_path, output):
    """A decoder with a KV cache: the logits of each step of teacher-forced generation
    (random token ids, a 16-token prompt) from both builds."""
    import numpy as np

    from aotc.runtime import load

    models = [load(reference_path), load(output)]
    table = models[0].metadata["generation"]
    logits = next(o for o in models[0].signature.outputs if o.name == table["logits"])
    vocabulary = logits.shape[-1] if isinstance(logits.shape[-1], int) else 2
    length = min(int(table["capacity"]), 32)
    prompt = min(16, length - 1)
    reference, reduced = [], []
    for k in range(PRECISION_SAMPLES):
        tokens = np.random.default_rng(k).integers(0, vocabulary, length)
        for model, results in zip(models, (reference, reduced)):
            results.append([model.generation_logits(tokens, prompt)])
    return [table["logits"]], reference, reduced


def _target_spec(target: str, options):
    """The preset ``target`` names, with what ``options.precision`` needs enabled."""
    from aotc.targets import for_precision, resolve
    return for_precision(resolve(target), options.precision if options else "fp32")


def _compile_int8(imported, spec, output, options, quantize, say) -> dict:
    """Calibrate, compile with the ranges, then measure int8 against float32."""
    import json

    import tvm

    from aotc.compiler import build
    from aotc.compiler.build import finalize_pipeline
    from aotc.compiler.quantize.driver import prepare
    from aotc.compiler.quantize.report import table

    target = tvm.target.Target(spec.tvm_target)
    prepared = prepare(imported, spec, target, options, quantize, finalize_pipeline, say)
    metadata = build(imported, spec, output, options=prepared.options, progress=say)
    report = _evaluate_here(imported, spec, output, prepared, quantize, say)
    report_path = Path(f"{output}.quant.json")
    report_path.write_text(json.dumps(report, indent=1))
    metadata["quantization_report"] = {**report, "table": table(report),
                                       "path": str(report_path)}
    return metadata


def _evaluate_here(imported, spec, output, prepared, quantize, say) -> dict:
    """The accuracy report, measured on ``output`` or, when it cannot run here (ARM, CUDA), on
    a build of the same int8 model for this host."""
    import dataclasses
    import tempfile

    from aotc.compiler import build
    from aotc.compiler.quantize.driver import evaluate, host_twin

    here = host_twin(spec)
    if here is spec:
        return evaluate(prepared, output, quantize, say)
    with tempfile.TemporaryDirectory(prefix="aotc-int8-") as tmp:
        twin = Path(tmp) / "host.so"
        say(f"accuracy: {spec.name} does not run here; building the same int8 model for "
            f"{here.name}")
        # the IR dump (--dump-ir) stays the library's own
        build(imported, here, twin, options=dataclasses.replace(prepared.options, dump_ir=None),
              progress=say)
        report = evaluate(prepared, twin, quantize, say)
    report["evaluated_build"] = f"{here.name} build of the same int8 model"
    return report


def _tuning_logs(extra, shipped_logs: bool = True) -> list[Path]:
    """The logs shipped in the tuning_logs package, then the user's (missing ones named)."""
    import aotc.tuning_logs as package
    from aotc.errors import CompileError
    shipped = sorted(Path(package.__file__).parent.glob("*.jsonl")) if shipped_logs else []
    paths = [Path(p) for p in extra or []]
    for path in paths:
        if not path.is_file():
            raise CompileError(f"tuning log {path}: no such file")
    return shipped + paths


def tune(model, target: str = "x86", log: str | Path = "tuning.jsonl", tuning=None, *,
         input_shapes: dict[str, tuple[int, ...]] | None = None, example_inputs=None,
         options=None, quantize=None, progress: Callable[[str], None] | None = None,
         **tuning_fields):
    """Tune the kernels ``aotc.compile`` would produce for ``model`` on ``target`` and append
    what beats the default rules to ``log`` (JSON lines; resumable: kernels the log already
    has a record for are skipped). ``tuning``: an ``aotc.TuneOptions`` (budget, search, seed,
    device farm, measurement settings); its fields may also be given as keywords
    (``trials=400``, ``rpc="10.0.0.5:9190", key="rk3588"``), which replace the ones in
    ``tuning``. ``options``: the ``aotc.CompileOptions`` the model will be compiled with,
    ``quantize`` its ``aotc.QuantizeOptions``: the int8 kernels are then tuned (calibrated
    the same way, so that the workload keys match at compile time).
    Returns the tuning report (aotc.schedules.tune.TuneReport)."""
    import dataclasses

    from aotc.options import TuneOptions
    tuning = dataclasses.replace(tuning or TuneOptions(), **tuning_fields)
    if tuning.rpc is not None:  # before TVM loads: a dead tracker is reported in seconds
        from aotc.farm_daemons import check_tracker
        check_tracker(tuning.rpc)
    import aotc.compiler  # noqa: F401  (TVM first, as the compiler imports it)
    from aotc.schedules import log as tuning_log
    from aotc.schedules import target_key
    from aotc.schedules.tune import Budget
    from aotc.schedules.tune import tune as run_tuner

    measurement = _measurement(target, tuning, options)
    say = progress or (lambda _msg: None)
    tasks, tvm_target, default_schedule = tuning_tasks(
        model, target, input_shapes=input_shapes, example_inputs=example_inputs,
        options=options, quantize=quantize, progress=say)
    done, checkpoints = set(), {}
    if Path(log).is_file():
        key = target_key(tvm_target)
        done = set(tuning_log.best_records([log], key, beating_default=False))
        checkpoints = tuning_log.best_records([log], key, beating_default=False, final=False)
    todo = [t for t in tasks if t.key not in done]
    say(f"{len(tasks)} tasks, {len(tasks) - len(todo)} already in {log}")
    return run_tuner(todo, tvm_target, Budget(tuning.trials, tuning.time_budget), log,
                     default_schedule, search=tuning.search, seed=tuning.seed,
                     checkpoints=checkpoints, measurement=measurement, say=say)


def _measurement(target: str, tuning, options=None):
    """Where candidates are timed: this machine (which must be able to), or a device farm."""
    from aotc.errors import TargetError
    from aotc.measure_settings import TUNE
    from aotc.schedules import farm_target, runners
    from aotc.targets import measurable_here
    spec = _target_spec(target, options)
    settings, rpc, key = tuning.measure or TUNE, tuning.rpc, tuning.key
    if rpc is None:
        why = measurable_here(spec)
        if why:
            raise TargetError(f"cannot tune {target} on this machine: {why}")
        return runners.create(settings=settings)
    if not key:
        raise TargetError("--rpc needs --key: the tracker key of the devices to measure on")
    if spec.runtime_device != "cpu":
        raise TargetError(f"tuning {target} through a farm is not built yet: the tuner times "
                          "CPU kernels only")
    return runners.create(farm_target.Farm.parse(rpc, key, session_timeout_s=tuning.rpc_timeout),
                          linker=spec.toolchain.compiler, settings=settings)


def tuning_tasks(model, target: str = "x86", *, input_shapes=None, example_inputs=None,
                 options=None, quantize=None, progress: Callable[[str], None] | None = None):
    """(tasks, TVM target, default_schedule): the kernels compile would schedule for
    ``model`` (aotc.schedules.Task, same passes so that keys match), and the default rules
    as a function of one kernel, which tuned schedules are timed against."""
    import tvm

    from aotc import settings
    from aotc.compiler import import_model
    from aotc.compiler.default_schedules import default_schedule_pass
    from aotc.compiler.pipeline import run_phases
    from aotc.options import CompileOptions
    from aotc.schedules import extract_tasks
    # Time candidates with the thread count compiled models run with (every allowed core;
    # TVM's own default is half of them): set before anything starts TVM's thread pool, and
    # inherited by MetaSchedule's runner processes.
    settings.apply_thread_setting()
    options = options or CompileOptions()
    spec = _target_spec(target, options)
    say = progress or (lambda _msg: None)
    tvm_target = tvm.target.Target(spec.tvm_target)
    say("importing model")
    imported = import_model(model, input_shapes=input_shapes, example_inputs=example_inputs,
                            options=options)
    if quantize is not None:  # the int8 kernels compile will make: same calibration
        from aotc.compiler.build import finalize_pipeline
        from aotc.compiler.quantize.driver import prepare
        options = prepare(imported, spec, tvm_target, options, quantize, finalize_pipeline,
                          say).options
    mod = run_phases(imported.mod, spec, tvm_target, options,
                     lambda p: say(f"phase {p}"), stop_before="schedule")

    def default_schedule(func):
        with tvm_target:
            out = default_schedule_pass(spec)(tvm.IRModule({"main": func}))
        return out["main"]
    return extract_tasks(mod), tvm_target, default_schedule


def load(path: str | Path, verify: bool = True, key_file: str | Path | None = None):
    """Load a compiled model (see aotc.runtime.Model); ``key_file``: an encrypted model's key
    (else AOTC_MODEL_KEY / AOTC_MODEL_KEY_FILE)."""
    from aotc.runtime import load as _load
    return _load(path, verify=verify, key_file=key_file)
