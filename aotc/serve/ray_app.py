"""The models and pipelines of a serve config as a Ray Serve application.

- One deployment per model (``aotc-model-<name>``): each replica loads the library once and
  runs aotc's batcher (length buckets, queue limit) on its own event loop. A replica uses
  ``threads`` cores: Ray reserves them (``num_cpus``) and the replica's TVM pool is sized to
  them (AOTC_NUM_THREADS); TVM's spinning pool would otherwise take every core in every
  replica, and replicas on one machine would spin against each other.
- One ingress deployment (``aotc-ingress``) behind Ray's HTTP proxy speaks the Open Inference
  Protocol with the same Starlette app as ``aotc serve`` and runs the pipelines; it calls the
  model replicas through deployment handles, so tensors cross processes through Ray's object
  store.

Per model, ``ray:`` in the config sets ``replicas`` or ``autoscaling`` (``min_replicas``,
``max_replicas``, ``target_ongoing_requests``) and ``threads``. Ray routes at most
``max_ongoing_requests`` (twice ``max_batch``, at least 4) to a replica at once and queues up
to the model's ``queue_limit`` more before answering 503."""

from __future__ import annotations

import logging
import signal
import sys

from aotc.errors import AotcError

from .batcher import Overloaded
from .config import ServeConfig
from .core import Server
from .repository import ModelConfig, RaySettings, ServedModel, model_metadata, signature_of

APP_NAME = "aotc"


class ModelReplica:
    """One replica of a served model."""

    def __init__(self, config: ModelConfig):
        self.served = ServedModel(config)
        self._started = False

    async def infer(self, inputs: dict) -> dict:
        if not self._started:  # the batcher's task lives on this replica's event loop
            self.served.batcher.start()
            self._started = True
        return await self.served.infer(inputs)


class RemoteModel:
    """A model served by its own deployment, as the ingress's repository sees it."""

    batcher = None  # batching happens in the replicas

    def __init__(self, config: ModelConfig, signature, platform: str, handle):
        self.config, self.signature, self.platform = config, signature, platform
        self.name, self.version = config.served_name, config.version
        self._handle = handle

    def metadata(self) -> dict:
        return model_metadata(self.name, self.version, self.signature, self.platform)

    def output_names(self) -> list[str]:
        return [s.name for s in self.signature.outputs]

    async def infer(self, inputs: dict) -> dict:
        from ray.serve.exceptions import BackPressureError
        try:
            return await self._handle.infer.remote(inputs)
        except BackPressureError:
            raise Overloaded(f"model {self.name!r}: every replica is busy and Ray's queue "
                             "is full", retry_after_s=1) from None


def _server(config: ServeConfig, signatures: dict, handles: dict) -> Server:
    """A Server whose models are the deployments behind ``handles`` (by served name)."""
    def remote(model: ModelConfig, _observe=None) -> RemoteModel:
        signature, platform = signatures[model.served_name]
        return RemoteModel(model, signature, platform, handles.get(model.served_name))
    return Server(config.models, config.max_request_bytes, config.pipelines, make_model=remote)


class Ingress:
    """The Open Inference Protocol over HTTP for every model and pipeline of the config."""

    def __init__(self, config: ServeConfig, signatures: dict, handles: dict):
        self.server = _server(config, signatures, handles)
        self.server.ready = True

    def __serve_build_asgi_app__(self):
        from . import http_app
        return http_app.app(self.server)


def _replica_options(model: ModelConfig) -> dict:
    settings: RaySettings = model.ray
    options: dict = {
        "name": f"aotc-model-{model.served_name}",
        "ray_actor_options": {"num_cpus": settings.threads, "runtime_env": {
            "env_vars": {"AOTC_NUM_THREADS": str(settings.threads)}}},
        "max_ongoing_requests": max(4, 2 * model.batching.max_batch),
        "max_queued_requests": model.batching.queue_limit,
    }
    if settings.autoscaling:
        options["autoscaling_config"] = dict(settings.autoscaling)
    else:
        options["num_replicas"] = settings.replicas
    return options


def application(config: ServeConfig):
    """The Ray Serve application (``serve.run`` deploys it). Signatures are read here, from
    each library's metadata, so that a config that names a missing model or a bad pipeline
    fails before anything is deployed."""
    from ray import serve
    signatures = {m.served_name: signature_of(m) for m in config.models}
    # the ingress checks the pipelines against the signatures as it starts; check them here
    _server(config, signatures, {})
    handles = {m.served_name: serve.deployment(**_replica_options(m))(ModelReplica).bind(m)
               for m in config.models}
    ingress = serve.deployment(name="aotc-ingress", ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=1000)(serve.ingress()(Ingress))
    return ingress.bind(config, signatures, handles)


def cores_needed(config: ServeConfig) -> int:
    """Cores the models' replicas reserve when each runs its fewest replicas."""
    def fewest(settings: RaySettings) -> int:
        return int(dict(settings.autoscaling).get("min_replicas", 1)) \
            if settings.autoscaling else settings.replicas
    return sum(fewest(m.ray) * m.ray.threads for m in config.models)


def serve_on_ray(config: ServeConfig, address: str | None = None,
                 cpus: int | None = None) -> None:
    """Deploy on the Ray cluster at ``address`` (default: start one on this machine with
    ``cpus`` logical cores, default its real ones), serve HTTP on ``config.host:
    config.http_port`` until SIGTERM/SIGINT, then shut Serve down (and a cluster it started).
    A config whose replicas need more cores than the cluster has is refused: Ray would wait
    for them forever."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise AotcError("--ray needs Ray Serve: pip install 'aotc[ray]'") from None
    if config.http_port is None:
        raise AotcError("Ray Serve serves HTTP: give an HTTP port")
    app = application(config)
    ray.init(address=address, num_cpus=cpus if address is None else None,
             include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    # after ray.init, which installs its own SIGTERM handler (sys.exit): a signal now ends
    # the wait, or an unfinished deployment, and Serve is shut down in order
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:
        have, need = int(ray.cluster_resources().get("CPU", 0)), cores_needed(config)
        if need > have:
            raise AotcError(f"the models' replicas reserve {need} cores (replicas x threads) "
                            f"and the Ray cluster has {have}: lower replicas or threads"
                            + ("" if address else ", or give --ray-cpus"))
        serve.start(http_options={"host": config.host, "port": config.http_port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        for name, deployment in serve.status().applications[APP_NAME].deployments.items():
            states = ", ".join(f"{n} {state}" for state, n in deployment.replica_states.items())
            print(f"  {name}: {states}", file=sys.stderr, flush=True)
        names = ", ".join(f"{m.served_name} ({m.ray.describe()})" for m in config.models)
        print(f"aotc serve --ray: {names} on HTTP {config.host}:{config.http_port}; ready",
              file=sys.stderr, flush=True)
        while True:
            signal.pause()
    except _Stopped:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # the shutdown runs to its end
        serve.shutdown()
        ray.shutdown()


class _Stopped(Exception):
    pass


def _stop(_signum, _frame):
    raise _Stopped
