"""``python -m aotc.farm_server``: TVM's Python RPC server with a deadline on the handshake.

Why: TVM's server accepts one connection at a time and reads its handshake with no timeout,
so one client that connects and sends nothing held the server for as long as it stayed
connected, while the tracker listed the server as free (a real session waited 40 s behind a
45 s stall).

How: inside the server's worker process (``server_init_callback``, which TVM runs there before
it serves), every accepted connection gets a ``HANDSHAKE_S`` socket timeout, lifted again
before the session starts (a session may be idle for long: its client compiles between
requests). A client silent past the deadline is dropped; TVM's loop then re-registers with the
tracker, as after any socket error. Arguments are those of ``tvm.exec.rpc_server``."""

from __future__ import annotations

import argparse

HANDSHAKE_S = 10.0


class _Deadline:
    """The listening socket, with a timeout on every connection it accepts."""

    def __init__(self, sock):
        self._sock = sock

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept(self):
        conn, addr = self._sock.accept()
        conn.settimeout(HANDSHAKE_S)
        return conn, addr


def install_deadline() -> None:
    """Wrap tvm.rpc.server's listen loop and session start (in the process that serves)."""
    import tvm.rpc.server as server
    listen, serving = server._listen_loop, server._serving

    def listen_with_deadline(sock, *args):
        return listen(_Deadline(sock), *args)

    def serving_without_deadline(sock, *args):
        sock.settimeout(None)
        return serving(sock, *args)

    server._listen_loop = listen_with_deadline
    server._serving = serving_without_deadline


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9090)
    parser.add_argument("--port-end", type=int, default=9199)
    parser.add_argument("--tracker", required=True, help="HOST:PORT")
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    from aotc.runtime._tvm_runtime import import_hiding_torch
    import_hiding_torch("tvm")  # a server never uses torch (200 MB; see farm_tracker.py)
    from tvm import rpc

    from aotc.popen_worker import start_tvm_workers_here
    start_tvm_workers_here()  # the serving process and its sessions without torch too
    host, _, port = args.tracker.rpartition(":")
    server = rpc.Server(args.host, args.port, args.port_end, key=args.key,
                        tracker_addr=(host, int(port)), server_init_callback=install_deadline)
    server.proc.join()


if __name__ == "__main__":
    main()
