"""Making inputs for a signature: random ones for `aotc run` / `aotc bench`, or from .npy."""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError

from .signature import ModelSignature


def random_inputs(signature: ModelSignature, seed: int = 0, dim_default: int = 1,
                  dims: dict[str, int] | None = None) -> dict:
    """Random arrays matching the signature; symbolic dims get their size in ``dims``, else
    ``dim_default``. Integer inputs (token ids, indices) are drawn from [0, 2): the only range
    valid for any model."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    feed = {}
    for spec in signature.inputs:
        shape = tuple(d if isinstance(d, int) else dims.get(d, dim_default) for d in spec.shape)
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feed[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return feed


def load_npy_inputs(items) -> dict:
    """['name=file.npy', ...] -> {name: array}."""
    feed = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise AotcError(f"bad --input {item!r}: expected NAME=FILE.npy")
        try:
            feed[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise AotcError(f"--input {name}: cannot read {path}: {err}") from None
    return feed


def npy_file_name(name: str) -> str:
    """The .npy file ``--output-dir`` writes for a tensor (``aotc run`` and the C++ runner,
    whose Safe() in runtime/cpp/tools/aotc_run.cc does the same): characters other than
    letters, digits and -_. become _ (ONNX names hold / and :)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) + ".npy"
