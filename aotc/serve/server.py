"""Run the HTTP and gRPC front ends on one event loop until SIGTERM/SIGINT, then drain:
readiness goes false, the listeners stop taking connections, every request already received
is answered, and the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import uvicorn

from .config import ServeConfig
from .core import Server

# seconds a stopping server gives requests already received
DRAIN_SECONDS = 30


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: this server's loop takes SIGTERM/SIGINT and
    stops HTTP and gRPC together."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve_async(config: ServeConfig, announce=None) -> None:
    import grpc

    from . import grpc_service, http_app

    server = Server(config.models, config.max_request_bytes, config.pipelines)
    server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    grpc_server = None
    if config.grpc_port is not None:
        grpc_server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", -1)])
        grpc_server.add_generic_rpc_handlers((grpc_service.handler(server),))
        bound = grpc_server.add_insecure_port(f"{config.host}:{config.grpc_port}")
        if bound == 0:
            raise OSError(f"cannot listen for gRPC on {config.host}:{config.grpc_port}")
        await grpc_server.start()
    http_server = http_task = None
    if config.http_port is not None:
        http_server = _Uvicorn(uvicorn.Config(
            http_app.app(server), host=config.host, port=config.http_port, log_level="warning",
            access_log=False, timeout_graceful_shutdown=DRAIN_SECONDS, lifespan="off"))
        http_task = loop.create_task(http_server.serve())
        while not http_server.started and not http_task.done():
            await asyncio.sleep(0.01)
        if http_task.done():
            http_task.result()  # raises why it could not start
    if announce:
        announce(server)
    await stop.wait()
    server.ready = False
    if http_server is not None:
        http_server.should_exit = True
    if grpc_server is not None:
        await grpc_server.stop(DRAIN_SECONDS)
    if http_task is not None:
        await http_task
    await server.drain()


def serve(config: ServeConfig) -> None:
    def announce(server: Server) -> None:
        names = ", ".join(f"{n} (batch {s.batcher.settings.max_batch})"
                          for n, s in server.repository.models.items())
        where = [f"HTTP {config.host}:{config.http_port}" if config.http_port else "",
                 f"gRPC {config.host}:{config.grpc_port}" if config.grpc_port else ""]
        print(f"aotc serve: {names} on {', '.join(w for w in where if w)}; ready",
              file=sys.stderr, flush=True)
    asyncio.run(serve_async(config, announce))
