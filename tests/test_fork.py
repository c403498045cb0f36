"""A model used in a forked child works, whether the parent ran it before the fork or not, in
the forking thread and in others, through multiprocessing and nested forks, and when another
thread held the model's lock at the fork. Before runtime/forks.py the child of a parent that
had run the model hung forever in TVM's thread pool. Each case runs in its own process with a
deadline: a hang fails the test instead of stalling the suite."""

import os
import signal
import subprocess
import sys

import pytest

CHILD_CHECK = """
import os, sys, threading, numpy as np, aotc
from aotc.runtime.inputs import random_inputs
model = aotc.load(sys.argv[1])
feed = random_inputs(model.signature, seed=0)
want = aotc.load(sys.argv[1]).run(feed)  # another Model: the parent's pool starts either way

def same(got):
    return all(np.array_equal(a, b) for a, b in zip(got.values(), want.values()))

def in_child(work):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            code = 0 if work() else 3
        except Exception as err:
            print("child failed:", err, flush=True)
            code = 4
        sys.exit(code)  # a normal exit: TVM's thread-local pools are destroyed on the way out
    status = os.waitpid(pid, 0)[1]
    return status >> 8 if status & 0x7F == 0 else 128 + (status & 0x7F)  # 134: it aborted
"""

CASES = {
    "run-then-fork": "model.run(feed)\nsys.exit(in_child(lambda: same(model.run(feed))))",
    "fork-before-first-run": "sys.exit(in_child(lambda: same(model.run(feed))))",
    "child-runs-in-a-thread": """
model.run(feed)
def threaded():
    out = {}
    t = threading.Thread(target=lambda: out.update(ok=same(model.run(feed))))
    t.start(); t.join()
    return out["ok"]
sys.exit(in_child(threaded))""",
    "nested-fork": """
model.run(feed)
sys.exit(in_child(lambda: same(model.run(feed))
                  and in_child(lambda: same(model.run(feed))) == 0))""",
    "lock-held-at-fork": """
model.run(feed)
model._lock.acquire()  # as a run in progress on another thread would hold it
sys.exit(in_child(lambda: same(model.run(feed))))""",
    "multiprocessing-fork": """
import multiprocessing as mp
model.run(feed)
def work(_):
    return same(model.run(feed))
with mp.get_context("fork").Pool(2) as pool:
    sys.exit(0 if all(pool.map(work, range(4))) else 3)""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_forked_child_runs_the_model(case, tiny_so):
    process = subprocess.Popen([sys.executable, "-c", CHILD_CHECK + CASES[case], str(tiny_so)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=120)
    finally:  # a hung child must not outlive the test (it spins in TVM's pool)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 0, output
