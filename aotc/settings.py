"""The one registry of environment variables aotc reads. Nothing else reads os.environ."""

from __future__ import annotations

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
VERBOSE = EnvVar("AOTC_VERBOSE", "", "Set to 1 to get full tracebacks from the CLI.")
DUMP_IR = EnvVar("AOTC_DUMP_IR", "", "Folder to write the IR after every compiler phase.")

CACHE_DIR = EnvVar("AOTC_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "aotc"),
                   "Where aotc keeps what it builds or downloads once: the C++ runner per "
                   "architecture, other architectures' TVM runtime libraries.")

ALL = (NUM_THREADS, VERBOSE, DUMP_IR, CACHE_DIR)


def default_threads() -> int:
    """Every core this process may run on. TVM's own default halves the core count on x86
    (it assumes hyper-threads), which gave users one thread on this 2-core VM."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def apply_thread_setting() -> None:
    """TVM reads TVM_NUM_THREADS once, when its thread pool starts: call before the first run.
    An explicit TVM_NUM_THREADS wins, then AOTC_NUM_THREADS, then every allowed core."""
    if "TVM_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = NUM_THREADS.get() or str(default_threads())
