"""Tuning logs: records round-trip; blank, truncated, foreign and other-version lines are
skipped with a warning naming the line; a record appended after a torn line (a writer killed
mid-line) is still read; the fastest record per workload wins across files; keys ignore the
kernel's name and the core count."""

import json

import tvm
from tvm import te

from aotc.schedules import log as tuning_log
from aotc.schedules.keys import target_key, workload_key


def _record(workload="ab12", seconds=1e-4, target="llvm:skylake-avx512"):
    return tuning_log.Record(workload=workload, target=target, task="fused_matmul",
                             seconds=seconds, default_seconds=5e-4, trials=8,
                             trace=[[[], []]], tvm=tvm.__version__)


def test_round_trip(tmp_path):
    path = tmp_path / "log.jsonl"
    tuning_log.append(path, [_record("a"), _record("b")])
    records, warnings = tuning_log.read(path)
    assert records == [_record("a"), _record("b")] and warnings == []


def test_a_log_read_again_after_an_append_has_the_new_record(tmp_path):
    """read() keeps parsed logs per process: a changed file is parsed again, and the lists
    it returns are the caller's to change."""
    path = tmp_path / "log.jsonl"
    tuning_log.append(path, [_record("a")])
    first, _ = tuning_log.read(path)
    first.clear()
    assert [r.workload for r in tuning_log.read(path)[0]] == ["a"]
    tuning_log.append(path, [_record("b")])
    assert [r.workload for r in tuning_log.read(path)[0]] == ["a", "b"]


def test_bad_lines_are_skipped_and_named(tmp_path):
    path = tmp_path / "log.jsonl"
    good = _record().to_line()
    other_version = json.dumps({**json.loads(good), "aotc_tuning_record": 99}) + "\n"
    path.write_text(good + "\n" + good[:40] + "\n" + '{"foreign": 1}\n' + other_version + good)
    records, warnings = tuning_log.read(path)
    assert len(records) == 2
    assert [w.split(": skipped")[0].rsplit(":", 1)[1] for w in warnings] == ["2", "3", "4", "5"]
    assert "blank" in warnings[0] and "truncated" in warnings[1]
    assert "not an aotc" in warnings[2] and "version 99" in warnings[3]


def test_a_record_after_a_torn_line_survives(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(_record("a").to_line()[:-30])  # killed mid-write: no newline
    tuning_log.append(path, [_record("b")])
    records, warnings = tuning_log.read(path)
    assert [r.workload for r in records] == ["b"] and len(warnings) == 1


def test_fastest_record_wins_across_logs_for_its_target(tmp_path):
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    tuning_log.append(one, [_record("w", 3e-4), _record("w", 1e-4, target="llvm:haswell")])
    tuning_log.append(two, [_record("w", 2e-4)])
    best = tuning_log.best_records([one, two], "llvm:skylake-avx512")
    assert best["w"].seconds == 2e-4


def test_records_slower_than_the_default_are_not_applied(tmp_path):
    path = tmp_path / "log.jsonl"
    tuning_log.append(path, [_record("slow", 9e-4), _record("fast", 1e-4)])
    assert set(tuning_log.best_records([path], "llvm:skylake-avx512")) == {"fast"}
    assert set(tuning_log.best_records([path], "llvm:skylake-avx512",
                                       beating_default=False)) == {"slow", "fast"}


def test_keys_ignore_names_and_core_counts():
    a = te.placeholder((4, 8), name="a")
    func = te.create_prim_func([a, te.compute((4, 8), lambda i, j: a[i, j] * 2)])
    renamed = func.with_attr("global_symbol", "other_name").with_attr("aotc.flops", 32)
    assert workload_key(func) == workload_key(renamed)
    two = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    many = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 64})
    assert target_key(two) == target_key(many) == "llvm:skylake-avx512"


def test_compact_keeps_the_best_final_record_per_workload(tmp_path):
    import dataclasses
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    tuning_log.append(one, [_record("a", 3e-4), _record("b", 2e-4),
                            dataclasses.replace(_record("a", 1e-5), final=False)])
    tuning_log.append(two, [_record("a", 1e-4)])
    out = tmp_path / "merged.jsonl"
    assert tuning_log.compact([one, two], out) == 2
    records, warnings = tuning_log.read(out)
    assert warnings == [] and {(r.workload, r.seconds) for r in records} == {("a", 1e-4),
                                                                               ("b", 2e-4)}
