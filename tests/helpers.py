"""Shared test helpers: one end-to-end check against onnxruntime, one against torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import aotc
from aotc.runtime.inputs import random_inputs

# fp32 throughout; reductions are reordered by the schedules, so allow accumulated rounding.
RTOL, ATOL = 1e-4, 1e-4


def compile_and_load(model, tmp_path: Path, name: str = "model", **kwargs):
    out = tmp_path / f"{name}.so"
    aotc.compile(model, target="x86", output=out, **kwargs)
    return aotc.load(out)


def check_against_onnxruntime(onnx_path, tmp_path: Path, rtol=RTOL, atol=ATOL, feed=None,
                              **kwargs):
    """Compile, export, load through aotc.runtime, compare every output with onnxruntime."""
    import onnxruntime as ort
    model = compile_and_load(onnx_path, tmp_path, Path(str(onnx_path)).stem, **kwargs)
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
