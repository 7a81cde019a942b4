"""Rolling restarts and scale-downs: one broker at a time, never below min.insync.replicas."""

from __future__ import annotations

from typing import Any

import pytest

from undertow.cluster_view import view_from_states
from undertow.kube.pods import PodView
from undertow.kube.rollout import (
    ControllerPod,
    RolloutDecision,
    blocking_partitions,
    pending,
    plan,
)


def pod(broker: int, revision: str = "old", ready: bool = True,
        terminating: bool = False) -> PodView:
    return PodView(name=f"c-broker-{broker}", node=f"broker-{broker}", component="broker",
                   ready=ready, terminating=terminating, running=True, revision=revision,
                   ip=None, uid=None, restarts=0)


def states(*partitions: tuple[str, int, int, list[int]]) -> dict[int, dict[str, Any]]:
    """Broker states from (topic, partition, leader, isr): the leader reports the ISR,
    every other ISR member reports itself as a follower."""
    result: dict[int, dict[str, Any]] = {i: {"broker_id": i, "partitions": []} for i in range(3)}
    for topic, index, leader, isr in partitions:
        for member in isr:
            result[member]["partitions"].append({
                "topic": topic, "partition": index, "leader": leader, "leader_epoch": 0,
                "isr": isr, "high_watermark": 0, "log_end_offset": 0,
                "role": "leader" if member == leader else "follower"})
    return result


BROKERS = [pod(0), pod(1), pod(2)]


def decide(brokers: list[PodView] = BROKERS, *, desired: int = 3, current: int = 3,
           revision: str | None = "new", broker_states: dict | None = None,
           min_isr: int = 2, controller: dict | None = None,
           locked: str | None = None, controller_pod: ControllerPod | None = None,
           ) -> RolloutDecision:
    if broker_states is None:
        broker_states = states(("t", 0, 0, [0, 1, 2]))
    return plan(brokers, desired=desired, current_replicas=current, update_revision=revision,
                view=view_from_states(controller or {}, broker_states), default_min_isr=min_isr,
                locked_by=locked, controller=controller_pod)


def controller_pod(revision: str = "c-old", ready: bool = True,
                   terminating: bool = False) -> ControllerPod:
    pod = PodView(name="c-controller-0", node="controller", component="controller",
                  ready=ready, terminating=terminating, running=True, revision=revision,
                  ip=None, uid=None, restarts=0)
    return ControllerPod(pod, "c-new")


def test_an_out_of_date_controller_restarts_first_once_every_broker_is_ready() -> None:
    current = [pod(i, "new") for i in range(3)]
    assert pending(current, desired=3, current_replicas=3, update_revision="new",
                   controller=controller_pod())
    assert not pending(current, desired=3, current_replicas=3, update_revision="new",
                       controller=controller_pod("c-new"))
    assert decide(current, controller_pod=controller_pod("c-new")) == RolloutDecision("none")
    # Before any broker, even with stale brokers waiting.
    assert decide(controller_pod=controller_pod()) == RolloutDecision(
        "restart-controller", reason="the controller runs an old configuration")
    one_down = [pod(0, "new"), pod(1, "new", ready=False), pod(2, "new")]
    assert decide(one_down, controller_pod=controller_pod()) == RolloutDecision(
        "wait", reason="broker-1 is not ready yet")
    assert decide(controller_pod=controller_pod(ready=False)).action == "restart-controller"
    assert decide(controller_pod=controller_pod(terminating=True)) == RolloutDecision(
        "wait", reason="the controller is restarting")
    assert decide(controller_pod=controller_pod(), locked="e1") == RolloutDecision(
        "wait", reason="experiment e1 is running")


def test_nothing_to_do_when_every_broker_is_current() -> None:
    current = [pod(i, "new") for i in range(3)]
    assert not pending(current, desired=3, current_replicas=3, update_revision="new")
    assert decide(current) == RolloutDecision("none")


def test_followers_restart_before_the_leader() -> None:
    assert decide() == RolloutDecision("restart", 1, "broker-1 runs an old configuration")
    only_leader_left = [pod(0), pod(1, "new"), pod(2, "new")]
    assert decide(only_leader_left).broker == 0


def test_never_below_min_insync_replicas() -> None:
    # t-0's ISR is [0, 1] with min.insync.replicas 2: neither may stop; 2 is not in the ISR.
    shrunk = states(("t", 0, 0, [0, 1]))
    assert decide(broker_states=shrunk) == RolloutDecision(
        "restart", 2, "broker-2 runs an old configuration")
    only_isr_stale = [pod(0), pod(1), pod(2, "new")]
    decision = decide(only_isr_stale, broker_states=shrunk)
    assert decision.action == "wait"
    assert decision.reason == ("restarting broker-1 would leave t-0 (ISR [0, 1], "
                               "min.insync.replicas 2)")


def test_the_topics_own_min_isr_wins_over_the_clusters() -> None:
    shrunk = states(("t", 0, 0, [0, 1]))
    controller = {"topics": {"t": {"config": {"min.insync.replicas": "1"}}}}
    view = view_from_states(controller)
    assert view.min_insync_replicas("t", 2) == 1
    assert view.min_insync_replicas("other", 2) == 2
    assert decide([pod(0), pod(1), pod(2, "new")], broker_states=shrunk,
                  controller=controller).action == "restart"


def test_one_at_a_time_and_not_ready_stale_brokers_first() -> None:
    assert decide([pod(0), pod(1, "new", ready=False), pod(2)]).reason == \
        "broker-1 is not ready yet"
    assert decide([pod(0), pod(1, ready=False), pod(2)]) == RolloutDecision(
        "restart", 1, "broker-1 is not ready and out of date")
    assert decide([pod(0), pod(1, terminating=True, ready=False), pod(2)]).action == "wait"


def test_waits_without_every_brokers_state_or_while_locked() -> None:
    partial = states(("t", 0, 0, [0, 1, 2]))
    del partial[2]
    assert decide(broker_states=partial) == RolloutDecision(
        "wait", reason="no /v1/state from broker-2")
    assert decide(locked="e1") == RolloutDecision("wait", reason="experiment e1 is running")


def test_a_partition_whose_leader_did_not_answer_blocks_everyone() -> None:
    views = states(("t", 0, 0, [0, 1, 2]))
    views[0]["partitions"] = []  # the leader's view is missing
    assert blocking_partitions(2, view_from_states({}, views), 1) == \
        ["t-0 has no leader that answered"]


@pytest.mark.parametrize(("isr", "action"), [([0, 1, 2], "scale-down"), ([0, 2], "wait")])
def test_scale_down_removes_the_last_broker_only_when_safe(isr: list[int],
                                                          action: str) -> None:
    current = [pod(i, "new") for i in range(3)]
    decision = decide(current, desired=2, current=3, broker_states=states(("t", 0, 0, isr)))
    assert (decision.action, decision.broker) == (action, 2 if action == "scale-down" else None)
