"""One PyTorch operator sample (torch's own OpInfo database) through aotc, compared with eager
torch on the same inputs. Runs inside a worker process (see run_suite.py --suite torch).

Each op's first float32 sample becomes a tiny nn.Module whose tensor arguments are its inputs
(non-tensor arguments are baked in), exported with torch.export and compiled through
``aotc.compile(module, example_inputs=...)`` -> ``.so`` -> ``aotc.load``. Statuses as in
node_cases.py; "unsupported" also covers samples torch.export itself cannot export and ops
whose results are random or undefined (rand*, dropout, empty*)."""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: fresh_runner

# Results that are random or uninitialized: no reference to compare with.
NONDETERMINISTIC = ("rand", "normal", "bernoulli", "multinomial", "dropout", "uniform",
                    "empty", "poisson", "exponential", "geometric", "cauchy", "log_normal")
RTOL, ATOL = 1e-4, 1e-5


def load_cases() -> dict:
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    cases = {}
    for info in op_db:
        if torch.float32 in info.supported_dtypes("cpu"):
            name = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
            cases[name] = info
    return cases


class _Op:
    """Builds the module for one sample: tensors become inputs, the rest constants."""

    def __init__(self, info, sample):
        import torch
        self.info, self.sample = info, sample
        flat, self.spec = torch.utils._pytree.tree_flatten(
            ([sample.input], list(sample.args), dict(sample.kwargs)))
        self.slots = [k for k, v in enumerate(flat) if isinstance(v, torch.Tensor)]
        self.flat = flat
        self.tensors = tuple(flat[k].detach().clone() for k in self.slots)

    def module(self):
        import torch
        op = self.info.op
        flat, spec, slots = list(self.flat), self.spec, self.slots

        class Sample(torch.nn.Module):
            def forward(self, *tensors):
                values = list(flat)
                for k, t in zip(slots, tensors):
                    values[k] = t
                inputs, args, kwargs = torch.utils._pytree.tree_unflatten(values, spec)
                return op(inputs[0], *args, **kwargs)
        return Sample().eval()


def run_case(info, _engine: str = "aotc") -> dict:
    import time
    start = time.perf_counter()
    status, reason = _run(info)
    return {"status": status, "reason": reason[:300],
            "seconds": round(time.perf_counter() - start, 2)}


def _first_sample(info):
    import torch
    for sample in info.sample_inputs("cpu", torch.float32, requires_grad=False):
        return sample
    return None


def _run(info) -> tuple[str, str]:
    import torch
    if any(word in info.name for word in NONDETERMINISTIC):
        return "unsupported", "random or uninitialized results: nothing to compare"
    sample = _first_sample(info)
    if sample is None:
        return "unsupported", "no float32 sample"
    op = _Op(info, sample)
    if not op.tensors:
        return "unsupported", "no tensor arguments (a factory op)"
    module = op.module()
    with torch.no_grad():
        try:
            expected = module(*op.tensors)
        except Exception as err:  # the sample itself is bad
            return "unsupported", f"eager torch failed: {type(err).__name__}"
    expected = _flatten(expected)
    if expected is None:
        return "unsupported", "non-tensor outputs"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.export.export(module, op.tensors)
    except Exception as err:
        return "unsupported", f"torch.export failed: {type(err).__name__}"
    return _compile_and_compare(module, op.tensors, expected)


def _flatten(value):
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return None


def _compile_and_compare(module, tensors, expected) -> tuple[str, str]:
    import aotc
    from aotc.errors import AotcError, UnsupportedModelError, meaningful_line
    with tempfile.TemporaryDirectory(prefix="aotc-torch-") as tmp:
        out = Path(tmp) / "case.so"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                aotc.compile(module, example_inputs=tensors, output=out)
        except UnsupportedModelError as err:
            return "unsupported", str(err).split(": ", 1)[-1]
        except Exception as err:  # every failure is a result
            kind = "" if isinstance(err, AotcError) else "(not an aotc error) "
            return "compile", f"{kind}{type(err).__name__}: {meaningful_line(err)}"
        import fresh_runner  # the model runs where TVM's compiler was never loaded
        try:
            got = list(fresh_runner.load(out)(*[t.numpy() for t in tensors]).values())
        except fresh_runner.RunnerDied as err:
            return "crash", str(err)
        except Exception as err:
            return "run", f"{type(err).__name__}: {meaningful_line(err)}"
    return _compare(got, [_to_numpy(e) for e in expected])


def _to_numpy(tensor):
    """numpy for a torch tensor; bfloat16 (which torch cannot hand to numpy) as ml_dtypes'."""
    import torch
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _compare(got, expected) -> tuple[str, str]:
    if len(got) != len(expected):
        return "mismatch", f"{len(got)} outputs, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        if g.dtype != e.dtype:
            return "mismatch", f"output {k}: dtype {g.dtype}, expected {e.dtype}"
        if g.shape != e.shape:
            return "mismatch", f"output {k}: shape {list(g.shape)}, expected {list(e.shape)}"
        if not np.allclose(g.astype(np.float64), e.astype(np.float64), rtol=RTOL, atol=ATOL,
                           equal_nan=True):
            diff = np.nanmax(np.abs(g.astype(np.float64) - e.astype(np.float64)))
            return "mismatch", f"output {k}: values differ (max |diff| {diff:.3g})"
    return "pass", ""
