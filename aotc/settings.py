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
                     "Threads of the TVM runtime thread pool (default: TVM's choice, all cores). "
                     "Copied into TVM_NUM_THREADS before the runtime starts.")
VERBOSE = EnvVar("AOTC_VERBOSE", "", "Set to 1 to get full tracebacks from the CLI.")
DUMP_IR = EnvVar("AOTC_DUMP_IR", "", "Folder to write the IR after every compiler phase.")

ALL = (NUM_THREADS, VERBOSE, DUMP_IR)


def apply_thread_setting() -> None:
    """TVM reads TVM_NUM_THREADS once, when its thread pool starts: call before the first run."""
    threads = NUM_THREADS.get()
    if threads and "TVM_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = threads
