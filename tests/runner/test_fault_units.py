"""Fault units built from their specs: one unit per spec kind, each naming its target as
`faults.jsonl` does, the links each partition shape cuts, and the errors only the resolved
nodes can show. Built on a platform that is never started: nothing here is injected (the
effects on a real cluster are in test_faults_cluster.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
from planned_faults import planned

from undertow.faults import FAULT_UNITS, FaultError, Nodes, build_fault
from undertow.faults.partition import CUTS, Partition
from undertow.platform.base import CONTROLLER, Link, PlatformError
from undertow.platform.local import LocalPlatform, LocalPlatformConfig
from undertow.spec.faults import FaultKind, PartitionMode

LEADER = {"role": "leader"}
FOLLOWER = {"role": "follower"}


@pytest.fixture
def platform(tmp_path: Path) -> LocalPlatform:
    """Three brokers and the controller, by name only."""
    return LocalPlatform(LocalPlatformConfig(workdir=tmp_path, brokers=3))


def test_every_kind_and_partition_mode_of_the_spec_has_one_unit() -> None:
    assert set(FAULT_UNITS) == set(get_args(FaultKind))
    assert all(unit.kind == kind for kind, unit in FAULT_UNITS.items())
    assert set(CUTS) == set(get_args(PartitionMode))


@pytest.mark.parametrize(("fault", "nodes", "target"), [
    ({"kind": "kill", "target": LEADER}, Nodes("broker-1"), "broker-1"),
    ({"kind": "kill", "target": {"role": "controller"}}, Nodes(CONTROLLER), CONTROLLER),
    ({"kind": "kill", "target": LEADER, "gracePeriod": "10s"}, Nodes("broker-1"), "broker-1"),
    ({"kind": "pause", "target": FOLLOWER}, Nodes("broker-2"), "broker-2"),
    ({"kind": "disk-stall", "target": LEADER}, Nodes("broker-0"), "broker-0"),
    ({"kind": "power-loss", "target": {"broker": 1}}, Nodes("broker-1"), "broker-1"),
    ({"kind": "pod-delete", "target": LEADER, "gracePeriod": "5s"}, Nodes("broker-0"),
     "broker-0"),
    ({"kind": "partition", "target": LEADER}, Nodes("broker-1"), "broker-1"),
    ({"kind": "partition", "target": FOLLOWER,
      "network": {"mode": "one-way", "to": {"role": "isr-member", "mode": "all"}}},
     Nodes("broker-1", to=("broker-0", "broker-2")), "broker-1->broker-0,broker-2"),
    ({"kind": "partition",
      "network": {"mode": "split", "groups": [[LEADER, {"role": "controller"}], [FOLLOWER]]}},
     Nodes(None, groups=(("broker-0", CONTROLLER), ("broker-1", "broker-2"))),
     f"broker-0,{CONTROLLER}|broker-1,broker-2"),
])
def test_each_kind_builds_its_unit_named_as_faults_jsonl_names_it(
        platform: LocalPlatform, fault: dict[str, Any], nodes: Nodes, target: str) -> None:
    spec = planned(fault)
    unit = build_fault(spec, platform, nodes, time_limit_s=5)
    assert type(unit) is FAULT_UNITS[spec.kind]
    assert unit.describe() == {"fault": spec.kind, "target": target}
    assert unit.state == "pending" and unit.time_limit_s == 5


def test_a_kill_with_a_grace_period_announces_a_clean_shutdown(platform: LocalPlatform) -> None:
    def effect(fault: dict[str, Any]) -> str:
        return build_fault(planned({"kind": "kill", "target": LEADER, **fault}), platform,
                           Nodes("broker-1"), time_limit_s=5).effect()

    assert effect({}) == effect({"gracePeriod": "0s"}) == (
        "SIGKILL in place; held down until recovered")
    assert effect({"gracePeriod": "1500ms"}) == (
        "SIGTERM, SIGKILL after 1.5s (a clean shutdown) in place; held down until recovered")


def test_isolate_cuts_the_target_from_every_node_both_ways_but_not_from_clients(
        platform: LocalPlatform) -> None:
    unit = build_fault(planned({"kind": "partition", "target": LEADER}), platform,
                       Nodes("broker-1"), time_limit_s=5)
    assert isinstance(unit, Partition)
    peers = [CONTROLLER, "broker-0", "broker-2"]
    assert unit.links == {*(Link("broker-1", p) for p in peers),
                          *(Link(p, "broker-1") for p in peers)}


def test_one_way_cuts_only_the_target_to_the_far_side(platform: LocalPlatform) -> None:
    spec = planned({"kind": "partition", "target": FOLLOWER,
                    "network": {"mode": "one-way", "to": LEADER}})
    unit = build_fault(spec, platform, Nodes("broker-2", to=("broker-0",)), time_limit_s=5)
    assert isinstance(unit, Partition)
    assert unit.links == {Link("broker-2", "broker-0")}


def test_split_cuts_links_between_groups_only(platform: LocalPlatform) -> None:
    b0, b1, b2 = platform.brokers
    spec = planned({"kind": "partition", "network": {
        "mode": "split", "groups": [[{"broker": 0}, {"role": "controller"}],
                                    [{"broker": 1}, {"broker": 2}]]}})
    unit = build_fault(spec, platform, Nodes(None, groups=((b0, CONTROLLER), (b1, b2))),
                       time_limit_s=5)
    assert isinstance(unit, Partition)
    pairs = {(link.src, link.dst) for link in unit.links}
    assert (b0, b1) in pairs and (b2, CONTROLLER) in pairs
    assert (b1, b2) not in pairs and (b0, CONTROLLER) not in pairs
    assert not any("client" in pair for pair in pairs)


@pytest.mark.parametrize(("fault", "nodes", "limit", "message"), [
    ({"kind": "kill", "target": {"role": "follower"}}, Nodes("broker-9"), 5,
     "unknown node 'broker-9'"),
    # The spec refuses a controller target for a power loss; the unit refuses the node too.
    ({"kind": "power-loss", "target": {"role": "leader"}}, Nodes(CONTROLLER), 5,
     "'controller' is not a broker"),
    ({"kind": "partition", "target": LEADER,
      "network": {"mode": "one-way", "to": {"role": "isr-member"}}},
     Nodes("broker-0", to=("broker-0",)), 5, "on both sides"),
    ({"kind": "partition", "target": LEADER,
      "network": {"mode": "one-way", "to": {"role": "isr-member"}}},
     Nodes("broker-0", to=("broker-9",)), 5, "unknown endpoint 'broker-9'"),
    ({"kind": "partition",
      "network": {"mode": "split", "groups": [[LEADER], [{"role": "isr-member"}]]}},
     Nodes(None, groups=(("broker-0",), ("broker-0", "broker-1"))), 5,
     r"\['broker-0'\] in two groups"),
    ({"kind": "pause", "target": LEADER}, Nodes("broker-0"), 0,
     "time limit must be positive"),
])
def test_what_only_the_resolved_nodes_show_is_a_clear_runtime_error(
        platform: LocalPlatform, fault: dict[str, Any], nodes: Nodes, limit: float,
        message: str) -> None:
    with pytest.raises((FaultError, PlatformError), match=message):
        build_fault(planned(fault), platform, nodes, time_limit_s=limit)


def test_the_listener_hears_inject_heal_and_recover_once_each(
        platform: LocalPlatform, monkeypatch: pytest.MonkeyPatch) -> None:
    """heal when the undoing begins, recover when it finished; a recover that failed and is
    retried does not say heal twice."""
    heard: list[str] = []
    restarts = iter([PlatformError("broker-1 did not come back"), None])

    def restart(node: str) -> None:
        heard.append(f"restart {node}")
        error = next(restarts)
        if error is not None:
            raise error

    monkeypatch.setattr(platform, "kill",
                        lambda node, grace_s: heard.append(f"kill {node} grace {grace_s:g}"))
    monkeypatch.setattr(platform, "restart", restart)
    monkeypatch.setattr(platform, "announce", lambda *_: None)
    unit = build_fault(planned({"kind": "kill", "target": LEADER}), platform,
                       Nodes("broker-1"), time_limit_s=60,
                       listener=lambda fault, action: heard.append(action))
    unit.inject()
    with pytest.raises(PlatformError):
        unit.recover()
    assert unit.state == "injected"
    assert unit.recover() is True
    assert unit.recover() is False
    assert heard == ["kill broker-1 grace 0", "inject", "heal", "restart broker-1",
                     "restart broker-1", "recover"]
