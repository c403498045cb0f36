"""The model signature: input and output names, shapes and dtypes.

It travels inside the compiled ``.so`` as JSON, so it is plain data here (no TVM types).
A dimension is an int, or a str naming a symbolic dimension (e.g. ``"batch"``) that is bound
when the model is called: every use of one name must get the same size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[Dim, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(data: dict) -> TensorSpec:
        return TensorSpec(data["name"], tuple(data["shape"]), data["dtype"])

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


@dataclass(frozen=True)
class ModelSignature:
    """``dim_ranges``: symbolic dim name -> (min, max) sizes the model accepts (given with
    --input-range, or needed by the graph: a sequence cut from a 512-row position table)."""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...] = field(default_factory=tuple)
    dim_ranges: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        data: dict = {"inputs": [t.to_json() for t in self.inputs],
                      "outputs": [t.to_json() for t in self.outputs]}
        if self.dim_ranges:
            data["dim_ranges"] = {k: list(v) for k, v in self.dim_ranges.items()}
        return data

    @staticmethod
    def from_json(data: dict) -> ModelSignature:
        return ModelSignature(tuple(TensorSpec.from_json(t) for t in data["inputs"]),
                              tuple(TensorSpec.from_json(t) for t in data["outputs"]),
                              {k: tuple(v) for k, v in data.get("dim_ranges", {}).items()})

    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    def dim_names(self) -> list[str]:
        """The symbolic dims of the inputs, in order of first use."""
        names: list[str] = []
        for spec in self.inputs:
            names += [d for d in spec.shape if isinstance(d, str) and d not in names]
        return names

    def __str__(self) -> str:
        ins = "\n".join(f"  in  {t}" for t in self.inputs)
        outs = "\n".join(f"  out {t}" for t in self.outputs)
        ranges = "".join(f"\n  dim {k}: {lo} to {hi}" for k, (lo, hi) in self.dim_ranges.items())
        return f"{ins}\n{outs}{ranges}"
