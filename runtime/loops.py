"""``aotc.run_loop``: the loop that runs an ONNX ``Loop``'s step function (see
compiler/frontends/onnx_loop.py, which emits the call).

Called by the VM with its context, the step function as a closure, the numbers of carried
values and of scan outputs, then the trip count, the initial condition, the carried values,
one empty tensor per scan output (of the element's shape, returned as is when no step runs)
and the tensors the body reads from outside. Runs ``while i < trip and cond``; the carried
values go from one step to the next as the VM returned them (no copy), the scan elements are
stacked once at the end. Stacking is on the host: Loop runs on CPU targets."""

from __future__ import annotations

import numpy as np

from .buffers import aligned, aligned_empty

RUN_LOOP = "aotc.run_loop"
_REGISTERED: set[str] = set()


def register(ffi) -> None:
    """Registers RUN_LOOP in this process (once; libtvm_runtime must be loaded)."""
    if RUN_LOOP in _REGISTERED:
        return
    invoke = ffi.get_global_func("vm.builtin.invoke_closure")

    def run_loop(vm, step, n_carried, n_scan, trip, cond, *rest):
        n_carried, n_scan = int(n_carried), int(n_scan)
        carried = list(rest[:n_carried])
        empties = rest[n_carried:n_carried + n_scan]
        captured = rest[n_carried + n_scan:]
        elements: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
        count, go, i = int(np.from_dlpack(trip)), bool(np.from_dlpack(cond)), 0
        while go and i < count:
            out = invoke(vm, step, _scalar(ffi, i, np.int64), _scalar(ffi, go, np.bool_),
                         *carried, *captured)
            go = bool(np.from_dlpack(out[0]))
            carried = list(out[1:1 + n_carried])
            for k in range(n_scan):  # copied out: the VM's pooled block goes back to it
                elements[k].append(np.from_dlpack(out[1 + n_carried + k]).copy())
            i += 1
        stacked = [empty if not parts else ffi.from_dlpack(_aligned_stack(parts))
                   for empty, parts in zip(empties, elements)]
        return tuple(carried + stacked)

    ffi.register_global_func(RUN_LOOP, run_loop, override=True)
    _REGISTERED.add(RUN_LOOP)


def _scalar(ffi, value, dtype):
    return ffi.from_dlpack(aligned(np.array(value, dtype)))


def _aligned_stack(parts: list[np.ndarray]) -> np.ndarray:
    """np.stack into a 64-byte-aligned buffer (the kernels' loads assume it)."""
    out = aligned_empty((len(parts), *parts[0].shape), parts[0].dtype)
    np.stack(parts, out=out)
    return out
