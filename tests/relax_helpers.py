"""Helpers for the pass tests: the Relax ops a module's ``main`` calls, in order."""

import tvm
from tvm import relax


def main_ops(mod: tvm.IRModule) -> list[str]:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return names


def run_main(mod: tvm.IRModule, x, mcpu: str = "x86-64"):
    """``mod``'s main on ``x`` (numpy), legalized and built unscheduled for an llvm CPU."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    with target:
        mod = relax.transform.LegalizeOps()(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()
