"""CompileOptions: everything a compile does beyond its model and target, in one value that the
CLI and the API fill and the pipeline reads (precision, quantization and tuning logs join it
when they land)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

OPT_LEVELS = (0, 1, 2, 3)


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
    dump_ir: a folder; the IR after every pass is written there.
    schedules: where tuned schedules come from (``aotc.schedules.TunedSchedules``, made from
        tuning logs by ``aotc.compile(tuning_logs=...)``): asked first for every kernel, the
        default rules take the rest. None: default rules only."""

    opt_level: int = 3
    disabled_passes: tuple[str, ...] = ()
    explain: bool = False
    dump_ir: Path | None = None
    schedules: object | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.opt_level not in OPT_LEVELS:
            raise ValueError(f"opt_level must be one of {OPT_LEVELS}, got {self.opt_level!r}")
        object.__setattr__(self, "disabled_passes", tuple(self.disabled_passes))
        if self.dump_ir is not None:
            object.__setattr__(self, "dump_ir", Path(self.dump_ir))
