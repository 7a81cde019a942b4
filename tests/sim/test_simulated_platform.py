"""The fault units of ``undertow.faults`` on ``SimulatedPlatform``: minibroker's own servers on
the virtual-time loop (``sim/cluster.py``), each fault's effect read from the controller's
own state, as ``tests/runner/test_faults_cluster.py`` reads it on local processes.

Every kind of the registry, on a follower, takes effect and is healed (by the cluster-wide
heal, which knows no unit, and by the unit's own time limit, a timer of the loop whose
recovery waits nested in it) with nothing left behind; a killed leader is replaced."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_checks import check_kind_heals
from planned_faults import planned

from minibroker.environment import entered
from minibroker.tools import create_topic
from undertow.faults import FAULT_UNITS, Nodes, build_fault
from undertow.platform.base import CONTROLLER, broker_id_of, broker_node
from undertow.platform.simulated import SimulatedPlatform

TOPIC = "t"
CONFIG = {"replica.lag.time.max.ms": "1000", "broker.session.timeout.ms": "1500",
          "broker.heartbeat.interval.ms": "200", "min.insync.replicas": "2"}
EFFECT_TIMEOUT_S = 20.0


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[SimulatedPlatform]:
    with SimulatedPlatform(tmp_path, 3, CONFIG, ephemeral_storage=True) as running:
        client = running.cluster.environment("client")
        running.loop.add_node(client)
        with entered(client):
            created = running.loop.create_task(
                create_topic(running.cluster.bootstrap[0], TOPIC, 1, 3, {}))
        running.loop.wait_until(created.done, 30, "CreateTopics")
        assert created.result() == 0
        running.loop.wait_until(lambda: full_isr(running), 30, "the full ISR of t-0")
        yield running


def partition(platform: SimulatedPlatform) -> dict[str, Any]:
    return platform.state(CONTROLLER)["topics"][TOPIC]["partitions"]["0"]


def full_isr(platform: SimulatedPlatform) -> bool:
    reg = partition(platform)
    return reg["leader"] >= 0 and sorted(reg["isr"]) == sorted(reg["replicas"])


@pytest.mark.parametrize("heal", ["faults.heal", "time limit"])
@pytest.mark.parametrize("kind", list(FAULT_UNITS))
def test_every_kind_of_the_registry_heals_and_leaves_nothing_behind(
        platform: SimulatedPlatform, kind: str, heal: str) -> None:
    reg = partition(platform)
    follower = broker_node(next(b for b in reg["replicas"] if b != reg["leader"]))
    check_kind_heals(platform, kind, heal, follower, platform.loop.wait_until,
                     lambda: platform.loop.wait_until(
                         lambda: broker_id_of(follower) in partition(platform)["isr"],
                         EFFECT_TIMEOUT_S, f"{follower} back in the ISR"), EFFECT_TIMEOUT_S)


def test_a_killed_leader_is_replaced_and_its_recovery_restarts_it_into_the_isr(
        platform: SimulatedPlatform) -> None:
    old = broker_node(partition(platform)["leader"])
    fault = build_fault(planned({"kind": "kill", "target": {"role": "leader"}}), platform,
                        Nodes(old), time_limit_s=60)
    fault.inject()
    assert not platform.is_running(old)
    platform.loop.wait_until(lambda: partition(platform)["leader"] not in (
        -1, broker_id_of(old)), EFFECT_TIMEOUT_S, "a new leader")
    # The recovery runs from a timer of the loop, as the nemesis's would: its wait for the
    # broker to serve again runs the loop nested in the wait below.
    platform.loop.call_later(0.1, fault.recover, context=contextvars.Context())
    platform.loop.wait_until(lambda: fault.state == "recovered", EFFECT_TIMEOUT_S,
                             "the kill's recovery")
    platform.loop.wait_until(lambda: full_isr(platform), EFFECT_TIMEOUT_S,
                             f"{old} back in the ISR")
    assert platform.incarnation(old) == 2
