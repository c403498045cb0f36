"""Tuning logs (``tuning_logs/*.jsonl``): append-only JSON lines, one finished record a line.

Written whole: each record is one ``write`` of one line to a file opened for appending, then
fsync'd, so a tuner killed at any point leaves every earlier record readable (at worst a torn
last line, which the reader skips). Read forgivingly: a blank, truncated, foreign or
other-version line is skipped with a warning that names the file and line; the rest are used.
Logs from several runs or machines merge by concatenating them (the best record per workload
and target wins)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .trace_check import trace_problem

LOG = logging.getLogger("aotc.tuning_log")
VERSION = 1
# A record is applied only when it ran at least 2% faster than the default schedule: two
# back-to-back timings of one kernel on a shared VM differ by about 1%, so a smaller win is
# noise.
APPLY_MARGIN = 0.98


@dataclass(frozen=True)
class Record:
    """The best schedule found for one workload on one target."""
    workload: str          # schedules.keys.workload_key
    target: str            # schedules.keys.target_key
    task: str              # the kernel's name when it was tuned (for people)
    seconds: float         # its measured run time
    default_seconds: float  # the default rules' run time, measured in the same way
    trials: int
    trace: dict            # MetaSchedule TuningRecord.as_json() of the schedule
    tvm: str               # the TVM version that replays the trace
    search: str = "evolutionary"  # the strategy that found it (schedules.search.KINDS)
    # best time so far as trials went on: [trials of this task, trials of the run, seconds]
    curve: list = field(default_factory=list)
    calls: int = 1         # times the kernel runs per inference of the model tuned
    # False: written while the search ran (checkpoint.py), timed by MetaSchedule's runner
    # only; a resumed run starts from it, compile does not apply it
    final: bool = True
    # keys.schedule_key of the default rules' schedule default_seconds timed ("": not
    # recorded by older logs); compile skips a record whose default has changed
    default_schedule: str = ""

    @property
    def beats_default(self) -> bool:
        return self.seconds < APPLY_MARGIN * self.default_seconds

    def to_line(self) -> str:
        return json.dumps({"aotc_tuning_record": VERSION, **asdict(self)},
                          separators=(",", ":")) + "\n"


def append(path: str | Path, records: list[Record]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")  # a torn last line (killed writer) stays one bad line
        for record in records:
            os.write(fd, record.to_line().encode())
        os.fsync(fd)
    finally:
        os.close(fd)


# (path, mtime_ns, size) -> (records, warnings) of logs already parsed in this process. Every
# compile reads the shipped logs, and a process that compiles many models (the conformance
# suite, a user's script) would parse the same files each time.
_PARSED: dict[tuple[str, int, int], tuple[tuple[Record, ...], tuple[str, ...]]] = {}


def read(path: str | Path) -> tuple[list[Record], list[str]]:
    """(records, warnings): every well-formed record of this version, and one warning per line
    that was skipped (logged on every read). A file unchanged since it was last read here
    (same modification time and size) is not parsed again."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    if key not in _PARSED:
        if len(_PARSED) > 64:
            _PARSED.clear()
        records, warnings = _parse(path)
        _PARSED[key] = (tuple(records), tuple(warnings))
    records, warnings = _PARSED[key]
    for warning in warnings:
        LOG.warning(warning)
    return list(records), list(warnings)


def _parse(path: str | Path) -> tuple[list[Record], list[str]]:
    records, warnings = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            problem = None
            if not line.strip():
                problem = "blank line"
            else:
                try:
                    data = json.loads(line)
                except json.JSONDecodeError:
                    problem = "not JSON (truncated?)"
                else:
                    if not isinstance(data, dict) or "aotc_tuning_record" not in data:
                        problem = "not an aotc tuning record"
                    elif data["aotc_tuning_record"] != VERSION:
                        problem = f"record version {data['aotc_tuning_record']}, reader {VERSION}"
                    else:
                        record, problem = _checked_record(data)
                        if record is not None:
                            records.append(record)
            if problem:
                warnings.append(f"{path}:{number}: skipped ({problem})")
    return records, warnings


def _checked_record(data: dict) -> tuple[Record | None, str | None]:
    """(the record of a parsed line, None), or (None, why it is not usable). Its trace must
    pass trace_check: a record is data, and nothing it carries may become code or open a file."""
    data.pop("aotc_tuning_record")
    try:
        record = Record(**data)
    except TypeError as err:
        return None, f"fields do not match: {err}"
    problem = trace_problem(record.trace)
    return (None, f"unsafe trace, {problem}") if problem else (record, None)


def best_records(paths, target: str, beating_default: bool = True,
                 final: bool = True) -> dict[str, Record]:
    """workload key -> the fastest record for ``target`` across all ``paths``: only records
    faster than the default rules' schedule, unless ``beating_default`` is False; only final
    records (both times measured the same way at the end of a run), unless ``final`` is
    False (then checkpoints only)."""
    best: dict[str, Record] = {}
    for path in paths:
        records, _ = read(path)
        for record in records:
            if record.target != target or record.final != final or (
                    beating_default and not record.beats_default):
                continue
            if record.workload not in best or record.seconds < best[record.workload].seconds:
                best[record.workload] = record
    return best


def compact(paths, dest: str | Path) -> int:
    """Write to ``dest`` the best final record per workload and target found in ``paths``
    (checkpoints and slower records dropped: what compile would use), atomically; returns
    how many. For logs that ship, and for merging logs from several runs."""
    best: dict[tuple[str, str], Record] = {}
    for path in paths:
        for record in read(path)[0]:
            key = (record.workload, record.target)
            if record.final and (key not in best or record.seconds < best[key].seconds):
                best[key] = record
    dest = Path(dest)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.write_text("".join(r.to_line() for r in best.values()))
    os.replace(tmp, dest)
    return len(best)
