"""``aotc serve`` settings: the models, their batching, the server's limits; from the command
line, or from a YAML/JSON file (read with yaml.safe_load: plain data, nothing executed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aotc.errors import AotcError

from .batcher import BatchSettings
from .core import DEFAULT_MAX_REQUEST_BYTES
from .pipeline import PipelineConfig, Step
from .repository import ModelConfig, RaySettings

_MODEL_KEYS = {"path", "name", "version", "batching", "key_file", "ray"}
_RAY_KEYS = {"replicas", "threads", "autoscaling"}
_BATCH_KEYS = {"max_batch", "max_delay_ms", "queue_limit"}
_TOP_KEYS = {"models", "pipelines", "max_request_bytes", "http_port", "grpc_port", "host",
             "batching"}
_PIPELINE_KEYS = {"name", "version", "inputs", "outputs", "steps"}
_STEP_KEYS = {"name", "model", "function", "inputs", "outputs"}


@dataclass
class ServeConfig:
    models: list[ModelConfig] = field(default_factory=list)
    host: str = "127.0.0.1"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    pipelines: list[PipelineConfig] = field(default_factory=list)


def read(path: str | Path, base: BatchSettings | None = None) -> ServeConfig:
    """The config file at ``path``; model paths are relative to its folder."""
    import yaml
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise AotcError(f"{path}: cannot read the serve config: {err}") from None
    if not isinstance(data, dict):
        raise AotcError(f"{path}: the serve config must be a mapping with a 'models' list")
    _only(data, _TOP_KEYS, str(path))
    defaults = _batching(data.get("batching") or {}, base or BatchSettings(), f"{path}: batching")
    config = ServeConfig(host=str(data.get("host", "127.0.0.1")),
                         http_port=data.get("http_port", 8000),
                         grpc_port=data.get("grpc_port", 8001),
                         max_request_bytes=int(data.get("max_request_bytes",
                                                        DEFAULT_MAX_REQUEST_BYTES)))
    entries = data.get("models")
    if not isinstance(entries, list) or not entries:
        raise AotcError(f"{path}: 'models' must be a non-empty list")
    for k, entry in enumerate(entries):
        where = f"{path}: models[{k}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict) or "path" not in entry:
            raise AotcError(f"{where}: needs a 'path'")
        _only(entry, _MODEL_KEYS, where)
        model_path = Path(entry["path"])
        if not model_path.is_absolute():
            model_path = path.parent / model_path
        config.models.append(ModelConfig(
            model_path, str(entry.get("name", "")), str(entry.get("version", "1")),
            _batching(entry.get("batching") or {}, defaults, f"{where}: batching"),
            path.parent / entry["key_file"] if entry.get("key_file") else None,
            _ray(entry.get("ray") or {}, f"{where}: ray")))
    for k, entry in enumerate(data.get("pipelines") or []):
        config.pipelines.append(_pipeline(entry, f"{path}: pipelines[{k}]"))
    return config


def _pipeline(entry, where: str) -> PipelineConfig:
    """``{name, inputs: [tensor...], outputs: [tensor...], steps: [{name, model | function,
    inputs: {port: tensor}, outputs: {port: tensor}}]}``."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise AotcError(f"{where}: a pipeline needs a 'name'")
    _only(entry, _PIPELINE_KEYS, where)
    names: dict[str, list[str]] = {}
    for key in ("inputs", "outputs"):
        value = entry.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise AotcError(f"{where}: '{key}' must be a non-empty list of tensor names")
        names[key] = value
    steps = []
    for k, step in enumerate(entry.get("steps") or []):
        here = f"{where}: steps[{k}]"
        if not isinstance(step, dict):
            raise AotcError(f"{here}: must be a mapping")
        _only(step, _STEP_KEYS, here)
        ports = {key: step.get(key) or {} for key in ("inputs", "outputs")}
        for key, value in ports.items():
            if not isinstance(value, dict) or not all(
                    isinstance(a, str) and isinstance(b, str) for a, b in value.items()):
                raise AotcError(f"{here}: '{key}' must map port names to tensor names")
        steps.append(Step(str(step.get("name") or step.get("model") or f"step{k}"),
                          ports["inputs"], ports["outputs"], step.get("model"),
                          step.get("function")))
    if not steps:
        raise AotcError(f"{where}: a pipeline needs 'steps'")
    return PipelineConfig(entry["name"], tuple(names["inputs"]), tuple(names["outputs"]),
                          tuple(steps), str(entry.get("version", "1")))


def _batching(data: dict, base: BatchSettings, where: str) -> BatchSettings:
    if not isinstance(data, dict):
        raise AotcError(f"{where}: must be a mapping of {sorted(_BATCH_KEYS)}")
    _only(data, _BATCH_KEYS, where)
    try:
        return BatchSettings(int(data.get("max_batch", base.max_batch)),
                             float(data.get("max_delay_ms", base.max_delay_ms)),
                             int(data.get("queue_limit", base.queue_limit)))
    except (TypeError, ValueError) as err:
        raise AotcError(f"{where}: {err}") from None


def _ray(data: dict, where: str) -> RaySettings:
    if not isinstance(data, dict):
        raise AotcError(f"{where}: must be a mapping of {sorted(_RAY_KEYS)}")
    _only(data, _RAY_KEYS, where)
    scaling = data.get("autoscaling") or {}
    if not isinstance(scaling, dict):
        raise AotcError(f"{where}: autoscaling must be a mapping (min_replicas, max_replicas, "
                        "target_ongoing_requests, ...)")
    if scaling and "replicas" in data:
        raise AotcError(f"{where}: give 'replicas' or 'autoscaling', not both")
    try:
        return RaySettings(int(data.get("replicas", 1)), int(data.get("threads", 1)),
                           tuple(sorted(scaling.items())))
    except (TypeError, ValueError) as err:
        raise AotcError(f"{where}: {err}") from None


def _only(data: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise AotcError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
