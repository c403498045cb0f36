"""Calibration and evaluation samples, one feed (input name -> array) at a time.

Accepted sources:
  - a ``.npz`` of named arrays: each array holds one sample (the input's shape) or a stack of
    them (a leading sample axis, or for a batch-1 input the batch axis itself);
  - a folder of ``.npy`` files: for a one-input model every file is a sample (or a stack); for
    several inputs, one subfolder per sample holding ``<input name>.npy``;
  - a Python iterable of feeds (dicts) or, for a one-input model, of arrays; or, for a
    one-input model, one array holding a stack of samples.
A sample that does not fit the model's signature is an error naming the input, the file and
the shapes expected and found."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from aotc.errors import CompileError
from aotc.runtime.inputs import npy_file_name
from aotc.runtime.signature import ModelSignature, TensorSpec


def _fits(shape: tuple, spec: TensorSpec) -> bool:
    return len(shape) == len(spec.shape) and all(
        not isinstance(d, int) or d == s for d, s in zip(spec.shape, shape))


def _split(array: np.ndarray, spec: TensorSpec, where: str) -> list[np.ndarray]:
    """One sample or a stack of samples of ``spec``, as a list of samples."""
    array = np.asarray(array)
    if _fits(array.shape, spec):
        return [array.astype(spec.dtype, copy=False)]
    if array.ndim == len(spec.shape) + 1 and _fits(array.shape[1:], spec):
        return [a.astype(spec.dtype, copy=False) for a in array]
    if spec.shape and spec.shape[0] == 1 and _fits((1,) + array.shape[1:], spec):
        # a batch-1 input given a batch of samples: one sample per row
        return [array[i:i + 1].astype(spec.dtype, copy=False) for i in range(len(array))]
    raise CompileError(f"calibration sample {where}: input {spec.name!r} expects shape "
                       f"{list(spec.shape)} (or a stack of them), got {list(array.shape)}")


def _zip_inputs(per_input: dict[str, list[np.ndarray]], where: str) -> list[dict]:
    counts = {name: len(v) for name, v in per_input.items()}
    if len(set(counts.values())) > 1:
        raise CompileError(f"calibration samples {where}: inputs hold different sample "
                           f"counts: {counts}")
    n = next(iter(counts.values()), 0)
    return [{name: v[i] for name, v in per_input.items()} for i in range(n)]


def _from_npz(path: Path, signature: ModelSignature) -> list[dict]:
    with np.load(path, allow_pickle=False) as data:
        missing = [s.name for s in signature.inputs if s.name not in data.files]
        if missing:
            raise CompileError(f"calibration file {path}: no array for input(s) "
                               f"{', '.join(missing)} (it has: {', '.join(data.files)})")
        return _zip_inputs({s.name: _split(data[s.name], s, f"{path}") for s in
                            signature.inputs}, str(path))


def _from_folder(path: Path, signature: ModelSignature) -> Iterator[dict]:
    if len(signature.inputs) == 1:
        spec = signature.inputs[0]
        files = sorted(path.glob("*.npy"))
        if not files:
            raise CompileError(f"calibration folder {path}: no .npy files")
        for file in files:
            for sample in _split(np.load(file, allow_pickle=False), spec, str(file)):
                yield {spec.name: sample}
        return
    folders = sorted(p for p in path.iterdir() if p.is_dir())
    if not folders:
        raise CompileError(f"calibration folder {path}: a model with several inputs needs one "
                           "subfolder per sample holding <input name>.npy")
    for folder in folders:
        feed = {}
        for spec in signature.inputs:
            file = folder / npy_file_name(spec.name)
            if not file.is_file():
                raise CompileError(f"calibration sample {folder}: missing {file.name} "
                                   f"for input {spec.name!r}")
            feed[spec.name] = _split(np.load(file, allow_pickle=False), spec, str(file))[0]
        yield feed


def _from_iterable(items: Iterable, signature: ModelSignature) -> Iterator[dict]:
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            if len(signature.inputs) != 1:
                raise CompileError(f"calibration sample {i}: a model with several inputs needs "
                                   "dicts of input name -> array")
            item = {signature.inputs[0].name: item}
        for spec in signature.inputs:
            if spec.name not in item:
                raise CompileError(f"calibration sample {i}: no array for input {spec.name!r}")
        yield {s.name: _split(item[s.name], s, f"#{i}")[0] for s in signature.inputs}


def read_samples(source, signature: ModelSignature) -> list[dict]:
    """Every sample of ``source`` as a feed. Kept as a list: calibration and the accuracy
    report both walk it (inputs are small next to the activations, which are not kept)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            samples = list(_from_folder(path, signature))
        elif path.suffix == ".npz" and path.is_file():
            samples = _from_npz(path, signature)
        else:
            raise CompileError(f"calibration samples {path}: expected a .npz file or a folder "
                               "of .npy files")
    elif isinstance(source, np.ndarray) and len(signature.inputs) == 1:
        spec = signature.inputs[0]
        samples = [{spec.name: a} for a in _split(source, spec, "array")]
    else:
        samples = list(_from_iterable(source, signature))
    if not samples:
        raise CompileError("calibration needs at least one sample")
    return samples
