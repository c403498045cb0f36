"""Tuning records are data: a record whose trace would import LLVM IR, open a path, set an
annotation the search never sets or carry a call in an index map is skipped by name, the
compile goes on with the default rules, and nothing runs when the model loads.

The crafted record here is a real attack: module-level assembly that adds an ``.init_array``
entry calling ``system()`` (it ran at load before records were checked)."""

import logging

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from helpers import run_in_fresh_process
from tvm.s_tir import meta_schedule as ms

import aotc
from aotc.api import tuning_tasks
from aotc.compiler.default_schedules.dot_intrinsics import BF16_LLVM
from aotc.runtime.inputs import random_inputs
from aotc.schedules import log as tuning_log
from aotc.schedules.keys import target_key
from aotc.schedules.measure import task_module
from aotc.schedules.trace_check import trace_problem


def _init_array_payload(marker) -> str:
    """LLVM IR whose module assembly runs ``touch marker`` when the library is loaded."""
    lines = [".pushsection .init_array,\\22aw\\22", ".p2align 3", ".quad aotc_probe",
             ".popsection", ".pushsection .text", "aotc_probe:",
             "leaq aotc_probe_cmd(%rip), %rdi", "jmp system@PLT", ".popsection",
             ".pushsection .rodata", f"aotc_probe_cmd: .asciz \\22touch {marker}\\22",
             ".popsection"]
    return "".join(f'module asm "{line}"\n' for line in lines)


def _crafted_log(onnx_path, log_path, annotate) -> str:
    """A log with one record for the model's first kernel, claiming a 1 ns run (so that it
    would be applied), whose trace is the kernel's with ``annotate(sch, loop)`` added."""
    tasks, target, _ = tuning_tasks(onnx_path)
    task = tasks[0]
    mod = task_module(task.func)
    sch = tvm.s_tir.Schedule(mod)
    leaf = sch.get_child_blocks(sch.get_sblock("root"))[-1]
    annotate(sch, sch.get_loops(leaf)[0])
    record = ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), [1e-9], target,
                                      ms.arg_info.ArgInfo.from_prim_func(task.func))
    tuning_log.append(log_path, [tuning_log.Record(
        task.key, target_key(target), task.name, 1e-9, 1.0, 1, record.as_json(),
        tvm.__version__)])
    return task.name


def test_a_record_that_imports_llvm_ir_is_skipped_and_nothing_runs_at_load(
        tiny_onnx, tmp_path, caplog):
    marker = tmp_path / "ran"
    log = tmp_path / "crafted.jsonl"
    _crafted_log(tiny_onnx, log, lambda sch, loop: sch.annotate(
        loop, "pragma_import_llvm", _init_array_payload(marker)))
    out = tmp_path / "model.so"
    with caplog.at_level(logging.WARNING, logger="aotc.tuning_log"):
        aotc.compile(tiny_onnx, output=out, tuning_logs=[log], shipped_logs=False)
    assert any("pragma_import_llvm" in r.getMessage() and "crafted.jsonl:1" in r.getMessage()
               for r in caplog.records)
    feed = random_inputs(aotc.load(out).signature, seed=3)
    got = run_in_fresh_process(out, feed, tmp_path)
    assert not marker.exists(), "the record's code ran when the model was loaded"
    want = ort.InferenceSession(str(tiny_onnx), providers=["CPUExecutionProvider"]).run(None, feed)
    for value, expected in zip(got.values(), want):
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("annotate, named", [
    (lambda sch, loop: sch.annotate(loop, "pragma_import_llvm", "/etc/passwd.ll"),
     "pragma_import_llvm"),
    (lambda sch, loop: sch.annotate(loop, "pragma_import_c", "int x;"), "pragma_import_c"),
    (lambda sch, loop: sch.annotate(loop, "meta_schedule.parallel", "$(id)"), "$(id)"),
], ids=["llvm-path", "unknown-key", "odd-value"])
def test_records_with_what_the_search_never_emits_are_refused_by_name(
        annotate, named, tiny_onnx, tmp_path):
    log = tmp_path / "crafted.jsonl"
    _crafted_log(tiny_onnx, log, annotate)
    records, warnings = tuning_log.read(log)
    assert records == [] and len(warnings) == 1
    assert "unsafe trace" in warnings[0] and named in warnings[0]


def _node(kind: str, nodes: list[str]) -> list:
    index_map = ('{"root_index": 0, "nodes": ['
                 + ", ".join(f'{{"type": "{t}"}}' for t in nodes) + "]}")
    return [[[["GetSBlock", [], ["b", "main"], ["b0"]], [kind, ["b0"], [index_map], []]], []]]


def test_an_index_map_must_be_arithmetic():
    assert trace_problem(_node("TransformBlockLayout", ["tirx.IndexMap", "prim.Add"])) is None
    problem = trace_problem(_node("TransformBlockLayout", ["tirx.IndexMap", "tirx.Call"]))
    assert "instruction 1" in problem and "tirx.Call" in problem


def test_the_default_rules_own_llvm_import_and_unknown_instructions():
    def annotate(value):
        return [[[["GetSBlock", [], ["b", "main"], ["b0"]],
                  ["Annotate", ["b0", f'"{value}"'], ["pragma_import_llvm"], []]], []]]
    assert trace_problem(annotate(BF16_LLVM)) is None
    assert trace_problem(annotate(BF16_LLVM + "\nmodule asm \"nop\"")) is not None
    assert "not an instruction" in trace_problem([[[["ImportCode", [], [], []]], []]])
    assert "decision" in trace_problem([[[["GetSBlock", [], ["b", "main"], ["b0"]]],
                                         [[5, 1]]]])
