"""The models a server holds: each loaded once, with its batcher and its protocol metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aotc.errors import AotcError

from .batcher import Batcher, BatchSettings
from .tensors import datatype_of


class ModelNotFound(AotcError):
    """Answered 404."""


@dataclass(frozen=True)
class RaySettings:
    """How ``aotc serve --ray`` deploys a model: ``replicas``, or ``autoscaling`` (Ray Serve's
    autoscaling config: min_replicas, max_replicas, target_ongoing_requests, ...), and the
    cores (``threads``) each replica reserves and runs on."""
    replicas: int = 1
    threads: int = 1
    autoscaling: tuple = ()  # (key, value) pairs, frozen

    def __post_init__(self):
        if self.replicas < 1 or self.threads < 1:
            raise ValueError(f"ray settings out of range: {self}")

    def describe(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''} each"
        if self.autoscaling:
            scale = dict(self.autoscaling)
            return (f"autoscaling {scale.get('min_replicas', 1)}-"
                    f"{scale.get('max_replicas', 1)} replicas, {threads}")
        return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}, {threads}"


@dataclass(frozen=True)
class ModelConfig:
    """One served model: ``name`` (default: the file's stem), ``version`` (the protocol's
    version string), its batching settings and, under ``--ray``, its deployment settings."""
    path: Path
    name: str = ""
    version: str = "1"
    batching: BatchSettings = field(default_factory=BatchSettings)
    key_file: Path | None = None  # an encrypted library's key
    ray: RaySettings = field(default_factory=RaySettings)

    @property
    def served_name(self) -> str:
        return self.name or self.path.stem


class OnnxRuntimeModel:
    """An ``.onnx`` file run by onnxruntime behind the same server: the baseline that
    bench/serve_load.py measures aotc against. It has no buckets, so its batches hold only
    requests of equal sizes."""

    _DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64",
               "tensor(float16)": "float16", "tensor(int64)": "int64", "tensor(int32)": "int32",
               "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool"}

    def __init__(self, path: Path):
        import onnxruntime as ort

        from aotc.runtime.signature import ModelSignature, TensorSpec
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def specs(values, side: str):
            out = []
            for k, value in enumerate(values):
                if value.type not in self._DTYPES:
                    raise AotcError(f"{path}: {side} {value.name!r} is a {value.type}")
                shape = tuple(d if isinstance(d, (int, str)) else f"{side}{k}_dim{j}"
                              for j, d in enumerate(value.shape))
                out.append(TensorSpec(value.name, shape, self._DTYPES[value.type]))
            return tuple(out)
        self.signature = ModelSignature(specs(self.session.get_inputs(), "input"),
                                        specs(self.session.get_outputs(), "output"))
        self.metadata: dict = {}

    def run(self, inputs: dict) -> dict:
        names = [o.name for o in self.signature.outputs]
        return dict(zip(names, self.session.run(None, inputs)))


def model_metadata(name: str, version: str, signature, platform: str) -> dict:
    """The protocol's model metadata: a symbolic dim is -1."""
    def tensors(specs):
        return [{"name": s.name, "datatype": datatype_of(s.dtype),
                 "shape": [d if isinstance(d, int) else -1 for d in s.shape]}
                for s in specs]
    return {"name": name, "versions": [version], "platform": platform,
            "inputs": tensors(signature.inputs), "outputs": tensors(signature.outputs)}


def signature_of(config: ModelConfig) -> tuple:
    """(signature, platform) of a served model's file, without loading a library."""
    from aotc.runtime import encrypted
    from aotc.runtime.signature import ModelSignature
    if config.path.suffix == ".onnx":
        return OnnxRuntimeModel(config.path).signature, "onnxruntime_onnx"
    meta = encrypted.read_metadata(config.path, config.key_file)
    return ModelSignature.from_json(meta["signature"]), "aotc_tvm"


class ServedModel:
    def __init__(self, config: ModelConfig, observe=None):
        from aotc.runtime import load
        self.config = config
        self.name, self.version = config.served_name, config.version
        self.model = OnnxRuntimeModel(config.path) if config.path.suffix == ".onnx" \
            else load(config.path, key_file=config.key_file)
        self.signature = self.model.signature
        self.platform = "onnxruntime_onnx" if isinstance(self.model, OnnxRuntimeModel) \
            else "aotc_tvm"
        self.batcher = Batcher(self.name, self.model, config.batching, observe)

    def metadata(self) -> dict:
        return model_metadata(self.name, self.version, self.signature, self.platform)

    def output_names(self) -> list[str]:
        return [s.name for s in self.signature.outputs]

    async def infer(self, inputs: dict):
        return await self.batcher.infer(inputs)


class Repository:
    """The served models and pipelines, by name (one namespace: a pipeline is an endpoint).
    ``make_model(config, observe)`` makes each served model (default: loaded here)."""

    def __init__(self, configs: list[ModelConfig], observe=None, pipelines=(),
                 observe_stage=None, make_model=ServedModel):
        from .pipeline import ServedPipeline
        names = [c.served_name for c in configs] + [p.name for p in pipelines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise AotcError(f"two models or pipelines are served as {dupes}: give them "
                            "distinct names")
        if not configs:
            raise AotcError("no model to serve")
        self.models = {c.served_name: make_model(c, observe) for c in configs}
        self.pipelines = {p.name: ServedPipeline(p, self.models, observe_stage)
                          for p in pipelines}

    def get(self, name: str, version: str | None = None):
        served = self.models.get(name) or self.pipelines.get(name)
        if served is None:
            raise ModelNotFound(f"no model named {name!r}; this server has "
                                f"{sorted([*self.models, *self.pipelines])}")
        if version not in (None, "", served.version):
            raise ModelNotFound(f"model {name!r} has no version {version!r}; it has "
                                f"{served.version!r}")
        return served
