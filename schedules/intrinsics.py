"""Register only the tensor intrinsics CPU targets use, not every backend's.

MetaSchedule's TuneContext (and its default builder) runs ``import tvm.s_tir.tensor_intrin``,
whose ``__init__`` parses the intrinsics of every backend, CUDA's most of all, tens of seconds
(``python -X importtime``). The tuner paid it once in its own process and, through
MetaSchedule's builder, again in every build worker of every batch. Loading the package
without its ``__init__`` and importing the CPU submodules takes ~2 s; a target that needs
another backend's intrinsics imports that submodule the usual way."""

from __future__ import annotations

import importlib
import importlib.util
import sys

PACKAGE = "tvm.s_tir.tensor_intrin"
CPU_KINDS = ("x86", "arm_cpu")


def register_cpu_intrinsics() -> None:
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        package = importlib.util.module_from_spec(spec)  # __init__ (all backends) not run
        sys.modules[PACKAGE] = package
        import tvm.s_tir
        tvm.s_tir.tensor_intrin = package
    for kind in CPU_KINDS:
        importlib.import_module(f"{PACKAGE}.{kind}")
