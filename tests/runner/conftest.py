"""Fixtures of the runner's tests: an echo server and a proxy network in front of it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from echo_proxy import CLIENT_TO_ECHO, EchoServer

from undertow.platform.proxy import ProxyNetwork


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def network(echo: EchoServer) -> Iterator[ProxyNetwork]:
    net = ProxyNetwork()
    net.add_link(CLIENT_TO_ECHO, echo.server_address[:2])
    yield net
    net.close()
