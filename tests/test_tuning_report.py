"""The tuning report: best-at-N read off a curve, the weighted table, the end-to-end curve
(each kernel at its best so far, or its default time while that is better) and the plots,
through ``aotc tune-report``."""

import pytest
import tvm
from click.testing import CliRunner

from aotc.cli import main
from aotc.schedules import log as tuning_log
from aotc.schedules.report import best_at, end_to_end_curve, table


def _record(workload, default, curve, calls=1, final=True):
    return tuning_log.Record(workload=workload, target="llvm:x", task=f"k_{workload}",
                             seconds=curve[-1][2], default_seconds=default, trials=curve[-1][0],
                             trace=[[[], []]], tvm=tvm.__version__, search="rl", curve=curve,
                             calls=calls, final=final)


# task a: improves at its trials 1 and 5 (run trials 1 and 9); b: at its trial 2 (run 4)
A = _record("a", 2e-3, [[1, 1, 3e-3], [5, 9, 1e-3]], calls=2)
B = _record("b", 1e-3, [[2, 4, 5e-4]])


def test_best_at_reads_the_step_curve():
    assert best_at(A.curve, 0) is None
    assert best_at(A.curve, 4) == 3e-3 and best_at(A.curve, 5) == 1e-3
    assert best_at(A.curve, 8, column=1) == 3e-3 and best_at(A.curve, 9, column=1) == 1e-3


def test_end_to_end_uses_the_default_until_tuning_beats_it():
    curve = dict(end_to_end_curve([A, B]))
    assert curve[1] == pytest.approx(2 * 2e-3 + 1e-3)   # a's 3 ms is worse than its default
    assert curve[4] == pytest.approx(2 * 2e-3 + 5e-4)
    assert curve[9] == pytest.approx(2 * 1e-3 + 5e-4)


def test_table_weights_by_calls():
    last = table([A, B])[-1]
    assert "default 5.000 ms" in last and "with the log 2.500 ms" in last and "2.00x" in last


def test_tune_report_cli_prints_and_plots(tmp_path):
    log = tmp_path / "log.jsonl"
    tuning_log.append(log, [A, B, _record("c", 1e-3, [[1, 1, 9e-4]], final=False)])
    result = CliRunner().invoke(main, ["tune-report", str(log), "-o", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    assert "k_a" in result.output and "k_b" in result.output
    assert "k_c" not in result.output  # a checkpoint, not a finished record
    for name in ("tasks.png", "end_to_end.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000


def test_tune_report_on_a_log_without_records_says_so(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("\n")
    result = CliRunner().invoke(main, ["tune-report", str(log)])
    assert result.exit_code != 0 and "no finished tuning records" in result.output
