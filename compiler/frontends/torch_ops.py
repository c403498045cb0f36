"""PyTorch op check, run before any TVM work, like the ONNX one (onnx_ops.py).

TVM's importer stops at the first graph it cannot convert with an AssertionError that lists op
names only; here every aten op without a converter, and every configuration its converter gets
wrong (GAPS), is listed in one UnsupportedModelError with its count or reason and first node,
on the decomposed graph TVM would see."""

from __future__ import annotations

import collections

from aotc.errors import UnsupportedModelError


def converter_names() -> set[str]:
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter
    return set(ExportedProgramImporter().create_convert_map())


def unsupported_ops(program) -> list[tuple[str, int, str]]:
    """(op name, count, first node) for every call_function TVM has no converter for."""
    known = converter_names()
    counts, first = collections.Counter(), {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name not in known:
            counts[name] += 1
            first.setdefault(name, node.name)
    return [(name, n, first[name]) for name, n in sorted(counts.items())]


def _used_outputs(node) -> set[int]:
    """Indices k of node[k] (getitem users) that the graph reads."""
    return {user.args[1] for user in node.users
            if getattr(user.target, "__name__", "") == "getitem" and user.users}


def _arg(node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _training_batch_norm(node) -> str:
    return ("batch statistics (training=True): aotc compiles inference graphs only"
            if _arg(node, 5, "training") else "")


def _statistics_outputs(node) -> str:
    return ("its mean/rstd outputs are used: TVM 0.27 returns them with wrong shapes"
            if _used_outputs(node) - {0} else "")


def _pool_indices(node) -> str:
    return ("its indices output is used: TVM 0.27 returns floats, not int64 indices"
            if 1 in _used_outputs(node) else "")


def _avg_pool_divisor(node) -> str:
    return ("divisor_override is ignored by TVM 0.27 (wrong values)"
            if _arg(node, 6, "divisor_override") is not None else "")


def _scaled_elu(node) -> str:
    scale, input_scale = _arg(node, 2, "scale", 1), _arg(node, 3, "input_scale", 1)
    return ("scale/input_scale (SELU) are ignored by TVM 0.27's elu (wrong values)"
            if scale != 1 or input_scale != 1 else "")


def _always(reason: str):
    return lambda _node: reason


# Found by the torch sweep (tests/conformance/torch_cases.py): converters that compile to a
# silent wrong answer in these configurations. Refused by name instead.
GAPS = {
    "_native_batch_norm_legit_functional.default": _training_batch_norm,
    "native_layer_norm.default": _statistics_outputs,
    "native_group_norm.default": _statistics_outputs,
    "max_pool1d_with_indices.default": _pool_indices,
    "max_pool2d_with_indices.default": _pool_indices,
    "max_pool3d_with_indices.default": _pool_indices,
    "avg_pool2d.default": _avg_pool_divisor,
    "elu.default": _scaled_elu,
    "_upsample_bilinear2d_aa.default": _always("antialiasing is ignored by TVM 0.27"),

}


def known_wrong(program) -> list[tuple[str, str, str]]:
    """(op name, first node, reason) for configurations TVM converts to a wrong answer."""
    found = {}
    for node in program.graph.nodes:
        name = getattr(node.target, "__name__", str(node.target))
        check = GAPS.get(name) if node.op == "call_function" else None
        reason = check(node) if check else ""
        if reason and name not in found:
            found[name] = (name, node.name, reason)
    return list(found.values())


def check_torch_ops(program, source: str) -> None:
    wrong = known_wrong(program)
    bad = unsupported_ops(program) + [(name, 1, node) for name, node, _ in wrong]
    reasons = {name: reason for name, _, reason in wrong}
    if bad:
        listed = "; ".join(f"{name} ({reasons.get(name, f'{n} node(s)')}, first {node!r})"
                           for name, n, node in bad)
        raise UnsupportedModelError(
            f"{source}: {len(bad)} unsupported PyTorch op(s) after torch.export's decompositions: "
            f"{listed}")
