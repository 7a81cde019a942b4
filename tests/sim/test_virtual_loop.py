"""The virtual-time event loop and its in-memory TCP: asyncio code unchanged (sleep,
wait_for, to_thread, start_server/open_connection streams) runs on a virtual clock, at once,
in the same order every time, with the TCP behaviour that faults rely on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from undertow.sim import virtual_loop
from undertow.sim.virtual_loop import (
    SimulationRunaway,
    SimulationStalled,
    SimulationTimeout,
    VirtualTimeLoop,
)
from undertow.sim.virtual_streams import VirtualNetwork

LATENCY = 0.001


def run(main: Callable[[VirtualTimeLoop], Awaitable[Any]]) -> Any:
    """``main(loop)`` on a fresh virtual loop; as ``asyncio.run``, the tasks left are
    cancelled and ended before the loop closes."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main(runner.get_loop()))


def test_an_hour_of_sleep_passes_at_once_and_exactly():
    async def main(loop):
        await asyncio.sleep(3600)
        return loop.time()

    started = time.monotonic()
    assert run(main) == 3600.0
    assert time.monotonic() - started < 1.0


def test_a_timeout_fires_at_its_virtual_time():
    async def main(loop):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 2.5)
        return loop.time()

    assert run(main) == 2.5


def trace() -> list[tuple[float, str]]:
    """Tasks that sleep and hand work to each other; what each did and when."""
    async def main(loop):
        seen: list[tuple[float, str]] = []
        queue: asyncio.Queue[int] = asyncio.Queue()

        async def producer(name: str, period: float) -> None:
            for i in range(20):
                await asyncio.sleep(period)
                await queue.put(i)
                seen.append((loop.time(), f"{name} put {i}"))

        async def consumer() -> None:
            for _ in range(40):
                item = await queue.get()
                await asyncio.sleep(0.0003)
                seen.append((loop.time(), f"got {item}"))

        await asyncio.gather(producer("a", 0.007), producer("b", 0.011), consumer())
        return seen

    return run(main)


def test_timers_due_at_the_same_instant_run_in_the_order_they_were_set():
    """What one end of a connection sends at one instant arrives in order: its deliveries
    are timers due at the same time (asyncio's own heap leaves such ties in no set order)."""
    async def main(loop):
        ran: list[int] = []
        for i in range(50):
            loop.call_at(1.0, ran.append, i)
        await asyncio.sleep(2)
        return ran

    assert run(main) == list(range(50))


def test_the_same_code_runs_the_same_way_every_time():
    first = trace()
    assert len(first) == 80
    assert [trace() for _ in range(3)] == [first] * 3
    assert [t for t, _ in first] == sorted(t for t, _ in first)


def test_waiting_on_what_never_comes_is_said_not_hung():
    async def main(loop):
        await loop.create_future()

    with pytest.raises(SimulationStalled, match="no callback is ready and no timer"):
        run(main)


def test_timers_that_multiply_are_said_not_crawled_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timer sets two more 100 ms on: virtual time would crawl for ever (the client
    models once did this while leaders were unreachable). The loop stops it, and winds
    down without running it further (the bound lowered here: the rule, not the number)."""
    monkeypatch.setattr(virtual_loop, "MAX_PENDING_TIMERS", 1000)
    loop = VirtualTimeLoop()

    def spread() -> None:
        loop.call_later(0.1, spread)
        loop.call_later(0.1, spread)

    loop.call_soon(spread)
    started = time.monotonic()
    with pytest.raises(SimulationRunaway, match="more than 1000"):
        loop.run_until_complete(loop.create_future())
    assert loop.time() < 1.2 and time.monotonic() - started < 10
    loop.wind_down()
    loop.close()


def test_blocking_calls_run_inline_and_take_no_virtual_time():
    def boom() -> None:
        raise OSError("disk")

    async def main(loop):
        await asyncio.sleep(1)
        result = await asyncio.to_thread(sum, [1, 2, 3])
        with pytest.raises(OSError, match="disk"):
            await asyncio.to_thread(boom)
        return result, loop.time()

    assert run(main) == (6, 1.0)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(100):
        writer.write(data)
        await writer.drain()
    writer.close()


def test_a_stream_round_trip_takes_its_latencies_in_order():
    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(echo, "broker-1", 9092)
        reader, writer = await net.open_connection("broker-1", 9092, local_host="client")
        connected = loop.time()
        assert writer.get_extra_info("peername") == ("broker-1", 9092)
        for part in (b"one ", b"two ", b"three"):
            writer.write(part)
        data = await reader.readexactly(13)
        return connected, data, loop.time()

    connected, data, done = run(main)
    assert data == b"one two three"
    assert connected == pytest.approx(2 * LATENCY)  # SYN, SYN-ACK
    assert done == pytest.approx(4 * LATENCY)  # there and back


def test_nothing_listening_refuses_the_connection():
    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        with pytest.raises(ConnectionRefusedError):
            await net.open_connection("broker-9", 9092, local_host="client")
        return loop.time()

    assert run(main) == pytest.approx(LATENCY)


def test_a_blocked_link_holds_the_bytes_until_it_heals():
    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(echo, "broker-1", 9092)
        reader, writer = await net.open_connection("broker-1", 9092, local_host="client")
        net.block("client", "broker-1")
        writer.write(b"ping")
        with pytest.raises(TimeoutError):  # the application's timeout fires meanwhile
            await asyncio.wait_for(reader.readexactly(4), 0.5)
        loop.call_later(1.0, net.heal, "client", "broker-1")
        data = await reader.readexactly(4)
        return data, loop.time()

    data, at = run(main)
    assert data == b"ping"
    assert at == pytest.approx(2 * LATENCY + 0.5 + 1.0 + 2 * LATENCY)


def test_a_dead_host_resets_its_connections_and_a_close_ends_the_stream():
    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(echo, "broker-1", 9092)
        reader, writer = await net.open_connection("broker-1", 9092, local_host="client")
        writer.write(b"last words")
        writer.close()
        closed = await reader.read()  # as asyncio's: closing our end ends what we read
        reader2, _ = await net.open_connection("broker-1", 9092, local_host="client")
        net.reset_host("broker-1")
        with pytest.raises(ConnectionResetError):
            await reader2.read(1)
        with pytest.raises(ConnectionRefusedError):  # its listener went with it
            await net.open_connection("broker-1", 9092, local_host="client")
        return closed

    assert run(main) == b""


def test_a_parcels_connection_carries_objects_in_order_through_blocks_and_resets():
    """A client model's connection carries decoded requests and the handlers' responses:
    in order, a latency each way, held by a blocked link, failed by a reset; the listener's
    end is the broker's ``RequestChannel`` (``channel_of``)."""
    from minibroker.network.channel import REQUEST_CHANNEL, channel_of
    from minibroker.network.codec import ApiKey, Request

    served: list[Any] = []

    async def respond(reader, writer):
        channel = channel_of(reader, writer, None, None)  # type: ignore[arg-type]
        while (request := await channel.receive()) is not None:
            served.append(request.body)
            channel.send(request, f"answer to {request.body}")  # type: ignore[arg-type]

    def request(correlation_id: int, body: str) -> Request:
        return Request(ApiKey.METADATA, 12, correlation_id, "client", body)

    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(respond, "broker-1", 9092)
        _, writer = await net.open_connection("broker-1", 9092, local_host="client",
                                              parcels=True)
        channel = writer.get_extra_info(REQUEST_CHANNEL)
        sent = loop.time()
        for i, body in enumerate(("one", "two")):
            channel.post(request(i, body))
        answers = [await channel.next(), await channel.next()]
        round_trip = loop.time() - sent
        net.block("client", "broker-1")
        channel.post(request(2, "three"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(channel.next(), 0.5)
        net.heal("client", "broker-1")
        answers.append(await channel.next())
        channel.post(request(3, "four"))
        net.reset_host("broker-1")
        with pytest.raises(ConnectionResetError):
            await channel.next()
        return answers, round_trip

    answers, round_trip = run(main)
    assert answers == [(0, "answer to one"), (1, "answer to two"), (2, "answer to three")]
    assert served == ["one", "two", "three"]  # "four" met the reset
    assert round_trip == pytest.approx(2 * LATENCY)


def test_the_broker_s_kafka_connection_carries_objects_on_the_virtual_network(monkeypatch):
    """A follower's ``KafkaConnection`` in a simulated host sends its request as the
    object the listener's handlers take, and reads the object they return: the codec is
    not called either way, and a reset still fails the request as a lost socket does."""
    from kio.schema.api_versions.v3 import request as versions_req

    from minibroker.environment import entered
    from minibroker.network import channel as channel_module
    from minibroker.network.channel import channel_of
    from minibroker.network.client import KafkaConnection, KafkaConnectionError

    def no_codec(*_args: object) -> None:
        raise AssertionError("the codec ran on an object connection")

    for name in ("encode_request", "decode_response", "encode_response", "parse_request"):
        monkeypatch.setattr(channel_module, name, no_codec)
    served: list[Any] = []

    async def respond(reader, writer):
        channel = channel_of(reader, writer, None, None)  # type: ignore[arg-type]
        while (request := await channel.receive()) is not None:
            served.append((request.api_key, request.correlation_id, request.client_id))
            channel.send(request, f"versions for {request.client_id}")  # type: ignore[arg-type]

    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(respond, "broker-1", 9092)
        with entered(net.environment("broker-2", wall_clock=loop.time)):
            conn = await KafkaConnection.connect("broker-1", 9092, client_id="replica-2")
        body = versions_req.ApiVersionsRequest(client_software_name="minibroker",
                                               client_software_version="0")
        answers = [await conn.request(body), await conn.request(body)]
        net.reset_host("broker-1")
        with pytest.raises(KafkaConnectionError):
            await conn.request(body)
        return answers, conn.closed

    answers, closed = run(main)
    assert answers == ["versions for replica-2"] * 2
    assert [(key.name, cid, client) for key, cid, client in served] == [
        ("API_VERSIONS", 0, "replica-2"), ("API_VERSIONS", 1, "replica-2")]
    assert closed


def test_the_broker_s_own_rpc_runs_on_the_virtual_network():
    """minibroker.rpc unchanged (the controller channel with its handshake) between two
    simulated hosts: a call, a partition the client's timeout sees, the call after it heals."""
    from minibroker.environment import entered
    from minibroker.rpc import RpcClient, RpcError, RpcLimits, RpcServer

    secret = b"s" * 32

    async def echo_params(params: dict) -> dict:
        return {"echo": params, "at": asyncio.get_running_loop().time()}

    async def controller(net: VirtualNetwork, started: asyncio.Future) -> None:
        server = RpcServer({"echo": echo_params}, secret=secret, limits=RpcLimits(
            max_connections=4, max_in_flight_per_connection=4, max_request_bytes=1 << 16))
        await server.start("0.0.0.0", 9093)
        started.set_result(server.port)

    async def broker(net: VirtualNetwork, port: int) -> list:
        client = RpcClient("controller", port, secret=secret)
        seen = [await client.call("echo", {"n": 1})]
        net.block("controller", "broker-1")
        with pytest.raises(RpcError, match="timed out"):
            await client.call("echo", {"n": 2}, timeout=3.0)
        seen.append(asyncio.get_running_loop().time())
        net.heal("controller", "broker-1")
        seen.append(await client.call("echo", {"n": 3}))
        await client.aclose()
        return seen

    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        started = loop.create_future()
        with entered(net.environment("controller", wall_clock=loop.time)):
            loop.create_task(controller(net, started))
        port = await started
        with entered(net.environment("broker-1", wall_clock=loop.time)):
            task = loop.create_task(broker(net, port))
        return port, await task

    port, (first, timed_out_at, after) = run(main)
    assert port == 9093
    assert first["echo"] == {"n": 1} and after["echo"] == {"n": 3}
    # Connect (2 latencies), the handshake (challenge, response, verdict), then the call.
    assert first["at"] == pytest.approx(6 * LATENCY)
    assert timed_out_at == pytest.approx(7 * LATENCY + 3.0)  # the answer's way back, + 3 s


def test_a_blocking_wait_runs_the_loop_from_outside_and_from_a_callback() -> None:
    """``wait_until`` is what a simulated platform's blocking primitive stands on: from the
    top it runs the loop until the condition holds; from a plain callback (a fault unit
    called at its time) it runs the loop nested, the other tasks going on meanwhile."""
    loop = VirtualTimeLoop()
    try:
        seen: dict[str, float] = {}

        async def ticker() -> None:
            for name in ("first", "second", "third"):
                await asyncio.sleep(1.0)
                seen[name] = loop.time()

        task = loop.create_task(ticker())
        loop.wait_until(lambda: "first" in seen, 10, "the first tick")
        assert loop.time() == seen["first"] == 1.0

        def fault_unit() -> None:  # at 1.5 s, waits for the third tick before returning
            seen["unit_start"] = loop.time()
            loop.wait_until(lambda: "third" in seen, 10, "the third tick")
            seen["unit_end"] = loop.time()

        loop.call_at(1.5, fault_unit)
        # Due with it: the unit's nested wait runs it, from the iteration that ran the unit.
        loop.call_at(1.5, lambda: seen.__setitem__("beside", loop.time()))
        loop.run_until_complete(task)
        assert seen == {"first": 1.0, "unit_start": 1.5, "beside": 1.5, "second": 2.0,
                        "third": 3.0, "unit_end": 3.0}
        with pytest.raises(SimulationTimeout, match=r"not within 2 s \(virtual\): nothing"):
            loop.wait_until(lambda: False, 2, "nothing")
        assert loop.time() == 5.0

        async def in_a_task() -> None:
            loop.wait_until(lambda: True, 1, "x")

        with pytest.raises(RuntimeError, match="in a task: await"):
            loop.run_until_complete(in_a_task())
    finally:
        loop.close()


def test_a_nested_wait_may_run_what_its_iteration_had_left() -> None:
    """Two callbacks due at once; the first waits for the second, which its nested wait
    runs: the outer iteration then finds nothing left to run, and goes on."""
    loop = VirtualTimeLoop()
    try:
        flag: list[float] = []
        loop.call_at(1.0, lambda: loop.wait_until(lambda: bool(flag), 1, "the flag"))
        loop.call_at(1.0, lambda: flag.append(loop.time()))
        loop.run_until_complete(asyncio.sleep(2.0))
        assert flag == [1.0] and loop.time() == 2.0
    finally:
        loop.close()


def test_a_paused_node_s_cancelled_timer_stays_cancelled_when_it_resumes() -> None:
    """SIGSTOP holds what falls due; SIGCONT runs it in order. A timeout's timer due while
    paused, behind the wake-up of the task it guards, is cancelled by that task as it leaves
    the timeout: it must not fire after all (asyncio's ``Timeout._on_timeout`` asserts it is
    still entered), and the task's own context is its own, not a copy."""
    from minibroker.environment import Environment, context_of, entered

    loop = VirtualTimeLoop()
    node = Environment()
    loop.add_node(node)
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    answer = loop.create_future()
    seen: dict[str, Any] = {}

    async def guarded() -> None:
        async with asyncio.timeout(2.5):  # due at 2.5 s, while the node is paused
            seen["answer"] = await answer  # answered at 2 s, while paused
        seen["left"] = loop.time()

    try:
        with entered(node):
            task = loop.create_task(guarded())
        loop.call_at(1.0, loop.pause, node)
        loop.call_at(2.0, answer.set_result, "ok", context=context_of(Environment()))
        loop.call_at(3.0, loop.resume, node)
        loop.run_until_complete(task)
        loop.run_until_complete(asyncio.sleep(1.0))  # past the timer's time, and resumed
        assert seen == {"answer": "ok", "left": 3.0}
        assert errors == []
    finally:
        loop.close()


def test_a_connection_s_buffered_requests_take_turns_with_other_connections() -> None:
    """The listener serves one request of a connection per turn of the loop while more of
    its requests are buffered, as a Processor polls its channels: a client that pipelines
    five requests does not keep another's one waiting behind all five."""
    from kio.schema.api_versions.v3 import request as versions_req

    from minibroker.environment import entered
    from minibroker.network.channel import REQUEST_CHANNEL
    from minibroker.network.codec import ApiKey, Request
    from minibroker.network.kafka_server import KafkaServer

    served: list[tuple[str, int]] = []

    class Handler:
        async def handle(self, request: Request) -> Any:
            served.append((request.client_id or "", request.correlation_id))
            return "answer"

    body = versions_req.ApiVersionsRequest(client_software_name="x", client_software_version="0")

    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        server = KafkaServer(Handler())  # type: ignore[arg-type]
        with entered(net.environment("broker-1", wall_clock=loop.time)):
            await server.start("broker-1", 9092)
        writers = [(await net.open_connection("broker-1", 9092, local_host=client,
                                              parcels=True))[1]
                   for client in ("pipelining", "single")]
        channels = [writer.get_extra_info(REQUEST_CHANNEL) for writer in writers]
        for correlation_id in range(5):
            channels[0].send_request(Request(ApiKey.API_VERSIONS, 3, correlation_id,
                                             "pipelining", body))
        channels[1].send_request(Request(ApiKey.API_VERSIONS, 3, 0, "single", body))
        await asyncio.sleep(1.0)

    run(main)
    assert served == [("pipelining", 0), ("single", 0), ("pipelining", 1), ("pipelining", 2),
                      ("pipelining", 3), ("pipelining", 4)]


def test_an_interrupt_landing_in_a_nodes_task_is_not_reported_as_its_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    """SIGHUP stops an exploration's worker with KeyboardInterrupt wherever it runs; when
    that is a node's connection task, asyncio reports the task, and the report (a
    traceback on the exploration's stderr) is not an error of the run. A real error still
    is."""
    loop = VirtualTimeLoop()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_exception_handler({"message": "Unhandled exception in client_connected_cb",
                                     "exception": KeyboardInterrupt("SIGHUP")})
        assert caplog.records == []
        loop.call_exception_handler({"message": "Unhandled exception in client_connected_cb",
                                     "exception": ValueError("a bug")})
        assert [r.getMessage() for r in caplog.records] == [
            "Unhandled exception in client_connected_cb"]
    loop.close()
