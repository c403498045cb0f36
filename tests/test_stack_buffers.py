"""compiler/lower/stack_buffers.py: aotc's TIR pipeline keeps a kernel's buffers of up to
MAX_STACK_BYTES on the stack. A 1,792-byte tile buffer in every iteration of a parallel loop
(a cache_write, as the conv and matmul schedules make) is a TVMBackendAllocWorkspace call in
each iteration with TVM's default pipeline, and none with aotc's; a buffer over the limit keeps
the workspace; the results are the same. Compile uses the pipeline on CPU targets only."""

import numpy as np
import pytest
import tvm
from tvm import te

from aotc.compiler.lower import stack_buffers
from aotc.targets import resolve

TARGET = tvm.target.Target(resolve("x86").tvm_target)


def _tiled(columns: int):
    """B = A * 2 + 1 over [64, columns], rows in parallel, each row computed into a tile
    buffer of ``columns`` float32 first."""
    a = te.placeholder((64, columns), "float32", name="a")
    b = te.compute((64, columns), lambda i, j: a[i, j] * 2.0 + 1.0, name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    block = sch.get_sblock("b")
    tile = sch.cache_write(block, 0, "global")
    row, _ = sch.get_loops(block)
    sch.parallel(row)
    sch.reverse_compute_at(tile, row)
    return sch.mod


def _asm_and_result(mod, columns: int, pipeline: str):
    lib = tvm.tirx.build(mod, target=TARGET, pipeline=pipeline)
    x = np.random.default_rng(0).standard_normal((64, columns)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros_like(x))
    lib["main"](tvm.runtime.tensor(x), out)
    return lib.inspect_source("asm"), out.numpy(), x


def _workspace_calls(asm: str) -> int:
    return asm.count("__TVMBackendAllocWorkspace@GOTPCREL")


def test_a_tile_buffer_under_the_limit_goes_on_the_stack():
    mod = _tiled(448)  # 1,792 bytes: over TVM's 1,024
    default_asm, default_out, x = _asm_and_result(mod, 448, "default")
    ours_asm, ours_out, _ = _asm_and_result(mod, 448, stack_buffers.PIPELINE)
    assert _workspace_calls(default_asm) >= 1
    assert _workspace_calls(ours_asm) == 0
    np.testing.assert_array_equal(ours_out, default_out)
    np.testing.assert_allclose(ours_out, x * 2 + 1, rtol=1e-6)


def test_a_buffer_over_the_limit_keeps_the_workspace():
    columns = stack_buffers.MAX_STACK_BYTES // 4 + 16
    ours_asm, out, x = _asm_and_result(_tiled(columns), columns, stack_buffers.PIPELINE)
    assert _workspace_calls(ours_asm) >= 1
    np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("target, pipeline", [("x86", "aotc"), ("arm", "aotc"),
                                              ("cuda", "default")])
def test_cpu_targets_compile_with_it(target, pipeline):
    assert stack_buffers.tir_pipeline(tvm.target.Target(resolve(target).tvm_target)) == pipeline
