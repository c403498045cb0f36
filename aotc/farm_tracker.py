"""``python -m aotc.farm_tracker``: TVM's RPC tracker (``tvm.exec.rpc_tracker``, the same
arguments), with torch kept out of it: a tracker never uses torch, and tvm_ffi imports it
whenever it is installed (about 200 MB of memory and a second of CPU per process;
runtime/_tvm_runtime.import_hiding_torch)."""

from __future__ import annotations

import runpy

from aotc.runtime._tvm_runtime import import_hiding_torch

if __name__ == "__main__":
    import_hiding_torch("tvm")
    runpy.run_module("tvm.exec.rpc_tracker", run_name="__main__", alter_sys=True)
