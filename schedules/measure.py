"""Time one kernel as it would run in a model: built alone for the target, random float inputs
(zeros for integer ones, so that gathers stay in range), median of repeats. Used to compare a
tuned schedule with the default rules' one, both timed here in the same way."""

from __future__ import annotations

import numpy as np
import tvm


def kernel_seconds(func: tvm.tirx.PrimFunc, target: tvm.target.Target, repeat: int = 5,
                   min_repeat_ms: int = 20) -> float:
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    lib = tvm.compile(mod, target=target)
    lib = lib.jit() if hasattr(lib, "jit") else lib  # an Executable wraps the runtime module
    device = tvm.cpu()
    rng = np.random.default_rng(0)
    args = []
    for param in func.params:
        shape = [int(d) for d in param.ty.shape]
        dtype = str(param.ty.dtype)
        data = (rng.standard_normal(shape).astype(dtype) if dtype.startswith("float")
                else np.zeros(shape, dtype))
        args.append(tvm.runtime.tensor(data, device))
    timer = lib.time_evaluator("main", device, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return float(np.median(timer(*args).results))
