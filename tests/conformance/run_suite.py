"""Run a conformance suite through an engine and write a JSON summary.

    python tests/conformance/run_suite.py [--suite node|torch]
        [--engine aotc|tvm|onnxruntime] [--workers 2] [--filter SUBSTRING] [--every N]
        [--out build/conformance/aotc.json] [--check] [--update]

Suites: ``node``, the ONNX backend node suite (1,884 cases; node_cases.py); ``torch``, the
first float32 sample of every operator in torch's OpInfo database (torch_cases.py, aotc only).

Each case runs in a worker process with a timeout: a hang becomes "timeout", a dead worker
(segfault, abort) "crash", and the worker is replaced. --check compares with the committed
expected statuses (tests/conformance/<suite>_expected.json) and exits 1 on a regression: a
case that passed and no longer does, or a new silent mismatch, crash or timeout. --update
rewrites that file from this run. --every N runs every N-th case (a quick sample).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import re
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITES = {"node": "node_cases", "torch": "torch_cases"}
BAD_NEW = ("mismatch", "crash", "timeout")


def expected_path(suite: str) -> Path:
    return HERE / f"{suite}_expected.json"


def _suite_module(suite: str):
    sys.path.insert(0, str(HERE))
    import importlib
    return importlib.import_module(SUITES[suite])


def _worker(conn, suite: str, engine: str) -> None:
    """Loop: receive a case name, send back its result. Runs in a spawned process."""
    module = _suite_module(suite)
    cases = module.load_cases()
    conn.send("ready")
    while True:
        name = conn.recv()
        if name is None:
            return
        conn.send(module.run_case(cases[name], engine))


class Worker:
    """One worker process; restarted after a crash or timeout."""

    def __init__(self, suite: str, engine: str):
        self.suite, self.engine = suite, engine
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, self.suite, self.engine), daemon=True)
        self.proc.start()
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            raise RuntimeError("conformance worker did not start")

    def run(self, name: str, timeout: float) -> dict:
        start = time.perf_counter()
        try:
            self.conn.send(name)
            if self.conn.poll(timeout):
                return self.conn.recv()
            status, reason = "timeout", f"no result within {timeout:.0f} s"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            status, reason = "crash", ""
        self.proc.kill()
        self.proc.join()
        if status == "crash":
            reason = f"worker died (exit code {self.proc.exitcode})"
        self._start()
        return {"status": status, "reason": reason,
                "seconds": round(time.perf_counter() - start, 2)}

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def case_names(suite: str, name_filter: str | None, every: int = 1) -> list[str]:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = list(_suite_module(suite).load_cases())
    names = [n for n in names if not name_filter or name_filter in n]
    return names[::every]


def run_suite(suite: str, engine: str, names: list[str], workers: int, timeout: float,
              progress=print) -> dict:
    results: dict[str, dict] = {}
    queue = list(reversed(names))
    lock = threading.Lock()

    def drain(worker: Worker) -> None:
        while True:
            with lock:
                if not queue:
                    return
                name = queue.pop()
            result = worker.run(name, timeout)
            with lock:
                results[name] = result
                if len(results) % 100 == 0 or len(results) == len(names):
                    progress(f"  {len(results)}/{len(names)} cases", flush=True)

    pool = [Worker(suite, engine) for _ in range(workers)]
    threads = [threading.Thread(target=drain, args=(w,)) for w in pool]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in pool:
        w.close()
    return {name: results[name] for name in names}


def _group_key(reason: str) -> str:
    """Reasons with their numbers and quoted names blanked, so that like failures group."""
    key = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason)
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", key)[:160]


def summarize(engine: str, results: dict, seconds: float) -> dict:
    counts = collections.Counter(r["status"] for r in results.values())
    groups: dict[str, dict[str, list[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for name, r in results.items():
        if r["status"] != "pass":
            groups[r["status"]][_group_key(r["reason"])].append(name)
    ordered = {status: dict(sorted(g.items(), key=lambda kv: -len(kv[1])))
               for status, g in groups.items()}
    return {"engine": engine, "cases": len(results), "seconds": round(seconds, 1),
            "counts": dict(counts.most_common()), "groups": ordered, "results": results}


def check_against_expected(results: dict, expected: dict) -> list[str]:
    """Regressions: a listed pass that no longer passes; a mismatch/crash/timeout not listed."""
    problems = []
    for name, r in results.items():
        want = expected.get(name)
        if want == "pass" and r["status"] != "pass":
            problems.append(f"{name}: passed before, now {r['status']} ({r['reason']})")
        elif r["status"] in BAD_NEW and want != r["status"]:
            problems.append(f"{name}: new {r['status']} (was {want}): {r['reason']}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="node")
    parser.add_argument("--engine", choices=("aotc", "tvm", "onnxruntime"), default="aotc")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--filter", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--update", action="store_true")
    args = parser.parse_args(argv)
    names = case_names(args.suite, args.filter, args.every)
    print(f"{args.engine}: {len(names)} {args.suite} cases, {args.workers} workers", flush=True)
    start = time.perf_counter()
    results = run_suite(args.suite, args.engine, names, args.workers, args.timeout)
    summary = summarize(args.engine, results, time.perf_counter() - start)
    out = Path(args.out or f"build/conformance/{args.suite}_{args.engine}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(f"{summary['counts']} in {summary['seconds']} s; wrote {out}")
    for status in ("mismatch", "crash", "timeout"):
        for key, cases in summary["groups"].get(status, {}).items():
            print(f"  {status}: {len(cases)} x {key}  [{', '.join(cases[:3])}...]")
    expected = expected_path(args.suite)
    if args.update:
        if args.filter or args.every > 1:
            parser.error("--update needs the whole suite (no --filter / --every)")
        expected.write_text(json.dumps({n: r["status"] for n, r in sorted(results.items())},
                                       indent=0) + "\n")
        print(f"updated {expected}")
    if args.check:
        problems = check_against_expected(results, json.loads(expected.read_text()))
        for line in problems:
            print("REGRESSION", line)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
