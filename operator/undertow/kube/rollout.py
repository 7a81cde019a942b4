"""Rolling restarts and scale-downs, one pod at a time, never below min.insync.replicas.

Both StatefulSets use ``OnDelete`` updates: the operator alone decides when a pod restarts.
The controller goes first, as Strimzi rolls KRaft controllers before brokers: its
metadata is on a PersistentVolumeClaim and survives the restart, and it restarts only
while every broker is ready and no experiment holds the cluster.

Strimzi's rule, decided from the brokers' own ``/v1/state``: a broker may stop only when,
for every partition whose ISR holds it, the ISR without it still has at least the topic's
``min.insync.replicas`` members (the ISR of a partition is read from its leader, the
broker that maintains it). A partition whose leader did not answer, or that has none,
blocks every broker: nobody can tell what stopping one would do to it. Brokers that are
not ready are restarted first (they serve nothing), then ready ones that lead nothing,
lowest id first; while any broker is not ready the rollout waits, so two brokers are
never down at once because of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from undertow.cluster_view import ClusterView
from undertow.kube.pods import PodView
from undertow.platform.base import broker_id_of

Action = Literal["none", "restart", "restart-controller", "scale-down", "wait"]


@dataclass(frozen=True)
class RolloutDecision:
    action: Action
    broker: int | None = None
    reason: str = ""

    @property
    def in_progress(self) -> bool:
        return self.action != "none"


def blocking_partitions(broker: int, view: ClusterView, default_min_isr: int) -> list[str]:
    """Why ``broker`` must not stop now: the partitions it would take below min ISR."""
    leaders = view.led_by_reports()
    known = {(r.topic, r.partition) for report in view.reports.values() for r in report.replicas}
    reasons = [f"{topic}-{index} has no leader that answered"
               for topic, index in sorted(known - leaders.keys())]
    for (topic, index), replica in sorted(leaders.items()):
        isr, needed = list(replica.isr), view.min_insync_replicas(topic, default_min_isr)
        if broker in isr and len(isr) - 1 < needed:
            reasons.append(f"{topic}-{index} (ISR {isr}, min.insync.replicas {needed})")
    return reasons


def _stale(brokers: Sequence[PodView], update_revision: str | None) -> dict[int, PodView]:
    """Broker pods created from an older revision of the StatefulSet, by broker id."""
    return {broker_id_of(p.node): p for p in brokers
            if p.node and update_revision and p.revision and p.revision != update_revision}


@dataclass(frozen=True)
class ControllerPod:
    """The controller's pod (None: there is none yet) and its StatefulSet's revision."""

    pod: PodView | None
    update_revision: str | None

    @property
    def stale(self) -> bool:
        return bool(self.pod and self.update_revision and self.pod.revision
                    and self.pod.revision != self.update_revision)


def pending(brokers: Sequence[PodView], *, desired: int, current_replicas: int,
            update_revision: str | None, controller: ControllerPod | None = None) -> bool:
    """Whether any pod must restart or go (cheap: no /v1/state needed)."""
    return (current_replicas > desired or bool(_stale(brokers, update_revision))
            or bool(controller and controller.stale))


def plan(brokers: Sequence[PodView], *, desired: int, current_replicas: int,
         update_revision: str | None, view: ClusterView | None, default_min_isr: int,
         locked_by: str | None = None,
         controller: ControllerPod | None = None) -> RolloutDecision:
    """The next step of bringing the controller to its StatefulSet's revision and the
    brokers to ``desired`` replicas on ``update_revision``.

    ``view`` holds the report of every broker that answered (None: not fetched); its topic
    configs, the controller's, are empty when the controller did not answer.
    """
    by_id = {broker_id_of(p.node): p for p in brokers if p.node and p.node.startswith("broker-")}
    stale = sorted(_stale(brokers, update_revision))
    shrink = current_replicas > desired
    controller_stale = bool(controller and controller.stale)
    if not stale and not shrink and not controller_stale:
        return RolloutDecision("none")
    if locked_by:
        return RolloutDecision("wait", reason=f"experiment {locked_by} is running")
    if controller_stale:
        return _controller_step(controller, by_id, current_replicas)
    for i in stale:
        if not by_id[i].ready and not by_id[i].terminating:
            return RolloutDecision("restart", i, f"broker-{i} is not ready and out of date")
    not_ready = sorted(i for i in range(current_replicas) if i not in by_id or not by_id[i].ready)
    if not_ready:
        return RolloutDecision("wait", reason=f"broker-{not_ready[0]} is not ready yet")
    missing = sorted(set(by_id) - set(view.reports if view else {}))
    if view is None or missing:
        which = f"broker-{missing[0]}" if missing else "the brokers"
        return RolloutDecision("wait", reason=f"no /v1/state from {which}")
    if shrink:
        last = current_replicas - 1
        blocked = blocking_partitions(last, view, default_min_isr)
        if blocked:
            return RolloutDecision("wait", reason=f"removing broker-{last} would leave "
                                                  f"{'; '.join(blocked)}")
        return RolloutDecision("scale-down", last, f"scaling down to {desired} brokers")
    leaders = {replica.leader for replica in view.led_by_reports().values()}
    blocked_by: dict[int, list[str]] = {}
    for i in sorted(stale, key=lambda b: (b in leaders, b)):
        blocked = blocking_partitions(i, view, default_min_isr)
        if not blocked:
            return RolloutDecision("restart", i, f"broker-{i} runs an old configuration")
        blocked_by[i] = blocked
    first = next(iter(blocked_by))  # the one it would have restarted first
    return RolloutDecision("wait", reason=f"restarting broker-{first} would leave "
                                          f"{'; '.join(blocked_by[first])}")


def _controller_step(controller: ControllerPod | None, by_id: Mapping[int, PodView],
                     current_replicas: int) -> RolloutDecision:
    """Restart an out-of-date controller: at once when it is not ready (it serves
    nothing), else once every broker is ready, so that no election waits on two restarts."""
    assert controller is not None and controller.pod is not None
    if controller.pod.terminating:
        return RolloutDecision("wait", reason="the controller is restarting")
    if not controller.pod.ready:
        return RolloutDecision("restart-controller",
                               reason="the controller is not ready and out of date")
    not_ready = sorted(i for i in range(current_replicas) if i not in by_id or not by_id[i].ready)
    if not_ready:
        return RolloutDecision("wait", reason=f"broker-{not_ready[0]} is not ready yet")
    return RolloutDecision("restart-controller",
                           reason="the controller runs an old configuration")
