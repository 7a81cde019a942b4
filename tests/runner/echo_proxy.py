"""An echo server behind a `ProxyNetwork` link, for the proxy tests (the fixtures that use
it are in this folder's conftest.py)."""

from __future__ import annotations

import socket
import socketserver
import threading

from undertow.platform.base import Link
from undertow.platform.proxy import ProxyNetwork

CLIENT_TO_ECHO = Link("client", "echo")
ECHO_TO_CLIENT = Link("echo", "client")
QUIET_S = 0.4  # how long "nothing arrives" is watched for


class EchoServer(socketserver.ThreadingTCPServer):
    """Echoes every byte; closes the connection when it receives b"close"."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), EchoHandler)
        self.received = 0
        self.connections = 0
        self.lock = threading.Lock()


class EchoHandler(socketserver.BaseRequestHandler):
    server: EchoServer

    def handle(self) -> None:
        with self.server.lock:
            self.server.connections += 1
        while data := self.request.recv(65536):
            with self.server.lock:
                self.server.received += len(data)
            if data.endswith(b"close"):
                return
            self.request.sendall(data)


def connect(net: ProxyNetwork) -> socket.socket:
    sock = socket.create_connection(net.address(CLIENT_TO_ECHO), timeout=5)
    sock.settimeout(5)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"connection closed after {len(data)} of {size} bytes"
        data += chunk
    return data
