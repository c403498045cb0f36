"""The Open Inference Protocol's gRPC service (package ``inference``, service
``GRPCInferenceService``: the method paths every KServe v2 / Triton client calls).

The messages are described here as data and built in a descriptor pool of their own, not in
protobuf's default pool: a process that also imports a client library defining the same
``inference.*`` messages (tritonclient) would otherwise fail on duplicate symbols. Handlers are
registered with grpc's generic handler API, so no generated code is needed."""

from __future__ import annotations

import time
from typing import Any

import grpc
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from .core import Server, classify
from .tensors import BadRequest, datatype_of, from_bytes, numpy_dtype, to_bytes

SERVICE = "inference.GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {"bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES,
          "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32,
          "uint64": _F.TYPE_UINT64, "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE}

# message -> [(field, number, type, repeated)]; a type that is not a scalar names a message,
# "map:X" a map<string, X>; "oneof:NAME" fields share one oneof
_PARAMS = ("parameters", "map:InferParameter")
MESSAGES: dict[str, list[tuple]] = {
    "ServerLiveRequest": [], "ServerLiveResponse": [("live", 1, "bool", False)],
    "ServerReadyRequest": [], "ServerReadyResponse": [("ready", 1, "bool", False)],
    "ModelReadyRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelReadyResponse": [("ready", 1, "bool", False)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [("name", 1, "string", False), ("version", 2, "string", False),
                               ("extensions", 3, "string", True)],
    "ModelMetadataRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelMetadataResponse.TensorMetadata": [("name", 1, "string", False),
                                             ("datatype", 2, "string", False),
                                             ("shape", 3, "int64", True)],
    "ModelMetadataResponse": [("name", 1, "string", False), ("versions", 2, "string", True),
                              ("platform", 3, "string", False),
                              ("inputs", 4, "ModelMetadataResponse.TensorMetadata", True),
                              ("outputs", 5, "ModelMetadataResponse.TensorMetadata", True)],
    "InferParameter": [("bool_param", 1, "bool", "oneof:parameter_choice"),
                       ("int64_param", 2, "int64", "oneof:parameter_choice"),
                       ("string_param", 3, "string", "oneof:parameter_choice"),
                       ("double_param", 4, "double", "oneof:parameter_choice"),
                       ("uint64_param", 5, "uint64", "oneof:parameter_choice")],
    "InferTensorContents": [("bool_contents", 1, "bool", True), ("int_contents", 2, "int32", True),
                            ("int64_contents", 3, "int64", True),
                            ("uint_contents", 4, "uint32", True),
                            ("uint64_contents", 5, "uint64", True),
                            ("fp32_contents", 6, "float", True),
                            ("fp64_contents", 7, "double", True),
                            ("bytes_contents", 8, "bytes", True)],
    "ModelInferRequest.InferInputTensor": [("name", 1, "string", False),
                                           ("datatype", 2, "string", False),
                                           ("shape", 3, "int64", True),
                                           (_PARAMS[0], 4, _PARAMS[1], True),
                                           ("contents", 5, "InferTensorContents", False)],
    "ModelInferRequest.InferRequestedOutputTensor": [("name", 1, "string", False),
                                                     (_PARAMS[0], 2, _PARAMS[1], True)],
    "ModelInferRequest": [("model_name", 1, "string", False),
                          ("model_version", 2, "string", False), ("id", 3, "string", False),
                          (_PARAMS[0], 4, _PARAMS[1], True),
                          ("inputs", 5, "ModelInferRequest.InferInputTensor", True),
                          ("outputs", 6, "ModelInferRequest.InferRequestedOutputTensor", True),
                          ("raw_input_contents", 7, "bytes", True)],
    "ModelInferResponse.InferOutputTensor": [("name", 1, "string", False),
                                             ("datatype", 2, "string", False),
                                             ("shape", 3, "int64", True),
                                             (_PARAMS[0], 4, _PARAMS[1], True),
                                             ("contents", 5, "InferTensorContents", False)],
    "ModelInferResponse": [("model_name", 1, "string", False),
                           ("model_version", 2, "string", False), ("id", 3, "string", False),
                           (_PARAMS[0], 4, _PARAMS[1], True),
                           ("outputs", 5, "ModelInferResponse.InferOutputTensor", True),
                           ("raw_output_contents", 6, "bytes", True)],
}
METHODS = {"ServerLive": "ServerLive", "ServerReady": "ServerReady",
           "ModelReady": "ModelReady", "ServerMetadata": "ServerMetadata",
           "ModelMetadata": "ModelMetadata", "ModelInfer": "ModelInfer"}

# typed contents field per datatype (requests may carry data there instead of raw bytes)
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents"}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="aotc/serve/inference.proto",
                                               package="inference", syntax="proto3")
    built: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name, fields in sorted(MESSAGES.items(), key=lambda kv: kv[0].count(".")):
        outer, _, inner = full_name.partition(".")
        if inner:
            message = built[outer].nested_type.add(name=inner)
        else:
            message = proto.message_type.add(name=outer)
        built[full_name] = message
        oneofs: dict[str, int] = {}
        for name, number, kind, repeated in fields:
            field = message.field.add(name=name, number=number, json_name=_camel(name))
            if kind.startswith("map:"):
                entry = message.nested_type.add(name=_camel(name, upper=True) + "Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_F.TYPE_STRING,
                                label=_F.LABEL_OPTIONAL, json_name="key")
                entry.field.add(name="value", number=2, type=_F.TYPE_MESSAGE,
                                label=_F.LABEL_OPTIONAL, json_name="value",
                                type_name=".inference." + kind[4:])
                field.type, field.type_name = _F.TYPE_MESSAGE, (
                    f".inference.{full_name}.{entry.name}")
                field.label = _F.LABEL_REPEATED
                continue
            if kind in _TYPES:
                field.type = _TYPES[kind]
            else:
                field.type, field.type_name = _F.TYPE_MESSAGE, ".inference." + kind
            field.label = _F.LABEL_REPEATED if repeated is True else _F.LABEL_OPTIONAL
            if isinstance(repeated, str) and repeated.startswith("oneof:"):
                group = repeated[len("oneof:"):]
                if group not in oneofs:
                    oneofs[group] = len(message.oneof_decl)
                    message.oneof_decl.add(name=group)
                field.oneof_index = oneofs[group]
    service = proto.service.add(name="GRPCInferenceService")
    for method in METHODS:
        request = "ModelInferRequest" if method == "ModelInfer" else f"{method}Request"
        response = "ModelInferResponse" if method == "ModelInfer" else f"{method}Response"
        service.method.add(name=method, input_type=".inference." + request,
                           output_type=".inference." + response)
    return proto


def _camel(name: str, upper: bool = False) -> str:
    parts = name.split("_")
    head = parts[0].capitalize() if upper else parts[0]
    return head + "".join(p.capitalize() for p in parts[1:])


def messages() -> dict[str, Any]:
    """Message classes by name (``ModelInferRequest``, ...), from a private pool."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName("inference." + name)) for name in MESSAGES if "." not in name}


def handler(server: Server) -> grpc.GenericRpcHandler:
    m = messages()

    def unary(method: str, fn):
        request = "ModelInferRequest" if method == "ModelInfer" else f"{method}Request"
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=m[request].FromString,
            response_serializer=lambda message: message.SerializeToString())

    async def server_live(_request, _context):
        return m["ServerLiveResponse"](live=True)

    async def server_ready(_request, _context):
        return m["ServerReadyResponse"](ready=server.ready)

    async def model_ready(request, context):
        try:
            server.repository.get(request.name, request.version)
        except Exception as err:  # noqa: BLE001
            await _abort(context, err)
        return m["ModelReadyResponse"](ready=server.ready)

    async def server_metadata(_request, _context):
        return m["ServerMetadataResponse"](**server.metadata())

    async def model_metadata(request, context):
        try:
            data = server.repository.get(request.name, request.version).metadata()
        except Exception as err:  # noqa: BLE001
            await _abort(context, err)
        return m["ModelMetadataResponse"](**data)

    async def model_infer(request, context):
        started = time.perf_counter()
        try:
            served = server.repository.get(request.model_name, request.model_version)
            inputs = _inputs(request)
            requested = [o.name for o in request.outputs] or None
            outputs = await server.infer(served, inputs, requested)
        except Exception as err:  # noqa: BLE001
            outcome, _, _ = classify(err)
            server.metrics.answered(request.model_name, "grpc", outcome, started,
                                    type(err).__name__, request.id)
            await _abort(context, err)
        response = m["ModelInferResponse"](model_name=served.name,
                                           model_version=served.version, id=request.id)
        for name, value in outputs.items():
            response.outputs.add(name=name, datatype=datatype_of(value.dtype.name),
                                 shape=list(value.shape))
            response.raw_output_contents.append(to_bytes(value))
        server.metrics.answered(served.name, "grpc", "ok", started, None, request.id)
        return response

    functions = {"ServerLive": server_live, "ServerReady": server_ready,
                 "ModelReady": model_ready, "ServerMetadata": server_metadata,
                 "ModelMetadata": model_metadata, "ModelInfer": model_infer}
    return grpc.method_handlers_generic_handler(
        SERVICE, {name: unary(name, fn) for name, fn in functions.items()})


def _inputs(request) -> dict[str, np.ndarray]:
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    inputs = {}
    for k, tensor in enumerate(request.inputs):
        if tensor.name in inputs:
            raise BadRequest(f"input {tensor.name!r} is given twice")
        if raw:
            inputs[tensor.name] = from_bytes(raw[k], tensor.datatype, list(tensor.shape),
                                             tensor.name)
            continue
        field = _CONTENTS.get(tensor.datatype)
        if field is None:
            raise BadRequest(f"input {tensor.name!r}: {tensor.datatype} data must come as "
                             "raw_input_contents")
        values = getattr(tensor.contents, field)
        dtype = numpy_dtype(tensor.datatype, tensor.name)
        array = np.asarray(values, dtype=dtype)
        shape = tuple(tensor.shape)
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise BadRequest(f"input {tensor.name!r}: {array.size} values; shape "
                             f"{list(shape)} needs {int(np.prod(shape, dtype=np.int64))}")
        inputs[tensor.name] = array.reshape(shape)
    return inputs


_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
           413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
           500: grpc.StatusCode.INTERNAL}


async def _abort(context, err: BaseException) -> None:
    _, status, retry_after = classify(err)
    if retry_after:
        context.set_trailing_metadata((("retry-after", str(retry_after)),))
    await context.abort(_STATUS[status], str(err))
