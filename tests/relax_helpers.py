"""Helpers for the pass and model tests: the Relax ops a module's ``main`` calls, in order;
the IR node types of its kernels; running ``main`` unscheduled; running its outputs, or one
kernel alone, as built; comparing reduced-precision outputs with a reference; building an
attention chain and 1x1 convs with random weights; the kernels and packed weights of a
converted module."""

import json

import numpy as np
import tvm
from tvm import relax

from aotc.compiler.passes.fusion.attention import PATTERN_NAME


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


def run_main_outputs(mod: tvm.IRModule, x) -> list[np.ndarray]:
    """The outputs (a tuple) of ``mod``'s main on ``x`` (numpy), built as it is for plain
    llvm."""
    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})),
                              tvm.cpu())
    return [t.numpy() for t in vm["main"](tvm.runtime.tensor(x))]


def kernel_into(mod: tvm.IRModule, name: str, x, out) -> np.ndarray:
    """Kernel ``name`` of ``mod`` alone, built for plain llvm, run on ``x`` into a buffer
    that holds ``out`` first (numpy both); what that buffer holds after."""
    lib = tvm.compile(tvm.IRModule({"main": mod[name].with_attr("global_symbol", "main")}),
                      target=tvm.target.Target({"kind": "llvm"}))
    result = tvm.runtime.tensor(out)
    lib["main"](tvm.runtime.tensor(x), result)
    return result.numpy()


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


def attention_module(queries=32, keys=32, depth=16, width=16, scale=("divide", 4.0),
                     mask=True, safe=False, symbolic=False, cast=False) -> tvm.IRModule:
    """softmax(q @ kt, scaled, masked) @ v over 2 heads: ``scale`` (op, value) or None;
    ``mask``: a [1, 1, 1, keys] mask added; ``safe``: torch's where(isnan(p), 0, p) after the
    softmax; ``symbolic``: rows and keys one symbolic length; ``cast``: the probabilities cast
    to float32 (their own dtype), as transformers' eager attention does."""
    seq = tvm.tirx.Var("seq", "int64") if symbolic else None
    rows, cols = (seq, seq) if symbolic else (queries, keys)
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, 2, rows, depth), "float32"))
    kt = relax.Var("kt", relax.TensorType((1, 2, depth, cols), "float32"))
    v = relax.Var("v", relax.TensorType((1, 2, cols, width), "float32"))
    params = [q, kt, v]
    if mask:
        params.append(relax.Var("mask", relax.TensorType((1, 1, 1, cols), "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            s = bb.emit(relax.op.matmul(q, kt))
            if scale is not None:
                op = relax.op.divide if scale[0] == "divide" else relax.op.multiply
                s = bb.emit(op(s, relax.const(scale[1], "float32")))
            if mask:
                s = bb.emit(relax.op.add(s, params[3]))
            p = bb.emit(relax.op.nn.softmax(s, axis=-1))
            if safe:
                p = bb.emit(relax.op.where(bb.emit(relax.op.isnan(p)),
                                           relax.const(0.0, "float32"), p))
            if cast:
                p = bb.emit(relax.op.astype(p, "float32"))
            out = bb.emit_output(relax.op.matmul(p, v))
        bb.emit_func_output(out)
    return bb.get()


def attention_functions(mod: tvm.IRModule) -> list[str]:
    """Names of the functions FuseAttention grouped an attention chain into."""
    return [gv.name_hint for gv, f in mod.functions_items()
            if isinstance(f, relax.Function) and f.attrs is not None
            and f.attrs.get("Composite") == PATTERN_NAME]


def random_conv1x1(rng: np.random.Generator):
    """conv(x, ic, oc): a 1x1 NHWC conv of ``x`` with weights drawn from ``rng`` (scaled by
    0.3), for modules the bf16 passes convert."""
    def conv(x, ic, oc):
        w = relax.const((rng.standard_normal((1, 1, ic, oc)) * 0.3).astype(np.float32))
        return relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO")
    return conv


def converted_parts(mod: tvm.IRModule) -> tuple[dict, dict, list]:
    """(GlobalVar -> kernel, name -> GlobalVar, the conv kernels' packed weights in order) of
    a module ConvertBF16 made: what a test writes its expected module with."""
    kernels = {gv: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    calls = [b.value for b in mod["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir"]
    weights = [c.args[1].fields[1] for c in calls if c.args[0].name_hint.startswith("conv2d")]
    return kernels, {gv.name_hint: gv for gv in kernels}, weights
