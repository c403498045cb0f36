"""Winograd 3x3 convs (compiler/winograd_kernels.py, WinogradConv, WinogradTransform): each
kernel scheduled by its default rule against a float64 numpy conv, with tile sizes that do
and do not divide the output, asymmetric padding, a fused epilogue; nothing written past an
output, nothing read outside an input (placed against unmapped pages)."""


import numpy as np
import pytest
import tvm
from kernel_helpers import (
    against_unmapped_pages,
    build_scheduled,
    check_guard,
    exit_code_in_child,
    guarded_output,
    skip_unless_runs_here,
)
from tvm import te

from aotc.compiler import winograd_kernels as wk
from aotc.compiler.default_schedules.cpu_dot import PackedDot
from aotc.compiler.default_schedules.cpu_winograd import WinogradTransform

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
RNG = np.random.default_rng(0)


def reference_conv(x, w, padding):
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    oh, ow = xp.shape[1] - 2, xp.shape[2] - 2
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(3):
        for j in range(3):
            out += xp[:, i:i + oh, j:j + ow] @ w[i, j]
    return out


def run_winograd(x, w, m, padding, epilogue=None):
    """The three kernels, each built on its own and run in turn; outputs in guarded buffers."""
    n = x.shape[0]
    top, left, bottom, right = padding
    oh, ow = x.shape[1] + top + bottom - 2, x.shape[2] + left + right - 2
    u = wk.transform_weight(w, m, 16)
    xt = te.placeholder(x.shape, "float32", "x")
    v = wk.input_transform(xt, m, padding)
    ut = te.placeholder(u.shape, "float32", "u")
    vt = te.placeholder(v.shape, "float32", "v")
    product = wk.batched_matmul(vt, ut)
    pt = te.placeholder(product.shape, "float32", "p")
    y = wk.output_transform(pt, n, oh, ow, m)
    if epilogue is not None:
        y = te.compute(y.shape, lambda *i: epilogue(y(*i)), name="epilogue")
    kernels = [(WinogradTransform(), [xt, v]), (PackedDot(), [vt, ut, product]),
               (WinogradTransform(), [pt, y])]
    inputs = [tvm.runtime.tensor(x)]
    for rule, tensors in kernels:
        lib = build_scheduled(rule, te.create_prim_func(tensors), TARGET)
        shape = [int(d) for d in tensors[-1].shape]
        out, whole = guarded_output(shape)
        args = inputs + ([tvm.runtime.tensor(u)] if rule.__class__ is PackedDot else [])
        skip_unless_runs_here(TARGET)
        lib["main"](*args, out)
        check_guard(whole, shape)
        inputs = [out]
    return inputs[0].numpy()


@pytest.mark.parametrize("shape,channels,m,padding", [
    ((1, 8, 8, 16), (16, 32), 4, (1, 1, 1, 1)),   # tiles divide the output
    ((1, 14, 14, 32), (32, 16), 4, (1, 1, 1, 1)),  # 14 = 3 tiles of 4 and a half
    ((1, 7, 7, 16), (16, 16), 2, (1, 1, 1, 1)),    # odd: the last tile is cropped
    ((2, 9, 10, 24), (24, 32), 4, (0, 2, 1, 0)),   # batch 2, asymmetric padding
    ((1, 6, 6, 20), (20, 16), 2, (0, 0, 0, 0)),    # no padding, channels not a lane multiple
])
def test_matches_direct_conv(shape, channels, m, padding):
    x = RNG.standard_normal(shape).astype(np.float32)
    w = (RNG.standard_normal((3, 3) + channels) / np.sqrt(9 * channels[0])).astype(np.float32)
    got = run_winograd(x, w, m, padding)
    want = reference_conv(x, w, padding)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_epilogue_is_inlined_into_the_output_transform():
    x = RNG.standard_normal((1, 12, 12, 16)).astype(np.float32)
    w = (RNG.standard_normal((3, 3, 16, 16)) / 12).astype(np.float32)
    got = run_winograd(x, w, 4, (1, 1, 1, 1), epilogue=lambda v: te.max(v, 0.0))
    np.testing.assert_allclose(got, np.maximum(reference_conv(x, w, (1,) * 4), 0),
                               rtol=1e-4, atol=1e-4)


def _input_transform_against_unmapped_pages(shape, m, at_end):
    """Child process: the scheduled input transform on an input that ends (or starts) at an
    unmapped page; a read outside it kills the process."""
    x, mapping = against_unmapped_pages(shape, at_end)
    x[...] = RNG.standard_normal(shape)
    xt = te.placeholder(shape, "float32", "x")
    v = wk.input_transform(xt, m, (1, 1, 1, 1))
    lib = build_scheduled(WinogradTransform(), te.create_prim_func([xt, v]), TARGET)
    out = tvm.runtime.tensor(np.zeros([int(d) for d in v.shape], np.float32))
    lib["main"](tvm.runtime.from_dlpack(x), out)
    del mapping


@pytest.mark.parametrize("at_end", [False, True], ids=["start", "end"])
@pytest.mark.parametrize("shape,m", [((1, 14, 14, 16), 4), ((1, 7, 7, 16), 2)])
def test_input_transform_reads_nothing_outside_its_input(shape, m, at_end):
    """The padding taps (top/left rows before the input, the last partial tile's past it) are
    guarded loads: here an unguarded one would segfault the child."""
    skip_unless_runs_here(TARGET)
    exit_code = exit_code_in_child(_input_transform_against_unmapped_pages, shape, m, at_end)
    assert exit_code == 0, f"the input transform read outside its input " \
        f"(child exit code {exit_code})"
