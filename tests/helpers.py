"""Shared test helpers: one end-to-end check against onnxruntime, one against torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import aotc
from aotc.runtime.inputs import random_inputs

# fp32 throughout; reductions are reordered by the schedules, so allow accumulated rounding.
RTOL, ATOL = 1e-4, 1e-4


def compile_and_load(model, tmp_path: Path, name: str = "model", target: str = "x86",
                     **kwargs):
    out = tmp_path / f"{name}.so"
    aotc.compile(model, target=target, output=out, **kwargs)
    return aotc.load(out)


def check_against_onnxruntime(onnx_path, tmp_path: Path, rtol=RTOL, atol=ATOL, feed=None,
                              compiled: Path | None = None, **kwargs):
    """Compile, export, load through aotc.runtime, compare every output with onnxruntime.
    ``compiled``: the library already built from ``onnx_path`` (no compile here)."""
    import onnxruntime as ort
    model = aotc.load(compiled) if compiled is not None else \
        compile_and_load(onnx_path, tmp_path, Path(str(onnx_path)).stem, **kwargs)
    feed = feed or random_inputs(model.signature, seed=1)
    ours = model.run(feed)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    theirs = session.run(None, feed)
    assert len(ours) == len(theirs)
    for (name, got), want in zip(ours.items(), theirs):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"output {name}")
    return model, ours


def check_against_torch(module, example_inputs, tmp_path: Path, rtol=RTOL, atol=ATOL):
    import torch
    model = compile_and_load(module, tmp_path, type(module).__name__,
                             example_inputs=example_inputs)
    with torch.no_grad():
        want = module.eval()(*example_inputs)
    got = model(*[t.numpy() for t in example_inputs])
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    for g, w in zip(got.values(), want):
        np.testing.assert_allclose(g, w.numpy(), rtol=rtol, atol=atol)
    return model


def inverted_residual_block():
    """MobileNetV2's block in small (16 -> 64 expand, ReLU6, 3x3 depthwise, ReLU6, 64 -> 16
    project, residual add), seeded: the int8 tests' model with a depthwise conv between two
    int8 ones."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.expand = torch.nn.Conv2d(16, 64, 1)
            self.dw = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)
            self.project = torch.nn.Conv2d(64, 16, 1)

        def forward(self, x):
            y = torch.nn.functional.relu6(self.expand(x))
            return x + self.project(torch.nn.functional.relu6(self.dw(y)))

    torch.manual_seed(0)
    return Block().eval()


def assert_near_torch(net, so_path, x: np.ndarray, fraction: float) -> np.ndarray:
    """The compiled model's first output on ``x`` within ``fraction`` of the largest magnitude
    of torch's (quantized models); returns it."""
    import torch
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    model = aotc.load(so_path)
    got = next(iter(model.run({model.signature.inputs[0].name: x}).values()))
    np.testing.assert_allclose(got, want, atol=fraction * np.abs(want).max())
    return got


_FRESH_RUN = """
import sys
import numpy as np
import aotc
feed = dict(np.load(sys.argv[2]))
outputs = aotc.load(sys.argv[1]).run(feed)
np.savez(sys.argv[3], **outputs)
"""


def run_in_fresh_process(so_path, feed: dict[str, np.ndarray], tmp_path: Path,
                         env: dict | None = None, capture: bool = False) -> dict[str, np.ndarray]:
    """Load ``so_path`` and run it on ``feed`` in a new Python process, as a user would (the
    compiling process has libraries that a user's does not); returns its outputs. A failing
    run raises CalledProcessError (with its output when ``capture``)."""
    import subprocess
    import sys
    feed_path, out_path = tmp_path / "fresh_feed.npz", tmp_path / "fresh_out.npz"
    np.savez(feed_path, **feed)
    subprocess.run([sys.executable, "-c", _FRESH_RUN, str(so_path), str(feed_path),
                    str(out_path)], check=True, env=env, timeout=300, capture_output=capture)
    with np.load(out_path) as data:
        return dict(data)


def claiming_a_flag_no_cpu_has(tiny_so: Path, folder: Path) -> Path:
    """``tiny_so`` with its first CPU flag renamed to one no CPU has, resealed (the same
    bytes otherwise: the name keeps its length)."""
    import pytest
    data = tiny_so.read_bytes()
    listed = b'"cpu_flags": ["avx2"'
    if listed not in data:
        pytest.skip("the host preset's code needs no AVX2 on this CPU")
    path = folder / "foreign.so"
    path.write_bytes(data.replace(listed, b'"cpu_flags": ["avz2"'))
    from aotc.runtime.artifact import seal
    seal(path)
    return path
