"""``python -m aotc.farm_tracker``: TVM's RPC tracker (``tvm.exec.rpc_tracker``, the same
arguments), with torch kept out of it: a tracker never uses torch, and tvm_ffi imports it
whenever it is installed (about 200 MB of memory and a second of CPU per process;
runtime/_tvm_runtime.import_hiding_torch); so is the worker process that serves it
(aotc/popen_worker.py)."""

from __future__ import annotations

import runpy

from aotc.popen_worker import start_tvm_workers_here
from aotc.runtime._tvm_runtime import import_hiding_torch

if __name__ == "__main__":
    import_hiding_torch("tvm")
    start_tvm_workers_here()
    runpy.run_module("tvm.exec.rpc_tracker", run_name="__main__", alter_sys=True)
