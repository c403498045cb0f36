"""``aotc serve``: compiled models behind the Open Inference Protocol (KServe v2) over HTTP and
gRPC, with dynamic batching, Prometheus metrics and structured access logs."""

from .batcher import BatchSettings
from .config import ServeConfig
from .repository import ModelConfig, RaySettings
from .server import serve, serve_async

__all__ = ["BatchSettings", "ModelConfig", "RaySettings", "ServeConfig", "serve", "serve_async"]
