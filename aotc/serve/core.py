"""What the HTTP and gRPC front ends share: the models, the metrics, readiness, one inference
call and how each failure is answered."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import numpy as np

from aotc.errors import InputMismatchError

from .batcher import Overloaded
from .metrics import Metrics
from .repository import ModelConfig, ModelNotFound, Repository, ServedModel
from .tensors import BadRequest, PayloadTooLarge

DEFAULT_MAX_REQUEST_BYTES = 64 << 20


class Server:
    """The served models and their state; the front ends call ``infer``."""

    def __init__(self, models: list[ModelConfig],
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, pipelines=(),
                 make_model=ServedModel):
        self.metrics = Metrics()
        self.repository = Repository(models, self._observe, pipelines, self._observe_stage,
                                     make_model)
        self.max_request_bytes = max_request_bytes
        self.ready = False

    def _observe(self, kind: str, model: str, value: float) -> None:
        {"queue": self.metrics.queue, "compute": self.metrics.compute,
         "batch": self.metrics.batch}[kind].labels(model).observe(value)

    def _observe_stage(self, pipeline: str, stage: str, seconds: float) -> None:
        self.metrics.stage.labels(pipeline, stage).observe(seconds)

    def start(self) -> None:
        """Start the batchers (inside the running event loop)."""
        for served in self.repository.models.values():
            if served.batcher is not None:
                served.batcher.start()
        self.ready = True

    async def drain(self) -> None:
        """Stop taking requests and answer every queued one."""
        self.ready = False
        for served in self.repository.models.values():
            if served.batcher is not None:
                await served.batcher.close()

    def metadata(self) -> dict:
        try:
            own = version("aotc")
        except PackageNotFoundError:
            own = "unknown"
        return {"name": "aotc", "version": own, "extensions": ["binary_tensor_data"]}

    async def infer(self, served, inputs: dict[str, np.ndarray],
                    requested: list[str] | None = None) -> dict[str, np.ndarray]:
        outputs_known = served.output_names()
        if requested is not None:
            unknown = [n for n in requested if n not in outputs_known]
            if unknown:
                raise BadRequest(f"model {served.name!r} has no output(s) {unknown}; its "
                                 f"outputs are {outputs_known}")
        gauge = self.metrics.inflight.labels(served.name)
        gauge.inc()
        batcher = getattr(served, "batcher", None)
        if batcher is not None:
            self.metrics.queued.labels(served.name).set(batcher.queued)
        try:
            outputs = await served.infer(inputs)
        finally:
            gauge.dec()
        if requested is not None:
            outputs = {n: outputs[n] for n in requested}
        return outputs


def classify(err: BaseException) -> tuple[str, int, int]:
    """(outcome label, HTTP status, Retry-After seconds or 0) for a failed request."""
    if isinstance(err, Overloaded):
        return "overloaded", 503, err.retry_after_s
    if isinstance(err, ModelNotFound):
        return "not_found", 404, 0
    if isinstance(err, PayloadTooLarge):
        return "too_large", 413, 0
    if isinstance(err, (BadRequest, InputMismatchError)):
        return "bad_request", 400, 0
    return "error", 500, 0
