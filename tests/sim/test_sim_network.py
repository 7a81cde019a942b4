"""The virtual clock, processes and network: the TCP behaviour Kafka clients and brokers
see, which the simulation's verdicts rest on."""

from __future__ import annotations

from typing import Any

import pytest

from undertow.platform.errors import PlatformError
from undertow.sim.loop import SimLoop
from undertow.sim.network import NetworkError, VirtualNetwork
from undertow.sim.process import Process

SERVER = ("server", 1)


def _world() -> tuple[SimLoop, VirtualNetwork, Process, Process]:
    loop = SimLoop()
    network = VirtualNetwork(loop, latency_ms=1.0)
    client, server = Process(loop, "client", 1), Process(loop, "server", 1)
    network.listen(SERVER, "server", server, lambda message, reply: reply(("echo", message)))
    return loop, network, client, server


def _ask(loop: SimLoop, network: VirtualNetwork, client: Process,
         timeout_ms: float = 100.0) -> list[tuple[Any, NetworkError | None, float]]:
    answers: list[tuple[Any, NetworkError | None, float]] = []
    network.request(client, "client", SERVER, "hi", lambda a, e: answers.append(
        (a, e, loop.now_ms())), timeout_ms)
    loop.run_until(loop.now_ms() + 1000)
    return answers


def test_an_answer_takes_a_round_trip() -> None:
    loop, network, client, _ = _world()
    assert _ask(loop, network, client) == [(("echo", "hi"), None, 2.0)]


def test_a_blocked_link_drops_the_request_and_the_client_times_out() -> None:
    loop, network, client, _ = _world()
    network.blocked.add(("client", "server"))
    [(answer, error, at)] = _ask(loop, network, client, timeout_ms=100)
    assert answer is None and error is not None and error.reason == "timeout" and at == 100


def test_a_dead_process_refuses_and_a_dying_one_resets() -> None:
    loop, network, client, server = _world()
    server.exit()
    [(_, error, at)] = _ask(loop, network, client)
    assert error is not None and error.reason == "refused" and at == 1.0  # one latency
    loop, network, client, server = _world()
    network.listen(SERVER, "server", server, lambda _m, _reply: None)  # never answers
    network.request(client, "client", SERVER, "hi", lambda a, e: answers.append(e), 500)
    answers: list[NetworkError | None] = []
    loop.run_until(10)
    server.exit()
    loop.run_until(20)
    assert [e.reason for e in answers if e] == ["reset"]


def test_a_paused_process_answers_after_it_resumes() -> None:
    loop, network, client, server = _world()
    server.pause()
    answers: list[float] = []
    network.request(client, "client", SERVER, "hi", lambda a, e: answers.append(loop.now_ms()),
                    10_000)
    loop.run_until(500)
    assert answers == []
    server.resume()
    loop.run_until(1000)
    assert answers == [501.0]  # served at the resume, one latency back


def test_a_nested_wait_moves_time_forward_only() -> None:
    loop = SimLoop()
    seen: list[float] = []

    def inner() -> None:
        loop.wait_until(lambda: bool(seen), 1000, "the tick")
        seen.append(loop.now_ms())

    loop.call_later(10, inner)
    loop.call_later(50, lambda: seen.append(loop.now_ms()))
    loop.run_until(20)
    assert seen == [50.0, 50.0] and loop.now_ms() == 50.0
    with pytest.raises(PlatformError, match="the never"):
        loop.wait_until(lambda: False, 100, "the never")
    assert loop.now_ms() == 150.0
