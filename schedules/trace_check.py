"""What a tuning record's trace may say before it is replayed: an allowlist.

A trace is replayed by TVM instruction by instruction, and some instructions are code, not
data: ``Annotate(loop, <text>, "pragma_import_llvm")`` makes the LLVM codegen parse the text
as LLVM IR (or read the file a value ending in ``.ll``/``.bc`` names) and link it into the
kernel, and an index map is a serialized expression that may hold any call. A log is a file
users share and merge, so a record is refused unless every instruction is one the search
emits (MetaSchedule's rules and postprocessors, and aotc's default rules), every annotation
key is one of theirs, every string is a name, every serialized index map is arithmetic, and
every imported LLVM function is one aotc itself generates (``TRUSTED_LLVM_IMPORTS``).

``trace_problem(record_trace)`` returns None for an acceptable trace, else the reason, which
names the instruction. schedules/log.py skips such records with a warning."""

from __future__ import annotations

import json
import re

from aotc.compiler.default_schedules.dot_intrinsics import TRUSTED_LLVM_IMPORTS

# Instructions of MetaSchedule's schedule rules, mutators and postprocessors, and of
# compiler/default_schedules's default rules. Storage alignment, buffer re-indexing and layout
# padding
# take integers and names only; nothing here reads a file or embeds text as code.
_KINDS = frozenset({
    "SampleCategorical", "SamplePerfectTile", "SamplePartitionedTile", "SampleComputeLocation",
    "GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers",
    "GetOutputBlocks", "Split", "LoopPartition", "Fuse", "Merge", "Reorder", "AddUnitLoop",
    "Parallel", "Vectorize", "Bind", "Unroll", "CacheRead", "CacheWrite", "ReIndex",
    "ComputeAt", "ReverseComputeAt", "ComputeInline", "ReverseComputeInline",
    "DecomposeReduction", "RFactor", "StorageAlign", "SetScope", "Blockize", "Tensorize",
    "Annotate", "Unannotate", "TransformLayout", "TransformBlockLayout", "PadEinsum",
    "EnterPostproc",
})
# Annotation keys MetaSchedule and the default rules set; the values are numbers or names.
_KEYS = frozenset({
    "pragma_auto_unroll_max_step", "pragma_unroll_explicit", "schedule_rule",
    "software_pipeline_stage", "software_pipeline_order", "software_pipeline_async_stages",
})
_KEY_PREFIXES = ("meta_schedule.",)
_IMPORT_KEY = "pragma_import_llvm"
# Serialized index maps (TransformLayout, TransformBlockLayout): variables, integer constants
# and integer arithmetic. A call node (which could name any extern function) is refused.
_NODE_TYPES = frozenset({
    "None", "int", "ffi.Array", "ffi.String", "ir.IntImm", "ir.PrimType", "ir.Var", "ir.Range",
    "tirx.IndexMap", "prim.Add", "prim.Sub", "prim.Mul", "prim.FloorDiv", "prim.FloorMod",
    "prim.Div", "prim.Mod", "prim.Min", "prim.Max",
})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,255}\Z")
_NODE_JSON = re.compile(r"\s*\{\s*\"root_index\"")


def trace_problem(record_trace) -> str | None:
    """None when ``record_trace`` (MetaSchedule TuningRecord JSON: [trace, run_secs, target,
    args]) may be replayed; else what is wrong, naming the instruction."""
    if not isinstance(record_trace, list) or not record_trace:
        return "trace is not a list"
    trace = record_trace[0]
    if not (isinstance(trace, list) and len(trace) == 2 and isinstance(trace[0], list)
            and isinstance(trace[1], list)):
        return "trace is not [instructions, decisions]"
    for index, inst in enumerate(trace[0]):
        problem = _instruction_problem(inst)
        if problem:
            return f"instruction {index}: {problem}"
    return _decisions_problem(trace[1], len(trace[0]))


def _instruction_problem(inst) -> str | None:
    if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)
            and all(isinstance(part, list) for part in inst[1:])):
        return "not [kind, inputs, attrs, outputs]"
    kind, inputs, attrs, outputs = inst
    if kind not in _KINDS:
        return f"{_short(kind)} is not an instruction the search emits"
    if kind in ("Annotate", "Unannotate"):
        return _annotation_problem(kind, inputs, attrs)
    for value in (*inputs, *attrs, *outputs):
        problem = _value_problem(kind, value)
        if problem:
            return problem
    return None


def _annotation_problem(kind: str, inputs: list, attrs: list) -> str | None:
    if len(attrs) != 1 or not isinstance(attrs[0], str):
        return f"{kind} without one key"
    key = attrs[0]
    if not inputs or not _is_name(inputs[0]):
        return f"{kind} {_short(key)} on something that is not a block or loop"
    if key == _IMPORT_KEY and kind == "Annotate":
        if len(inputs) == 2 and _literal(inputs[1]) in TRUSTED_LLVM_IMPORTS:
            return None
        return f"Annotate {_IMPORT_KEY} with LLVM IR or a path that aotc did not generate"
    if key not in _KEYS and not (key.startswith(_KEY_PREFIXES) and _is_name(key)):
        return f"{kind} with key {_short(key)}, which the search does not set"
    if kind == "Annotate":
        value = inputs[1] if len(inputs) == 2 else None
        if isinstance(value, bool) or not (
                isinstance(value, (int, float)) or _is_name(value)
                or _is_name(_literal(value))):
            return f"Annotate {key} with value {_short(value)}"
    return None


def _value_problem(kind: str, value) -> str | None:
    if value is None or isinstance(value, (bool, int, float)):
        return None
    if isinstance(value, list):
        for item in value:
            problem = _value_problem(kind, item)
            if problem:
                return problem
        return None
    if isinstance(value, str):
        if _is_name(value):
            return None
        if _NODE_JSON.match(value):
            return _node_problem(kind, value)
    return f"{kind} with value {_short(value)}"


def _node_problem(kind: str, text: str) -> str | None:
    try:
        nodes = json.loads(text)["nodes"]
        types = {node["type"] for node in nodes}
    except (ValueError, KeyError, TypeError):
        return f"{kind} with an index map that does not parse"
    extra = sorted(str(t) for t in types - _NODE_TYPES)
    if extra:
        return f"{kind} with an index map holding {', '.join(map(_short, extra))}"
    strings = [node.get("data") for node in nodes if node.get("type") == "ffi.String"]
    if not all(_is_name(s) for s in strings):
        return f"{kind} with an index map naming something other than variables"
    return None


def _decisions_problem(decisions: list, count: int) -> str | None:
    for decision in decisions:
        if not (isinstance(decision, list) and len(decision) == 2
                and isinstance(decision[0], int) and 0 <= decision[0] < count
                and _numbers(decision[1])):
            return f"decision {_short(decision)} is not [instruction, numbers]"
    return None


def _numbers(value) -> bool:
    if isinstance(value, list):
        return all(_numbers(item) for item in value)
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _literal(value):
    """The text of a string annotation value (TVM writes it between double quotes)."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return None


def _is_name(value) -> bool:
    return isinstance(value, str) and bool(_NAME.match(value))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
