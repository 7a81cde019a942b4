"""Pure pieces of the runner: resolving target selectors from controller metadata, and
classifying a send's outcome."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import KafkaError

from undertow.runner.targets import TargetError, resolve, role_label
from undertow.runner.workload import classify, decode_value
from undertow.spec import TargetSelector

CONTROLLER = {
    "brokers": [{"id": 0, "fenced": False}, {"id": 1, "fenced": False},
                {"id": 2, "fenced": True}],
    "topics": {"t": {"partitions": {
        "0": {"leader": 1, "isr": [1, 0], "replicas": [0, 1, 2], "leader_epoch": 3},
        "1": {"leader": -1, "isr": [2], "replicas": [2, 0, 1], "leader_epoch": 5},
    }}},
}


def pick(**selector) -> list[str]:
    return resolve(TargetSelector(**selector), CONTROLLER, "t", random.Random(1))


def test_roles_resolve_from_live_metadata() -> None:
    assert pick(role="leader") == ["broker-1"]
    # Followers and ISR members exclude fenced brokers.
    assert pick(role="follower", mode="all") == ["broker-0"]
    assert pick(role="isr-member", mode="all") == ["broker-0", "broker-1"]
    # all-isr-but-one keeps the leader.
    assert pick(role="all-isr-but-one") == ["broker-0"]
    assert pick(role="controller") == ["controller"]
    assert pick(broker=2) == ["broker-2"]
    assert pick(role="isr-member", mode="fixed", value=5) == ["broker-0", "broker-1"]
    assert len(pick(role="isr-member", mode="fixed-percent", value=50)) == 1


def test_an_offline_partition_has_no_leader_to_hit() -> None:
    with pytest.raises(TargetError, match="no leader of t-1"):
        pick(role="leader", partition=1)


def test_mode_one_is_seeded() -> None:
    selector = TargetSelector(role="isr-member")
    picks = {tuple(resolve(selector, CONTROLLER, "t", random.Random(seed))) for seed in range(20)}
    assert picks == {("broker-0",), ("broker-1",)}
    assert resolve(selector, CONTROLLER, "t", random.Random(4)) == \
        resolve(selector, CONTROLLER, "t", random.Random(4))


def test_role_labels_name_the_topic() -> None:
    assert role_label(TargetSelector(role="leader"), "orders") == "leader of orders-0"
    assert role_label(TargetSelector(broker=2), "orders") == "broker 2"


def test_outcomes() -> None:
    not_enough = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS)
    assert classify(not_enough, retries=0) == "fail"
    # With retries an earlier attempt may have been appended: indeterminate.
    assert classify(not_enough, retries=3) == "info"
    assert classify(KafkaError(KafkaError._MSG_TIMED_OUT), retries=0) == "info"
    after_append = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
    assert classify(after_append, retries=0) == "info"
    assert decode_value(b"p3-17|xxxxxxxx") == "p3-17"
    assert decode_value(None) == ""
