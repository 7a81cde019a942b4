"""Resolving a fault's target selector to processes, from the controller's live metadata.

Roles are resolved at injection time (who leads *now*), then Chaos Mesh's modes pick among
the candidates with a seeded generator, so that the same seed picks the same brokers when
the cluster is in the same state.
"""

from __future__ import annotations

import math
import random
from typing import Any

from undertow.platform.base import CONTROLLER, broker_node
from undertow.spec.faults import TargetSelector


class TargetError(LookupError):
    """The selector matches no process right now (e.g. the partition has no leader)."""


def role_label(selector: TargetSelector, topic: str) -> str:
    """``leader of t-0`` rather than the spec's ``leader of p0``: the history names topics."""
    label = selector.describe()
    if selector.partition is not None:
        label = label.replace(f"of p{selector.partition}", f"of {topic}-{selector.partition}")
    return label


def _partition(controller: dict[str, Any], topic: str, index: int) -> dict[str, Any]:
    try:
        return controller["topics"][topic]["partitions"][str(index)]
    except KeyError:
        raise TargetError(f"partition {topic}-{index} is not in the controller's metadata") \
            from None


def candidates(selector: TargetSelector, controller: dict[str, Any], topic: str) -> list[int]:
    """Broker ids the role names now, before the mode picks among them."""
    live = {b["id"] for b in controller.get("brokers", []) if not b.get("fenced")}
    reg = _partition(controller, topic, selector.partition or 0)
    leader, isr, replicas = reg["leader"], reg["isr"], reg["replicas"]
    if selector.role == "leader":
        return [leader] if leader >= 0 else []
    if selector.role == "follower":
        return [r for r in replicas if r != leader and r in live]
    if selector.role == "isr-member":
        return [r for r in isr if r in live]
    if selector.role == "all-isr-but-one":
        # The one kept is the leader: it is left holding the data alone.
        keep = leader if leader in isr else (isr[0] if isr else None)
        return [r for r in isr if r != keep and r in live]
    raise AssertionError(selector.role)


def resolve(selector: TargetSelector, controller: dict[str, Any], topic: str,
            rng: random.Random) -> list[str]:
    """The nodes a fault with this selector hits now."""
    if selector.broker is not None:
        return [broker_node(selector.broker)]
    if selector.role == "controller":
        return [CONTROLLER]
    found = candidates(selector, controller, topic)
    if not found:
        raise TargetError(f"no {role_label(selector, topic)} right now")
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
