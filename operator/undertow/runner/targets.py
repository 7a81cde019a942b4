"""Resolving a fault's target selector to processes, from the cluster's live view.

Roles are resolved at injection time (who leads *now*), then Chaos Mesh's modes pick among
the candidates with a seeded generator, so that the same seed picks the same brokers when
the cluster is in the same state. A candidate is a node that can take the fault now: as
Chaos Mesh selects only running pods, a broker another fault holds down is none, even while
the controller's metadata still names it (it is fenced only a session timeout later).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from undertow.cluster_view import ClusterView, PartitionView
from undertow.platform.base import CONTROLLER, broker_node, client_endpoint
from undertow.spec.faults import TargetSelector


class TargetError(LookupError):
    """The selector matches no process right now (e.g. the partition has no leader)."""


def role_label(selector: TargetSelector, topic: str) -> str:
    """``leader of t-0`` rather than the spec's ``leader of p0``: the history names topics."""
    label = selector.describe()
    if selector.partition is not None:
        label = label.replace(f"of p{selector.partition}", f"of {topic}-{selector.partition}")
    return label


def candidates(selector: TargetSelector, view: ClusterView, topic: str) -> list[int]:
    """Broker ids the role names now, before the mode picks among them."""
    index = selector.partition or 0
    try:
        p = view.partition(topic, index)
    except KeyError as exc:
        raise TargetError(exc.args[0]) from None
    live = view.live_brokers
    if selector.role == "leader":
        return [p.leader] if p.has_leader else []
    if selector.role == "follower":
        return [r for r in p.replicas if r != p.leader and r in live]
    if selector.role == "isr-member":
        return [r for r in p.isr if r in live]
    if selector.role == "all-isr-but-one":
        # The one kept is the leader: it is left holding the data alone.
        keep = p.leader if p.leader in p.isr else (p.isr[0] if p.isr else None)
        return [r for r in p.isr if r != keep and r in live]
    raise AssertionError(selector.role)


def _coordinating(partition: Callable[[], PartitionView], what: str) -> int:
    """The leader of the partition holding a coordinator's state (Kafka's FindCoordinator
    answer); TargetError while it does not exist or has no leader."""
    try:
        p = partition()
    except KeyError as exc:
        raise TargetError(f"no {what} yet: {exc.args[0]}") from None
    if not p.has_leader:
        raise TargetError(f"no {what} right now: {p.topic}-{p.partition} has no leader")
    return p.leader


def coordinator(view: ClusterView, group_id: str | None) -> int:
    """The broker coordinating ``group_id`` now: the leader of its ``__consumer_offsets``
    partition."""
    if group_id is None:
        raise TargetError("no consumer group: the workload's consumers do not subscribe")
    return _coordinating(lambda: view.group_partition(group_id),
                         f"coordinator of group {group_id}")


FIRST_TRANSACTIONAL_ID = "undertow-p0"
"""The transactional id of the workload's first producer (`TransactionalProducer`), whose
coordinator `txn-coordinator` names."""


def txn_coordinator(view: ClusterView) -> int:
    """The broker coordinating FIRST_TRANSACTIONAL_ID now: the leader of its
    ``__transaction_state`` partition (FindCoordinator with key type 1)."""
    return _coordinating(lambda: view.transaction_partition(FIRST_TRANSACTIONAL_ID),
                         "transaction coordinator")


Unable = Callable[[str], "str | None"]
"""Why a node cannot take the fault now (``it is not running``), or None when it can."""


def _able(unable: Unable, nodes: list[str], label: str) -> list[str]:
    """The nodes that can take the fault; TargetError naming each that cannot, if none can."""
    why = {node: unable(node) for node in nodes}
    able = [node for node in nodes if why[node] is None]
    if nodes and not able:
        raise TargetError(f"no {label} can take it right now: "
                          + "; ".join(f"{node} {reason}" for node, reason in why.items()))
    return able


def resolve(selector: TargetSelector, view: ClusterView, topic: str,
            rng: random.Random, group_id: str | None = None,
            unable: Unable = lambda _node: None) -> list[str]:
    """The nodes a fault with this selector hits now (``group_id``: the workload's consumer
    group, for ``group-coordinator``), among those ``unable`` finds no reason against."""
    label = role_label(selector, topic)
    if selector.broker is not None:
        return _able(unable, [broker_node(selector.broker)], label)
    if selector.client is not None:
        return _able(unable, [client_endpoint(selector.client)], label)
    if selector.role == "controller":
        return _able(unable, [CONTROLLER], label)
    if selector.role == "group-coordinator":
        return _able(unable, [broker_node(coordinator(view, group_id))], label)
    if selector.role == "txn-coordinator":
        return _able(unable, [broker_node(txn_coordinator(view))], label)
    by_node = {broker_node(b): b for b in candidates(selector, view, topic)}
    found = [by_node[node] for node in _able(unable, list(by_node), label)]
    if not found:
        raise TargetError(f"no {label} right now")
    if selector.mode == "one":
        chosen = [rng.choice(found)]
    elif selector.mode == "all":
        chosen = found
    elif selector.mode == "fixed":
        chosen = rng.sample(found, min(selector.value or 1, len(found)))
    else:  # fixed-percent
        count = max(1, math.floor(len(found) * (selector.value or 100) / 100))
        chosen = rng.sample(found, min(count, len(found)))
    return [broker_node(b) for b in sorted(chosen)]
