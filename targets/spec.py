"""What a target family tells the rest of aotc."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TargetSpec:
    name: str                     # what users type: x86, x86-avx2, ...
    description: str
    tvm_target: dict              # JSON-dict form; TVM 0.27 rejects "llvm -mcpu=..." strings
    schedule_rules: str = "cpu"   # which default-schedule rule set compiler/lower applies
    cross_compiler: str | None = None   # None: the host's cc links the .so
    runtime_device: str = "cpu"
    features: tuple[str, ...] = field(default_factory=tuple)
