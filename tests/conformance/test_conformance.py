"""The conformance suites as ratchets: every case that passed still passes, and no new silent
mismatch, crash or timeout appears (tests/conformance/<suite>_expected.json; refresh one with
``python tests/conformance/run_suite.py --suite S --update`` after an improvement)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run_suite import check_against_expected, expected_path, summarize  # noqa: E402


def test_regressions_and_new_silent_mismatches_are_reported():
    expected = {"a": "pass", "b": "compile", "c": "mismatch", "d": "unsupported"}
    results = {"a": {"status": "compile", "reason": "boom"},
               "b": {"status": "mismatch", "reason": "values differ"},
               "c": {"status": "mismatch", "reason": "values differ"},
               "d": {"status": "pass", "reason": ""}}
    problems = check_against_expected(results, expected)
    assert len(problems) == 2
    assert problems[0].startswith("a: passed before, now compile")
    assert problems[1].startswith("b: new mismatch (was compile)")


def test_summary_groups_like_reasons():
    results = {"x": {"status": "compile", "reason": "Reshape of 'a' with 3 dims"},
               "y": {"status": "compile", "reason": "Reshape of 'b' with 4 dims"},
               "z": {"status": "pass", "reason": ""}}
    summary = summarize("aotc", results, 1.0)
    assert summary["counts"] == {"compile": 2, "pass": 1}
    assert list(summary["groups"]["compile"].values()) == [["x", "y"]]


@pytest.mark.parametrize("suite, cases", [("node", 1884), ("torch", None)])
def test_expected_files_list_every_case_and_no_crash(suite, cases):
    expected = json.loads(expected_path(suite).read_text())
    assert cases is None or len(expected) == cases
    assert not [n for n, s in expected.items() if s in ("crash", "timeout")]


def _check(tmp_path, *args):
    out = subprocess.run(
        [sys.executable, str(HERE / "run_suite.py"), "--check", "--workers", "2",
         "--out", str(tmp_path / "summary.json"), *args],
        capture_output=True, text=True, timeout=1500)
    report = "\n".join(line for line in out.stdout.splitlines() if "Warning" not in line)
    assert out.returncode == 0, report[-6000:]


@pytest.mark.slow
def test_node_suite_has_no_regressions(tmp_path):
    """All 1,884 cases through compile -> .so -> runtime, 2 workers (~6.5 minutes here alone,
    ~8 beside the other tests under pytest -n 2)."""
    _check(tmp_path, "--suite", "node")


@pytest.mark.slow
def test_torch_sweep_sample_has_no_regressions(tmp_path):
    """Every 4th operator of torch's OpInfo database (~1.5 minutes; the whole sweep is
    ``run_suite.py --suite torch``)."""
    _check(tmp_path, "--suite", "torch", "--every", "4")
