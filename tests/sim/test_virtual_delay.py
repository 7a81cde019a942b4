"""A `delay` fault on the virtual network: each write of a delayed link arrives its drawn
delay after the network's latency, a connection's bytes stay in order whatever the jitter,
and the same seed draws the same delays."""

from __future__ import annotations

import asyncio
import random

import pytest
from test_virtual_loop import LATENCY, echo, run

from undertow.platform.link_delay import LinkDelay
from undertow.sim.virtual_streams import VirtualNetwork


def test_a_delayed_link_adds_its_latency_one_way_only():
    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(echo, "broker-1", 9092)
        reader, writer = await net.open_connection("broker-1", 9092, local_host="client")
        net.set_delay("client", "broker-1", LinkDelay(0.25), random.Random(1))
        sent = loop.time()
        writer.write(b"ping")
        await reader.readexactly(4)
        delayed = loop.time() - sent
        net.set_delay("client", "broker-1", None, random.Random(1))
        sent = loop.time()
        writer.write(b"pong")
        await reader.readexactly(4)
        return delayed, loop.time() - sent

    delayed, healed = run(main)
    assert delayed == pytest.approx(0.25 + 2 * LATENCY)  # there late, back on time
    assert healed == pytest.approx(2 * LATENCY)


def jittered_arrivals(seed: int) -> tuple[bytes, list[float]]:
    async def main(loop):
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(echo, "broker-1", 9092)
        reader, writer = await net.open_connection("broker-1", 9092, local_host="client")
        net.set_delay("client", "broker-1", LinkDelay(0.1, 0.1, 0.5), random.Random(seed))
        for i in range(40):
            writer.write(b"%02d" % i)
            await asyncio.sleep(0.005)
        arrivals, data = [], b""
        while len(data) < 80:
            data += await reader.readexactly(2)
            arrivals.append(loop.time())
        return data, arrivals

    return run(main)


def test_jitter_never_reorders_a_connection_and_a_seed_replays_it():
    data, arrivals = jittered_arrivals(7)
    assert data == b"".join(b"%02d" % i for i in range(40))
    assert arrivals == sorted(arrivals)
    sent_last = 39 * 0.005
    assert max(arrivals) <= sent_last + 0.2 + 2 * LATENCY + 1e-9  # latency + jitter at most
    assert jittered_arrivals(7) == (data, arrivals)
    assert jittered_arrivals(8)[1] != arrivals
