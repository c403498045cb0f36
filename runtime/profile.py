"""Per-kernel timing of a compiled model (``aotc profile``).

TVM removed its VM profiler in v0.24. Instead, every kernel listed in the model's kernel table
(recorded at compile time: argument shapes and dtypes, calls per run, FLOPs) is called on its
own from the loaded library with synthetic arguments, and its median time is multiplied by
its calls per run. Kernels run in isolation here (their inputs may be warmer in cache than in
the model), so the sum of kernel times is printed next to the measured end-to-end latency:
the difference is the VM's own overhead plus that effect.

Synthetic arguments: floats uniform in [0.5, 1) (positive, so that sqrt/log/divide kernels
take their normal path), integers and bools zero (valid indices for any guarded gather).

A model with symbolic dims is profiled at the sizes the user gives (``dims``, ``--dim
seq=128``; 1 for a dim not given): the kernel table records each symbolic argument's dims as
expressions over the dim names, evaluated here by a small arithmetic evaluator (the table
comes from a model file: nothing in it is executed). FLOPs are counted at compile time for
static kernels only, so symbolic kernels show times without GFLOP/s."""

from __future__ import annotations

import ast
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .buffers import aligned
from .exotic_dtypes import to_tvm
from .generate import with_past_feed
from .inputs import random_inputs
from .model import Model
from .thread_placement import PLACEMENT

_MIN_REPEAT_SECONDS = 2e-3  # each timed repeat calls a kernel often enough to last this long


@dataclass
class KernelTiming:
    name: str
    calls: int
    ms_per_call: float | None
    flops: int | None
    note: str = ""
    bytes: int | None = None  # of every argument together: flops / bytes says compute-bound

    @property
    def total_ms(self) -> float:
        return (self.ms_per_call or 0.0) * self.calls

    @property
    def gflops(self) -> float | None:
        if not self.flops or not self.ms_per_call:
            return None
        return self.flops / (self.ms_per_call * 1e-3) / 1e9


@dataclass
class ProfileReport:
    model: str
    end_to_end_ms: float
    kernels: list[KernelTiming] = field(default_factory=list)

    @property
    def kernel_total_ms(self) -> float:
        return sum(k.total_ms for k in self.kernels)

    def table(self, top: int | None = None) -> str:
        rows = sorted(self.kernels, key=lambda k: -k.total_ms)
        total = self.kernel_total_ms or 1.0
        lines = [f"{'kernel':56s} {'calls':>5s} {'ms/call':>9s} {'total ms':>9s} "
                 f"{'share':>6s} {'GFLOP/s':>8s}"]
        for k in rows[:top] if top else rows:
            if k.ms_per_call is None:
                lines.append(f"{k.name[:56]:56s} {k.calls:5d} {'-':>9s} {'-':>9s} {'-':>6s} "
                             f"{'-':>8s}  {k.note}")
                continue
            gflops = f"{k.gflops:8.1f}" if k.gflops is not None else f"{'-':>8s}"
            lines.append(f"{k.name[:56]:56s} {k.calls:5d} {k.ms_per_call:9.4f} "
                         f"{k.total_ms:9.3f} {100 * k.total_ms / total:5.1f}% {gflops}")
        if top and len(rows) > top:
            lines.append(f"... {len(rows) - top} more kernels (--top 0 shows all)")
        lines.append(f"{len(rows)} kernels, sum {self.kernel_total_ms:.2f} ms; end-to-end "
                     f"{self.end_to_end_ms:.2f} ms (VM overhead and cache effects: the difference)")
        return "\n".join(lines)

    def to_json(self) -> str:
        kernels = [{**asdict(k), "total_ms": k.total_ms, "gflops": k.gflops} for k in self.kernels]
        return json.dumps({"model": self.model, "end_to_end_ms": self.end_to_end_ms,
                           "kernel_total_ms": self.kernel_total_ms, "kernels": kernels}, indent=2)


GENERATION_ENTRIES = ("decode", "prefill", "main")


def profile(model: Model, repeats: int = 10, dims: dict[str, int] | None = None,
            entry: str | None = None) -> ProfileReport:
    """Time every kernel of ``model`` (median of ``repeats``) and the whole model, symbolic
    dims at the sizes in ``dims`` (1 where not given). A decoder compiled with a KV cache:
    the kernels of one ``entry`` (default "decode": one token after a prompt of the
    sequence dim's size; "prefill": a prompt of that size; "main": the model as exported)."""
    table = model.metadata.get("kernels")
    if table is None:
        raise ValueError(f"{model.path}: no kernel table (built by an aotc older than the "
                         "profiler); recompile it")
    sizes = {name: 1 for name in model.signature.dim_names()}
    unknown = sorted(set(dims or {}) - set(sizes))
    if unknown:
        raise ValueError(f"--dim {unknown[0]}: the model has no dim of that name "
                         f"(its dims: {sorted(sizes) or 'none'})")
    sizes.update(dims or {})
    generation = model.metadata.get("generation")
    if entry is not None and (generation is None or entry not in GENERATION_ENTRIES):
        raise ValueError(f"--entry {entry}: only a decoder compiled with --kv-capacity has "
                         f"entries ({', '.join(GENERATION_ENTRIES)})")
    if generation is not None:  # the entry's kernels, with its own call counts
        entry = entry or "decode"
        calls = generation["kernels"][entry]
        table = [{**k, "calls": calls[k["name"]]} for k in table if k["name"] in calls]
    if generation is not None and entry is not None and entry != "main":
        end_to_end = _generation_step_ms(model, generation, entry, sizes, repeats)
    else:
        feed = random_inputs(model.signature, seed=0, dims=sizes)
        if generation is not None:  # token 0, and the positions and mask it accepts
            feed = with_past_feed(generation, np.zeros(feed[generation["ids"]].shape[-1]),
                                  {c["input"]: feed[c["input"]] for c in generation["caches"]})
        end_to_end = median_ms(lambda: model.run(feed), repeats)
    timings = [_time_kernel(model, kernel, repeats, sizes) for kernel in table]
    return ProfileReport(str(model.path), end_to_end, timings)


def _generation_step_ms(model: Model, generation: dict, entry: str, sizes: dict,
                        repeats: int) -> float:
    """Median of ``repeats`` prefills of a prompt of the sequence dim's size, or of decode
    steps after it (the prompt is run again whenever the cache fills)."""
    ids = next(spec for spec in model.signature.inputs if spec.name == generation["ids"])
    length = sizes.get(ids.shape[-1], 1) if isinstance(ids.shape[-1], str) else ids.shape[-1]
    capacity = int(generation["capacity"])
    if length + (entry == "decode") > capacity:
        raise ValueError(f"a {length}-token prompt does not leave room for the step in the "
                         f"KV cache ({capacity} tokens)")
    session = model.cache_session()
    prompt = np.zeros(length, dtype="int64")
    session.prefill(prompt)  # warm-up
    samples = []
    for _ in range(repeats):
        if entry == "decode" and session.length >= capacity:
            session.prefill(prompt)
        start = time.perf_counter()
        if entry == "prefill":
            session.prefill(prompt)
        else:
            session.decode(0)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def _time_kernel(model: Model, entry: dict, repeats: int, sizes: dict) -> KernelTiming:
    timing = KernelTiming(entry["name"], entry["calls"], None, entry.get("flops"))
    try:
        shapes = [_arg_value(arg, sizes) for arg in entry["args"]]
    except ValueError as err:
        timing.note = f"symbolic shape: not timed ({err})"
        return timing
    function = model.kernel(entry["name"])
    if function is None:
        timing.note = "not found in the library"
        return timing
    try:
        timing.bytes = sum(int(np.prod(value)) * _bits(model.ffi, arg["dtype"]) // 8
                           for value, arg in zip(shapes, entry["args"])
                           if not isinstance(value, int))
        args = [value if isinstance(value, int) else
                to_tvm(model.ffi, _synthetic(value, arg["dtype"]))
                for value, arg in zip(shapes, entry["args"])]
        # on the kernel thread, as the model's own runs: a caller's thread that starts TVM's
        # pool cannot fork safely afterwards (runtime/forks.py); one hop per kernel, not per call
        run = model.on_kernel_thread
        run(lambda: function(*args))  # warm-up; also surfaces a kernel's own checks
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        timing.note = f"could not run: {type(err).__name__}: {str(err).strip()[:80]}"
        return timing
    timing.ms_per_call = run(lambda: median_ms(lambda: PLACEMENT.run(lambda: function(*args)),
                                               repeats))
    return timing


def _arg_value(arg: dict, sizes: dict):
    """A tensor argument's shape (list), or a scalar argument's value (int)."""
    if arg.get("shape") is not None:
        return arg["shape"]
    if "value" in arg:
        return dim_size(arg["value"], sizes)
    if "dims" in arg:
        return [dim_size(d, sizes) for d in arg["dims"]]
    raise ValueError("the table has no dims for it (compiled by an older aotc)")


def dim_size(expr, sizes: dict) -> int:
    """The value of a dim expression of the kernel table (an int, a dim name, or arithmetic
    over them as TVM prints it: ``(seq + T.int64(7)) // T.int64(8) * T.int64(8)``, ``T.min``,
    ``T.max``), for the sizes given. Only that arithmetic is evaluated."""
    if isinstance(expr, int):
        return expr
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError:
        raise ValueError(f"unreadable dim {expr!r}") from None
    return _evaluate(tree.body, sizes, str(expr))


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b}


def _evaluate(node, sizes: dict, text: str) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in sizes:
            raise ValueError(f"dim {node.id!r} of {text!r} has no size")
        return int(sizes[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, sizes, text), _evaluate(node.right, sizes, text)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError(f"division by zero in {text!r}")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, sizes, text)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) and node.func.value.id == "T" and \
            not node.keywords:
        values = [_evaluate(a, sizes, text) for a in node.args]
        if node.func.attr in ("int64", "int32") and len(values) == 1:
            return values[0]
        if node.func.attr in ("min", "max") and len(values) == 2:
            return min(values) if node.func.attr == "min" else max(values)
    raise ValueError(f"dim {text!r} is not arithmetic over dim names")


def _synthetic(shape: list[int], dtype: str) -> np.ndarray:
    if dtype.startswith(("float", "bfloat")):
        np_dtype = _float_dtype(dtype)
        values = np.random.default_rng(0).uniform(0.5, 1.0, size=shape)
        return aligned(values.astype(np_dtype))
    return aligned(np.zeros(shape, dtype="bool" if dtype == "bool" else dtype))


def _bits(ffi, dtype: str) -> int:
    """Bits per element of a TVM dtype string ("float32", "int4", "bool", "float32x4")."""
    parsed = ffi.dtype(dtype)
    return parsed.bits * parsed.lanes


def _float_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def median_ms(call, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of a batch of calls lasting >= 2 ms."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(_MIN_REPEAT_SECONDS / once))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples) * 1e3
