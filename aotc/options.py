"""CompileOptions: everything a compile does beyond its model and target, in one value that the
CLI and the API fill and the pipeline reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

OPT_LEVELS = (0, 1, 2, 3)


# int8: every layer's activation range calibrated ahead of time. int8-dynamic: matmul layers
# measure their activation's range on every run (as onnxruntime's quantize_dynamic): robust to
# the outliers of transformer activations; convolutions are calibrated when samples are given.
QUANTIZE_MODES = ("int8", "int8-dynamic")
DYNAMIC = "dynamic"  # the range of a layer quantized per run (CompileOptions.int8_ranges)
CALIBRATION_METHODS = ("minmax", "percentile", "entropy")
# float32 everywhere, or conv/matmul with constant weights in bfloat16 (float32 sums) or float16
# (float16 sums); targets.for_precision says which targets have the instructions.
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class QuantizeOptions:
    """What ``--quantize int8`` needs (compiler/quantize).
    calibration: samples for the activation ranges (a .npz, a folder of .npy, or an iterable
        of feeds: compiler/quantize/samples.py); optional for "int8-dynamic".
    mode: see QUANTIZE_MODES.
    method: "minmax" | "percentile" | "entropy" (compiler/quantize/observers.py).
    percentile: for "percentile", the share of values kept inside the range.
    skip_layers: site names ("conv2d_0", "matmul_3"; --explain and the report list them) that
        stay float32.
    keep_first_last: the first and last quantizable layers stay float32 (they often carry
        the most error for the least time).
    evaluation: held-out samples for the accuracy report (default: the calibration ones)."""

    calibration: object = None
    mode: str = "int8"
    method: str = "percentile"
    percentile: float = 99.99
    skip_layers: tuple[str, ...] = ()
    keep_first_last: bool = False
    evaluation: object | None = None

    def __post_init__(self):
        if self.mode not in QUANTIZE_MODES:
            raise ValueError(f"quantize mode must be one of {QUANTIZE_MODES}, got {self.mode!r}")
        if self.mode == "int8" and self.calibration is None:
            raise ValueError("int8 quantization needs calibration samples (or use int8-dynamic)")
        if self.method not in CALIBRATION_METHODS:
            raise ValueError(f"calibration method must be one of {CALIBRATION_METHODS}, "
                             f"got {self.method!r}")
        if not 50.0 < self.percentile <= 100.0:
            raise ValueError(f"percentile must be in (50, 100], got {self.percentile}")
        object.__setattr__(self, "skip_layers", tuple(self.skip_layers))


@dataclass(frozen=True)
class CompileOptions:
    """opt_level:
        0  only the passes a correct, loadable model needs (legalization, index guards, float32
           accumulation for half types): naive kernels with exact libm math. For bisecting.
        1  + constant folding, operator fusion, default schedules, vectorized exp/erf/tanh
        2  + NHWC layout and the importer clean-ups that let it convert the whole graph
        3  + folding per-channel affines (BatchNorm) into conv/matmul weights (the default)
    disabled_passes: pass names (as ``--explain`` prints them) skipped on top of the level;
        a pass correctness needs cannot be disabled.
    explain: record, pass by pass, the time and what changed (ops, kernels).
    dump_ir: a folder; the IR after every pass is written there (the entries that
        ``buckets`` and ``kv_capacity`` add: in a subfolder each, named by entry).
    int8_ranges: site name (compiler/contraction_sites.py) -> (low, high) of its activation, as
        calibration measured it, or DYNAMIC (measured on every run) (aotc.compile(quantize=...)
        fills it): those contractions run
        in int8. None: float32.
    schedules: where tuned schedules come from (``aotc.schedules.TunedSchedules``, made from
        tuning logs by ``aotc.compile(tuning_logs=...)``): asked first for every kernel, the
        default rules take the rest. None: default rules only.
    precision: "fp32", or "bf16": convolutions and matmuls with constant weights take
        bfloat16 operands with float32 sums (compiler/quantize/bf16.py), or "fp16": float16
        operands and sums (compiler/quantize/fp16.py); the target must have the instructions
        (targets.for_precision enables them or says why not).
    trust_pickle: load a .pt2 even where torch would unpickle part of it (legacy weights,
        pickled constants or sample inputs): a pickle runs code, so only for files whose
        origin is trusted (compiler/frontends/pt2_archive.py). Without it they are refused.
    dim_ranges: symbolic dim name -> (min, max) sizes the model accepts (``--input-range``):
        the compiler may rely on them, the runtime refuses inputs outside them.
    bound_inputs: input name -> value (``--bind``): the input becomes a constant of the model
        (then folded: an ``If`` on it keeps one branch) and leaves the signature.
    buckets: symbolic dim name -> sizes (``--buckets seq=16,32,64``): kernels specialized for
        each size (each combination, for several dims) join the library; a call runs in the
        smallest bucket that fits, its inputs padded (compiler/buckets.py).
    kv_capacity: for a decoder exported with past keys and values, the tokens (prompt and
        generated) its KV cache holds, rounded up to a multiple of 16: ``prefill`` and
        ``decode`` entries that keep the cache in place join the library
        (compiler/kv_cache.py). None: the model as exported only."""

    opt_level: int = 3
    disabled_passes: tuple[str, ...] = ()
    explain: bool = False
    dump_ir: Path | None = None
    schedules: object | None = field(default=None, compare=False)
    int8_ranges: dict | None = field(default=None, compare=False)
    precision: str = "fp32"
    trust_pickle: bool = False
    dim_ranges: dict = field(default_factory=dict, compare=False)
    bound_inputs: dict = field(default_factory=dict, compare=False)
    buckets: dict = field(default_factory=dict, compare=False)
    kv_capacity: int | None = None

    def __post_init__(self):
        if self.opt_level not in OPT_LEVELS:
            raise ValueError(f"opt_level must be one of {OPT_LEVELS}, got {self.opt_level!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.kv_capacity is not None and self.kv_capacity < 2:
            raise ValueError(f"kv_capacity must be at least 2 tokens, got {self.kv_capacity}")
        object.__setattr__(self, "disabled_passes", tuple(self.disabled_passes))
        if self.dump_ir is not None:
            object.__setattr__(self, "dump_ir", Path(self.dump_ir))


SEARCHES = ("rl", "evolutionary")


@dataclass(frozen=True)
class TuneOptions:
    """How one ``aotc tune`` run searches and where it measures.

    trials: measurements in all, spread over the kernels by weight; with ``time_budget`` the
        run stops at whichever runs out first (None and no time budget: 64).
    time_budget: wall-clock seconds for the search.
    search: "rl" (aotc's) or "evolutionary" (MetaSchedule's, the baseline).
    seed: the search's random seed.
    rpc: "HOST:PORT" of a TVM RPC tracker: candidates are timed on its servers of ``key``.
    key: the tracker key of the devices to measure on (with ``rpc``).
    rpc_timeout: seconds a device may take for one measurement before it is left behind.
    measure: an ``aotc.measure_settings.MeasureSettings`` for candidates and references
        (None: ``measure_settings.TUNE``)."""

    trials: int | None = 64
    time_budget: float | None = None
    search: str = "rl"
    seed: int = 0
    rpc: str | None = None
    key: str | None = None
    rpc_timeout: float = 60.0
    measure: object | None = None

    def __post_init__(self):
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {self.search!r}")
        if self.trials is None and self.time_budget is None:
            object.__setattr__(self, "trials", 64)
