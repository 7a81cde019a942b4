"""What the tests of every fault kind share across platforms (tests/runner/test_faults_cluster.py
on local processes, tests/sim/test_simulated_platform.py in simulation): what a fault may leave
behind, and the check that each kind of the registry takes effect and heals completely."""

from __future__ import annotations

from collections.abc import Callable

from planned_faults import planned

from undertow import faults
from undertow.faults import Nodes, build_fault
from undertow.platform.base import Platform

Wait = Callable[[Callable[[], object], float, str], object]
"""The platform's way to wait for a condition: (condition, timeout in seconds, what)."""


def leftovers(platform: Platform) -> list[str]:
    """Whatever a fault may leave behind, read from the processes, the links and each
    broker's own state: stopped or missing processes (a paused producer's own among them),
    blocked or delayed links, armed failpoints."""
    left = [f"{node} paused" for node in platform.nodes if platform.is_paused(node)]
    left += [f"{client} paused" for client in platform.client_processes
             if platform.is_client_paused(client)]
    left += [f"{node} down" for node in platform.nodes if not platform.is_running(node)]
    left += [f"{link} blocked" for link in sorted(platform.blocked_links)]
    left += [f"{link} delayed" for link in sorted(platform.delayed_links)]
    for node in platform.brokers:
        if platform.is_running(node) and not platform.is_paused(node):
            state = platform.state(node)
            left += [f"{node} {flag}" for flag in ("disk_stalled", "disk_full") if state[flag]]
    return left


def check_kind_heals(platform: Platform, kind: str, heal: str, follower: str, wait: Wait,
                     back_in_isr: Callable[[], None], timeout_s: float) -> None:
    """``kind`` on ``follower``, healed by the cluster-wide heal (which knows no unit) or by
    the unit's own time limit: no stopped process, no process down, no blocked link and no
    armed failpoint is left, and the follower rejoins the ISR."""
    fault = build_fault(planned({"kind": kind, "target": {"role": "follower"}}), platform,
                        Nodes(follower), time_limit_s=60 if heal == "faults.heal" else 1.5)
    fault.inject()
    if kind != "pod-delete":  # the replacement starts at once: nothing to undo but waiting
        assert leftovers(platform), f"{kind} took no effect that this test could see"
    if heal == "faults.heal":
        faults.heal(platform)
    else:
        wait(lambda: fault.state == "recovered", timeout_s, f"{kind}'s time limit to recover it")
    assert leftovers(platform) == []
    back_in_isr()
    fault.recover()  # the unit's own recovery after a heal: nothing left to do, no error
    assert leftovers(platform) == []
