"""The Open Inference Protocol (KServe v2) over HTTP, as a Starlette app, with the binary
tensor data extension (``Inference-Header-Content-Length``: a JSON header, then the tensors'
raw bytes) that tritonclient uses by default."""

from __future__ import annotations

import json
import time

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .core import Server, classify
from .tensors import (
    BadRequest,
    PayloadTooLarge,
    datatype_of,
    from_bytes,
    from_json,
    to_bytes,
    to_json_data,
)

HEADER_LENGTH = "Inference-Header-Content-Length"


def app(server: Server) -> Starlette:
    async def live(_request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(_request: Request) -> Response:
        return JSONResponse({"ready": server.ready}, status_code=200 if server.ready else 503)

    async def server_metadata(_request: Request) -> Response:
        return JSONResponse(server.metadata())

    async def model_metadata(request: Request) -> Response:
        try:
            served = server.repository.get(request.path_params["name"],
                                           request.path_params.get("version"))
        except Exception as err:  # noqa: BLE001
            return _error(err)
        return JSONResponse(served.metadata())

    async def model_ready(request: Request) -> Response:
        try:
            server.repository.get(request.path_params["name"], request.path_params.get("version"))
        except Exception as err:  # noqa: BLE001
            return _error(err)
        return JSONResponse({"name": request.path_params["name"], "ready": server.ready},
                            status_code=200 if server.ready else 503)

    async def infer(request: Request) -> Response:
        started = time.perf_counter()
        name = request.path_params["name"]
        request_id = ""
        try:
            served = server.repository.get(name, request.path_params.get("version"))
            body = await _body(request, server.max_request_bytes)
            header, inputs = _decode(body, request.headers.get(HEADER_LENGTH))
            request_id = str(header.get("id", ""))
            outputs = await server.infer(served, inputs, _requested(header))
            response = _encode(served, outputs, header)
        except Exception as err:  # noqa: BLE001 - every failure is an answer
            outcome, status, _ = classify(err)
            server.metrics.answered(name, "http", outcome, started, type(err).__name__,
                                    request_id)
            return _error(err, status)
        server.metrics.answered(name, "http", "ok", started, None, request_id)
        return response

    async def metrics(_request: Request) -> Response:
        return Response(server.metrics.exposition(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    routes = [Route("/v2/health/live", live), Route("/v2/health/ready", ready),
              Route("/v2", server_metadata), Route("/metrics", metrics)]
    for prefix in (model, versioned):
        routes += [Route(prefix, model_metadata), Route(prefix + "/ready", model_ready),
                   Route(prefix + "/infer", infer, methods=["POST"])]
    return Starlette(routes=routes)


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes; this server takes at most "
                              f"{limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body over {limit} bytes; this server takes at "
                                  f"most {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(body: bytes, header_length: str | None) -> tuple[dict, dict[str, np.ndarray]]:
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadRequest(f"{HEADER_LENGTH} {header_length!r} does not fit a body of "
                             f"{len(body)} bytes")
        cut = int(header_length)
        text, binary = body[:cut], memoryview(body)[cut:]
    else:
        text, binary = body, memoryview(b"")
    try:
        header = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequest(f"request header is not JSON: {err}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise BadRequest("request JSON must be an object with an 'inputs' list")
    inputs, offset = {}, 0
    for tensor in header["inputs"]:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise BadRequest("every input needs a 'name'")
        name = tensor["name"]
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        datatype, shape = tensor.get("datatype"), tensor.get("shape")
        if not isinstance(datatype, str):
            raise BadRequest(f"input {name!r} needs a 'datatype'")
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise BadRequest(f"input {name!r}: binary_data_size {size!r} runs past the "
                                 f"{len(binary)} bytes of binary data")
            inputs[name] = from_bytes(binary[offset:offset + size], datatype, shape, name)
            offset += size
        elif "data" in tensor:
            inputs[name] = from_json(tensor["data"], datatype, shape, name)
        else:
            raise BadRequest(f"input {name!r} has neither 'data' nor binary_data_size")
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data belong to no input")
    return header, inputs


def _requested(header: dict) -> list[str] | None:
    outputs = header.get("outputs")
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs):
        raise BadRequest("'outputs' must be a list of objects with a 'name'")
    return [o["name"] for o in outputs]


def _encode(served, outputs: dict[str, np.ndarray], header: dict) -> Response:
    binary_all = bool((header.get("parameters") or {}).get("binary_data_output", False))
    wants_binary = {o["name"]: bool((o.get("parameters") or {}).get("binary_data", binary_all))
                    for o in header.get("outputs") or []}
    entries, blobs = [], []
    for name, value in outputs.items():
        entry: dict[str, object] = {"name": name, "datatype": datatype_of(value.dtype.name),
                 "shape": list(value.shape)}
        if wants_binary.get(name, binary_all):
            blob = to_bytes(value)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = to_json_data(value)
        entries.append(entry)
    body: dict[str, object] = {"model_name": served.name, "model_version": served.version,
                               "outputs": entries}
    if header.get("id"):
        body["id"] = header["id"]
    text = json.dumps(body, separators=(",", ":")).encode()
    if not blobs:
        return Response(text, media_type="application/json")
    return Response(b"".join([text, *blobs]), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(text))})


def _error(err: BaseException, status: int | None = None) -> Response:
    _, code, retry_after = classify(err)
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return JSONResponse({"error": str(err)}, status_code=status or code, headers=headers)
