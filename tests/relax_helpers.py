"""Helpers for the pass and model tests: the Relax ops a module's ``main`` calls, in order;
the IR node types of its kernels; running ``main`` unscheduled; comparing reduced-precision
outputs with a reference."""

import json

import numpy as np
import tvm
from tvm import relax


def one_input_module(shape, build, dtype: str = "float32") -> tvm.IRModule:
    """A module whose ``main`` takes one tensor ``x`` and returns ``build(bb, x)``, in a
    dataflow block."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def main_ops(mod: tvm.IRModule) -> list[str]:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return names


def kernel_node_types(mod: tvm.IRModule) -> set[str]:
    """The IR node types of ``mod``'s kernels (their serialized graph: every node once)."""
    return {node["type"] for _, func in mod.functions.items()
            if isinstance(func, tvm.tirx.PrimFunc)
            for node in json.loads(tvm.ir.save_json(func))["nodes"]}


def run_main(mod: tvm.IRModule, x, mcpu: str = "x86-64"):
    """``mod``'s main on ``x`` (numpy), legalized and built unscheduled for an llvm CPU."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    with target:
        mod = relax.transform.LegalizeOps()(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def assert_lanes_keep_numbers(make_pass, before: tvm.IRModule, x, lanes, tolerance: float):
    """``make_pass(l)(before)`` computes what ``before`` does on ``x``, for each l in
    ``lanes`` (the packing passes: one pass per target SIMD width)."""
    want = run_main(before, x)
    for lane_count in lanes:
        np.testing.assert_allclose(run_main(make_pass(lane_count)(before), x), want,
                                   rtol=tolerance, atol=tolerance)


def assert_matches(got, want, cosine: float, atol_fraction: float) -> None:
    """``got`` within ``atol_fraction`` of ``want``'s largest magnitude, and at least
    ``cosine`` similar to it (reduced-precision outputs against a float32 reference)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    similarity = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert similarity > cosine, similarity
    np.testing.assert_allclose(got, want, atol=atol_fraction * np.abs(want).max())
