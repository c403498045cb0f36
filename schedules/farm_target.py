"""A device farm as the tuner sees it: a TVM RPC tracker and the servers registered under a
key. Every step has a client-side deadline: TVM's own client retries a dead tracker for 60 s
and blocks forever on a frozen one, so the tracker is reached with plain sockets first and
its answers are read with a timeout."""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass

from aotc.errors import FarmError, TrackerUnreachable

# TVM's tracker protocol (tvm/rpc/base.py): magic, then JSON messages with a length prefix.
_TRACKER_MAGIC = 0x2F271
_SUMMARY = 6   # TrackerCode.SUMMARY
_SUCCESS = 0


__all__ = ["Farm", "FarmError", "TrackerUnreachable", "servers_of", "summary"]


@dataclass(frozen=True)
class Farm:
    host: str
    port: int
    key: str
    connect_timeout_s: float = 3.0
    session_timeout_s: float = 60.0  # a candidate's whole remote measurement

    @staticmethod
    def parse(address: str, key: str, **kwargs) -> Farm:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise FarmError(f"--rpc {address!r}: expected HOST:PORT of a TVM RPC tracker")
        return Farm(host, int(port), key, **kwargs)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def summary(host: str, port: int, timeout_s: float = 3.0) -> dict:
    """The tracker's summary ({"queue_info": {key: {"free", "pending"}}, "server_info": [...]}),
    or FarmError within ``timeout_s`` when the tracker is down or does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack("<i", _TRACKER_MAGIC))
            if struct.unpack("<i", _receive(sock, 4))[0] != _TRACKER_MAGIC:
                raise TrackerUnreachable(f"{host}:{port} is not a TVM RPC tracker")
            _send_json(sock, [_SUMMARY])
            code, data = _receive_json(sock)
    except (TimeoutError, OSError) as err:
        raise TrackerUnreachable(f"tracker {host}:{port} is not reachable: {err}") from None
    if code != _SUCCESS:
        raise FarmError(f"tracker {host}:{port} refused the summary request")
    return data


def servers_of(farm: Farm) -> int:
    """How many servers the tracker has for ``farm.key`` (free or busy); FarmError if none."""
    info = summary(farm.host, farm.port, farm.connect_timeout_s)
    keys = sorted(info.get("queue_info", {}))
    count = sum(1 for s in info.get("server_info", []) if s.get("key",
                                                                "").split(":")[-1] == farm.key)
    if count == 0:
        raise FarmError(f"no server with key {farm.key!r} is registered at tracker {farm.address} "
                        f"(keys there: {', '.join(keys) or 'none'})")
    return count


def _send_json(sock: socket.socket, value) -> None:
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("<i", len(data)) + data)


def _receive_json(sock: socket.socket):
    size = struct.unpack("<i", _receive(sock, 4))[0]
    return json.loads(_receive(sock, size).decode())


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data
