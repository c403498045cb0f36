"""The same model compiled twice, each time in its own process, gives the same ``.so`` bit for
bit (with ``SOURCE_DATE_EPOCH`` fixing the build time the metadata records). The model has
symbolic batch, sequence and past lengths, so TVM orders two things differently from process
to process: the stores of its VM's ``shape_func`` (compiler/passes/lowering/
ordered_shape_stores.py; without that pass four compiles gave four libraries) and the dims a
kernel over ``past_len + seq`` takes as scalars (sorted_scalar_params.py)."""

import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch

import aotc
from aotc.compiler.build import build_time
from aotc.errors import CompileError


class _Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.o = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x, past):
        batch, tokens, _ = x.shape
        keys = torch.cat([past, x], 1)
        q = self.q(x).reshape(batch, tokens, 4, 4).transpose(1, 2)
        k = self.q(keys).reshape(batch, -1, 4, 4).transpose(1, 2)
        mixed = torch.softmax(q @ k.transpose(-1, -2), -1) @ k
        return self.o(mixed.transpose(1, 2).reshape(batch, tokens, 16)), keys.sum(-1).tanh()


@pytest.fixture(scope="module")
def symbolic_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("heads") / "heads.onnx"
    torch.manual_seed(0)
    torch.onnx.export(_Heads().eval(), (torch.randn(2, 7, 16), torch.randn(2, 3, 16)), str(path),
                      input_names=["x", "past"], opset_version=17, dynamo=False,
                      dynamic_axes={"x": {0: "batch", 1: "seq"},
                                    "past": {0: "batch", 1: "past_len"}})
    return path


def _compile_in_a_process(model, output, epoch: str) -> bytes:
    env = {**os.environ, "SOURCE_DATE_EPOCH": epoch}
    subprocess.run([sys.executable, "-m", "aotc.cli", "compile", str(model), "--target", "x86",
                    "-o", str(output)], check=True, env=env, capture_output=True)
    return output.read_bytes()


def test_two_compiles_give_the_same_library(symbolic_model, tmp_path):
    first = _compile_in_a_process(symbolic_model, tmp_path / "a.so", "1700000000")
    second = _compile_in_a_process(symbolic_model, tmp_path / "b.so", "1700000000")
    assert first == second
    model = aotc.load(tmp_path / "a.so")
    assert model.metadata["built_unix_time"] == 1700000000  # recorded: the bytes depend on it
    session = ort.InferenceSession(str(symbolic_model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for batch, seq, past in ((1, 5, 2), (3, 17, 11)):  # odd lengths: padded shapes in the heap
        feed = {"x": rng.standard_normal((batch, seq, 16)).astype(np.float32),
                "past": rng.standard_normal((batch, past, 16)).astype(np.float32)}
        got = list(model.run(feed).values())
        for ours, theirs in zip(got, session.run(None, feed), strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_source_date_epoch_must_be_an_integer(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(CompileError, match="SOURCE_DATE_EPOCH"):
        build_time()
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert build_time() > 1700000000
