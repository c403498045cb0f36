"""A model used in a forked child works, whether the parent ran it before the fork or not, in
the forking thread and in others, through multiprocessing and nested forks, and when another
thread held the model's lock at the fork; and the child exits. Before runtime/forks.py the child
of a parent that had run the model hung in TVM's thread pool: on its first parallel run, or at
its exit even when it ran nothing, once the parent's pool workers had gone to sleep. The cases
run with the pool forced on and with ``TVM_THREAD_POOL_SPIN_COUNT=0`` (workers sleep as soon as
a run ends: the hard case), and once with TVM's default spinning after a pause. Each case runs
in its own process with a deadline: a hang fails the test instead of stalling the suite."""

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
    "child-exits-without-running": """
model.run(feed)
sys.exit(in_child(lambda: True))""",
    "caller-thread-ends": """
import gc
def kernel_threads():
    return sum(t.name == "aotc-kernels" for t in threading.enumerate())
t = threading.Thread(target=lambda: model.run(feed))
t.start(); t.join()
gc.collect()
for _ in range(100):  # the kernel thread ends once it reads the stop its owner's end queued
    if kernel_threads() == 0:
        break
    threading.Event().wait(0.01)
model.run(feed)
sys.exit(0 if kernel_threads() == 1 else 5)""",
    "profile-then-fork": """
from aotc.runtime.profile import profile
report = profile(model, repeats=3)  # calls the kernels one by one, as `aotc profile` does
model.run(feed)
sys.exit(in_child(lambda: same(model.run(feed))) or in_child(lambda: True))""",
    "multiprocessing-fork": """
import multiprocessing as mp
model.run(feed)
def work(_):
    return same(model.run(feed))
with mp.get_context("fork").Pool(2) as pool:
    sys.exit(0 if all(pool.map(work, range(4))) else 3)""",
}


POOL_SLEEPS = {"AOTC_PARALLELISM": "pool", "TVM_THREAD_POOL_SPIN_COUNT": "0"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_forked_child_runs_the_model(case, tiny_so):
    _check(CHILD_CHECK + CASES[case], tiny_so, POOL_SLEEPS)


def test_a_fork_after_the_default_pool_went_to_sleep(tiny_so):
    """TVM's default spin count: the workers spin a while after a run, then sleep."""
    code = CHILD_CHECK + """
import time
model.run(feed)
time.sleep(2)
sys.exit(in_child(lambda: same(model.run(feed))) or in_child(lambda: True))"""
    _check(code, tiny_so, {"AOTC_PARALLELISM": "pool"})


def _check(code: str, tiny_so, env: dict) -> None:
    process = subprocess.Popen([sys.executable, "-c", code, str(tiny_so)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, **env})
    try:
        output, _ = process.communicate(timeout=120)
    finally:  # a hung child must not outlive the test (it spins in TVM's pool)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 0, output
