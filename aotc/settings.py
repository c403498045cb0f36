"""The one registry of environment variables aotc reads. Nothing else reads os.environ."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    doc: str

    def get(self) -> str:
        return os.environ.get(self.name, self.default)


NUM_THREADS = EnvVar("AOTC_NUM_THREADS", "",
                     "Threads of the TVM runtime thread pool (default: every core this process "
                     "may run on). Copied into TVM_NUM_THREADS before the runtime starts.")
PARALLELISM = EnvVar("AOTC_PARALLELISM", "adaptive",
                     "How a model's parallel loops run: 'adaptive' (TVM's thread pool while it "
                     "pays, one thread while other work holds the cores: runtime/"
                     "parallelism.py), 'pool' (always the pool) or 'inline' (always one "
                     "thread).")
VERBOSE = EnvVar("AOTC_VERBOSE", "", "Set to 1 to get full tracebacks from the CLI.")
DUMP_IR = EnvVar("AOTC_DUMP_IR", "", "Folder to write the IR after every compiler phase.")

CACHE_DIR = EnvVar("AOTC_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "aotc"),
                   "Where aotc keeps what it builds or downloads once: the C++ runner per "
                   "architecture, other architectures' TVM runtime libraries.")

ALL = (NUM_THREADS, PARALLELISM, VERBOSE, DUMP_IR, CACHE_DIR)


def default_threads() -> int:
    """Every core this process may run on, and no more than its cgroup's CPU quota allows
    (a container limited to 1 CPU on a 2-core host ran two threads that the quota then
    throttled). TVM's own default halves the core count on x86 (it assumes hyper-threads),
    which gave users one thread on a 2-core VM."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_cpu_quota(proc_cgroup: str = "/proc/self/cgroup",
                     root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs this process's cgroup may use per period (cgroup v2 cpu.max, or v1
    cpu.cfs_quota_us / cpu.cfs_period_us), None when unlimited or unknown."""
    try:
        with open(proc_cgroup, encoding="ascii") as f:
            entries = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    for _, controllers, path in entries:
        if controllers == "":  # v2
            limit = _read_words(f"{root}/{path.lstrip('/')}/cpu.max".replace("//", "/"))
            if limit and limit[0] != "max":
                return int(limit[0]) / int(limit[1])
        elif "cpu" in controllers.split(","):
            base = f"{root}/{controllers}/{path.lstrip('/')}".rstrip("/")
            quota, period = _read_words(f"{base}/cpu.cfs_quota_us"), \
                _read_words(f"{base}/cpu.cfs_period_us")
            if quota and period and int(quota[0]) > 0:
                return int(quota[0]) / int(period[0])
    return None


def _read_words(path: str) -> list[str]:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().split()
    except (OSError, ValueError):
        return []


def thread_count() -> int:
    """The thread count TVM's pool starts with in this process (after apply_thread_setting)."""
    try:
        return max(1, int(os.environ.get("TVM_NUM_THREADS", "")))
    except ValueError:
        return default_threads()


def apply_thread_setting() -> None:
    """TVM reads TVM_NUM_THREADS once, when its thread pool starts: call before the first run.
    An explicit TVM_NUM_THREADS wins, then AOTC_NUM_THREADS, then every allowed core."""
    if "TVM_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = NUM_THREADS.get() or str(default_threads())
