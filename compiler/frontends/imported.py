"""What a frontend hands to the pipeline."""

from __future__ import annotations

from dataclasses import dataclass

import tvm

from aotc.runtime.signature import ModelSignature, TensorSpec


@dataclass
class ImportedModel:
    mod: tvm.IRModule          # Relax module, weights bound as constants
    signature: ModelSignature  # user-facing names; outputs filled in by `with_outputs`
    source: str                # what the user gave, for messages


def output_specs(mod: tvm.IRModule, names: list[str]) -> tuple[TensorSpec, ...]:
    """Output shapes/dtypes as TVM inferred them for ``main``, named by the frontend."""
    ret = mod["main"].ret_ty
    fields = list(ret.fields) if hasattr(ret, "fields") else [ret]
    specs = []
    for i, info in enumerate(fields):
        name = names[i] if i < len(names) else f"output{i}"
        if info.shape is not None:
            shape = tuple(_dim(d) for d in info.shape.values)
        else:  # known only when the model runs (an If whose branches differ in shape)
            shape = ("?",) * max(info.ndim, 0)
        specs.append(TensorSpec(name, shape, str(info.dtype)))
    return tuple(specs)


def _dim(value) -> int | str:
    return int(value) if isinstance(value, (int, tvm.tirx.IntImm)) else str(value)
