"""Build candidates in a pool of worker processes that lives for the whole tuning run.

MetaSchedule's LocalBuilder starts a fresh pool for every batch, and its build function
imports every backend's tensor intrinsics in each new worker (intrinsics.py): 16 builds of a
small matmul took 30 s here, against 0.1 s of compiling and exporting them. This builder keeps
its workers (recycled after ``uses_per_worker`` builds, the leak MetaSchedule's restart works
around) and builds with the same steps as MetaSchedule's default. Each build has a timeout,
and a candidate that fails or hangs is a failed result, never the tuner's end.

Every candidate is written into a folder of its own under the builder's scratch folder.
MetaSchedule's RemoveBuildArtifact callback removes a candidate's folder once it is measured;
``shutdown`` removes the scratch folder with whatever is left (candidates built but never
measured: a run ended by an error or by its budget, a builder used without the callbacks).
MetaSchedule's own builder leaves those in the temporary folder for good."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from aotc.popen_worker import start_tvm_workers_here


def build_and_export(mod, target, shared: bool = False, linker: str | None = None,
                     scratch: str | None = None) -> str:
    """One candidate, in a worker: MetaSchedule's default build and tar export, minus the
    import of all tensor intrinsics (a tensorized candidate is already lowered to them), in
    a new folder under ``scratch``. With ``shared``, a shared library linked here (by
    ``linker``, else the host cc): a farm's board has no compiler to link a tar with."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    from tvm.support.tar import tar

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    built = tvm.compile(mod, target=target)
    folder = tempfile.mkdtemp(prefix="candidate-", dir=scratch)
    if not shared:
        path = os.path.join(folder, "mod." + tar.output_format)
        built.export_library(path, fcompile=tar)
        return path
    path = os.path.join(folder, "mod.so")
    export_shared(built, path, linker)
    return path


def export_shared(built, path: str, linker: str | None) -> None:
    """``built`` as a shared library linked here by ``linker`` (None: the host cc)."""
    from tvm.support import cc
    built.export_library(path, **({"fcompile": cc.cross_compiler(linker)} if linker else {}))


@derived_object
class PersistentBuilder(PyBuilder):
    def __init__(self, timeout_sec: float, max_workers: int | None = None,
                 uses_per_worker: int = 200, shared: bool = False, linker: str | None = None,
                 on_built: Callable[[int], None] | None = None):
        """``on_built(count)`` after each batch: the progress line's word while MetaSchedule
        builds every task's first batch before it reports any measurement."""
        super().__init__()
        self.timeout_sec, self.shared, self.linker = timeout_sec, shared, linker
        self.on_built = on_built
        self.scratch = tempfile.mkdtemp(prefix="aotc-candidates-")
        start_tvm_workers_here()
        self.pool = PopenPoolExecutor(max_workers=max_workers or os.cpu_count(),
                                      timeout=timeout_sec,
                                      maximum_process_uses=uses_per_worker)

    def build(self, build_inputs) -> list[BuilderResult]:
        jobs = [(inp.mod, inp.target, self.shared, self.linker, self.scratch)
                for inp in build_inputs]
        results = []
        for outcome in self.pool.map_with_error_catching(lambda job: build_and_export(*job), jobs):
            if outcome.status == StatusKind.COMPLETE:
                results.append(BuilderResult(outcome.value, None))
            elif outcome.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"build timed out after {self.timeout_sec} s"))
            else:
                results.append(BuilderResult(None, f"build failed: {outcome.value}"))
        if self.on_built is not None:
            self.on_built(len(results))
        return results

    def shutdown(self) -> None:
        self.pool.shutdown()
        shutil.rmtree(self.scratch, ignore_errors=True)

