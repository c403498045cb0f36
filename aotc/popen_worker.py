"""TVM's worker processes, started with torch kept out of them.

TVM starts a fresh ``python -m tvm.exec.popen_worker`` for every pool worker (the tuner's
builders and runners, each remote session of RPCRunner, the RPC server's serving process), and
each imports all of TVM, and with it torch: tvm_ffi imports torch whenever it is installed,
and no such worker uses it. That import was most of a worker's start-up CPU
(docs/design/measurements.md, "aotc/popen_worker.py").

``start_tvm_workers_here()`` makes the TVM pools of this process start ``python -m
aotc.popen_worker`` instead: this module imports TVM with torch hidden
(runtime/_tvm_runtime.import_hiding_torch), then runs TVM's own worker loop, unchanged. The
module stays the worker's ``__main__``, so the processes the RPC server spawns per session
(multiprocessing, "spawn") import it first, and TVM without torch too."""

from __future__ import annotations

import subprocess
import sys

from aotc.runtime._tvm_runtime import import_hiding_torch

_TVM_WORKER = ["-m", "tvm.exec.popen_worker"]
_OURS = ["-m", "aotc.popen_worker"]


class _Subprocess:
    """``subprocess`` as tvm.support.popen_pool sees it: ``Popen`` of TVM's worker module
    starts this one; every other name is subprocess's own."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args, *rest, **kwargs):  # noqa: N802 (subprocess's name)
        args = list(args)
        if args[1:3] == _TVM_WORKER:
            args[1:3] = _OURS
        return subprocess.Popen(args, *rest, **kwargs)


def start_tvm_workers_here() -> None:
    """TVM's pool workers started from this process from now on run this module (idempotent).
    A process that has torch and needs it in a worker has no such worker: TVM's workers
    run TIR builds, kernel timings and RPC sessions."""
    from tvm.support import popen_pool
    if not isinstance(popen_pool.subprocess, _Subprocess):
        popen_pool.subprocess = _Subprocess()


# As the worker's main module, and as the ``__mp_main__`` of a process it spawned (imported
# there first): TVM imported before anything else imports it with torch.
if __name__ in ("__main__", "__mp_main__") and "tvm" not in sys.modules:
    import_hiding_torch("tvm")

if __name__ == "__main__":
    from tvm.exec import popen_worker

    from aotc.targets import x86

    # the kernels this worker builds and times may use AMX tiles, which Linux hands to a
    # process only when it asks (targets/x86.py; a no-op without AMX)
    x86.request_amx()
    popen_worker.main()
