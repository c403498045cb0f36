"""Run the ONNX backend node suite (1,884 cases) through an engine and write a JSON summary.

    python tests/conformance/run_node_suite.py [--engine aotc|tvm|onnxruntime] [--workers 2]
        [--filter SUBSTRING] [--out build/conformance/aotc.json] [--check] [--update]

Each case runs in a worker process with a timeout: a hang becomes "timeout", a dead worker
(segfault, abort) "crash", and the worker is replaced. --check compares with the committed
expected statuses (tests/conformance/node_expected.json) and exits 1 on a regression: a case
that passed and no longer does, or a new silent mismatch, crash or timeout. --update rewrites
that file from this run.
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
EXPECTED = HERE / "node_expected.json"
BAD_NEW = ("mismatch", "crash", "timeout")


def _worker(conn, engine: str) -> None:
    """Loop: receive a case name, send back its result. Runs in a spawned process."""
    sys.path.insert(0, str(HERE))
    import node_cases  # pylint: disable=import-outside-toplevel
    cases = node_cases.load_cases()
    conn.send("ready")
    while True:
        name = conn.recv()
        if name is None:
            return
        conn.send(node_cases.run_case(cases[name], engine))


class Worker:
    """One worker process; restarted after a crash or timeout."""

    def __init__(self, engine: str):
        self.engine = engine
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, self.engine), daemon=True)
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


def case_names(name_filter: str | None) -> list[str]:
    sys.path.insert(0, str(HERE))
    from onnx.backend.test.loader import load_model_tests  # only names: cheap enough here
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = [c.name for c in load_model_tests(kind="node")]
    return [n for n in names if not name_filter or name_filter in n]


def run_suite(engine: str, names: list[str], workers: int, timeout: float,
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

    pool = [Worker(engine) for _ in range(workers)]
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
    parser.add_argument("--engine", choices=("aotc", "tvm", "onnxruntime"), default="aotc")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--filter", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--update", action="store_true")
    args = parser.parse_args(argv)
    names = case_names(args.filter)
    print(f"{args.engine}: {len(names)} node cases, {args.workers} workers", flush=True)
    start = time.perf_counter()
    results = run_suite(args.engine, names, args.workers, args.timeout)
    summary = summarize(args.engine, results, time.perf_counter() - start)
    out = Path(args.out or f"build/conformance/{args.engine}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(f"{summary['counts']} in {summary['seconds']} s; wrote {out}")
    for status in ("mismatch", "crash", "timeout"):
        for key, cases in summary["groups"].get(status, {}).items():
            print(f"  {status}: {len(cases)} x {key}  [{', '.join(cases[:3])}...]")
    if args.update:
        EXPECTED.write_text(json.dumps({n: r["status"] for n, r in sorted(results.items())},
                                       indent=0) + "\n")
        print(f"updated {EXPECTED}")
    if args.check:
        problems = check_against_expected(results, json.loads(EXPECTED.read_text()))
        for line in problems:
            print("REGRESSION", line)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
