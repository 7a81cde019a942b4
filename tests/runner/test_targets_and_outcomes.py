"""Pure pieces of the runner: resolving target selectors from the cluster view, and
classifying a send's outcome."""

from __future__ import annotations

import random
import sys

import pytest
from confluent_kafka import KafkaError

from undertow.cluster_view import view_from_states
from undertow.runner.group_member import commit_outcome, generation_of
from undertow.runner.outcomes import LeaderEpochGate, classify
from undertow.runner.targets import TargetError, resolve, role_label
from undertow.runner.transactional_producer import aborts
from undertow.runner.values import decode_value
from undertow.spec import TargetSelector

CONTROLLER = view_from_states({
    "brokers": [{"id": 0, "fenced": False}, {"id": 1, "fenced": False},
                {"id": 2, "fenced": True}],
    "topics": {"t": {"partitions": {
        "0": {"leader": 1, "isr": [1, 0], "replicas": [0, 1, 2], "leader_epoch": 3},
        "1": {"leader": -1, "isr": [2], "replicas": [2, 0, 1], "leader_epoch": 5},
    }}},
})


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


def test_a_node_that_cannot_take_the_fault_is_no_candidate() -> None:
    """Broker 1 leads in the metadata but another fault holds it down: until the controller
    fences it, there is no leader to hit, and the follower role names only broker 0."""
    def down(node: str) -> str | None:
        return "is not running" if node == "broker-1" else None

    with pytest.raises(TargetError, match="no leader of t-0 can take it right now: "
                                          "broker-1 is not running"):
        resolve(TargetSelector(role="leader"), CONTROLLER, "t", random.Random(1), None, down)
    assert resolve(TargetSelector(role="isr-member", mode="all"), CONTROLLER, "t",
                   random.Random(1), None, down) == ["broker-0"]
    with pytest.raises(TargetError, match="no broker 1 can take it right now"):
        resolve(TargetSelector(broker=1), CONTROLLER, "t", random.Random(1), None, down)


def test_mode_one_is_seeded() -> None:
    selector = TargetSelector(role="isr-member")
    picks = {tuple(resolve(selector, CONTROLLER, "t", random.Random(seed))) for seed in range(20)}
    assert picks == {("broker-0",), ("broker-1",)}
    assert resolve(selector, CONTROLLER, "t", random.Random(4)) == \
        resolve(selector, CONTROLLER, "t", random.Random(4))


def test_the_group_coordinator_is_the_leader_of_the_groups_offsets_partition() -> None:
    """Kafka's partitionFor: abs(String.hashCode) % partitions; "g".hashCode() is 103, so
    group g lives in partition 103 % 4 = 3, and "polygenelubricants".hashCode() is
    Integer.MIN_VALUE, which Kafka's Utils.abs maps to 0."""
    offsets = {str(p): {"leader": p % 3, "isr": [p % 3], "replicas": [p % 3],
                        "leader_epoch": 0} for p in range(4)}
    view = view_from_states({"brokers": [{"id": b, "fenced": False} for b in range(3)],
                             "topics": {"t": {"partitions": {}},
                                        "__consumer_offsets": {"partitions": offsets}}})
    assert view.group_partition("g").partition == 3
    assert view.group_partition("polygenelubricants").partition == 0
    coordinator = TargetSelector(role="group-coordinator")
    assert resolve(coordinator, view, "t", random.Random(1), "g") == ["broker-0"]
    assert resolve(coordinator, view, "t", random.Random(1), "polygenelubricants") == \
        ["broker-0"]
    with pytest.raises(TargetError, match="__consumer_offsets does not exist yet"):
        resolve(coordinator, CONTROLLER, "t", random.Random(1), "g")
    with pytest.raises(TargetError, match="no consumer group"):
        resolve(coordinator, view, "t", random.Random(1), None)


def test_the_txn_coordinator_is_the_leader_of_the_first_producers_state_partition() -> None:
    """TransactionStateManager.partitionFor: "undertow-p0".hashCode() is 1165093033, so its
    state lives in partition 1165093033 % 10 = 3 of __transaction_state."""
    state = {str(p): {"leader": 2 if p == 3 else 0, "isr": [0], "replicas": [0],
                      "leader_epoch": 0} for p in range(10)}
    view = view_from_states({"brokers": [{"id": b, "fenced": False} for b in range(3)],
                             "topics": {"t": {"partitions": {}},
                                        "__transaction_state": {"partitions": state}}})
    assert view.transaction_partition("undertow-p0").partition == 3
    coordinator = TargetSelector(role="txn-coordinator")
    assert resolve(coordinator, view, "t", random.Random(1)) == ["broker-2"]
    with pytest.raises(TargetError, match="__transaction_state does not exist yet"):
        resolve(coordinator, CONTROLLER, "t", random.Random(1))
    state["3"]["leader"] = -1
    offline = view_from_states({"brokers": [{"id": 0, "fenced": False}],
                                "topics": {"__transaction_state": {"partitions": state}}})
    with pytest.raises(TargetError, match="__transaction_state-3 has no leader"):
        resolve(coordinator, offline, "t", random.Random(1))


def test_a_members_generation_and_commit_outcomes() -> None:
    # librdkafka's serialized consumer group metadata: magic, generation (host byte order),
    # group, member...
    seven = (7).to_bytes(4, sys.byteorder)
    assert generation_of(b"CGMDv2:" + seven + b"g\x00m-1\x00\x01") == 7
    assert generation_of(b"CGMDv2:\xff\xff\xff\xffg\x00\x00\x01") is None  # no join yet
    assert generation_of(b"other") is None
    assert commit_outcome(None) == ("ok", None)
    assert commit_outcome(KafkaError(KafkaError.ILLEGAL_GENERATION)) == (
        "fail", "ILLEGAL_GENERATION")
    assert commit_outcome(KafkaError(KafkaError.REQUEST_TIMED_OUT)) == (
        "info", "REQUEST_TIMED_OUT")
    assert commit_outcome(KafkaError(KafkaError.NOT_COORDINATOR)) == ("info", "NOT_COORDINATOR")


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
    # A leader that steps down answers NOT_LEADER_OR_FOLLOWER for records it had appended.
    assert classify(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), retries=0) == "info"
    assert decode_value(b"p3-17|xxxxxxxx") == "p3-17"
    assert decode_value(None) == ""


def refused(t_invoke: float, t_complete: float, partition: int = 0) -> dict:
    return {"producer": "p0", "value": f"p0-{t_invoke}", "topic": "t", "partition": partition,
            "status": "fail", "offset": None, "error": "NOT_ENOUGH_REPLICAS",
            "t_invoke": t_invoke, "t_complete": t_complete}


def sampled(t: float, epochs: dict[int, int]) -> list[dict]:
    return [{"t": t, "topic": "t", "partition": p, "leader_epoch": e} for p, e in epochs.items()]


def test_a_refusal_stays_definite_only_while_the_leader_epoch_holds() -> None:
    settled: list[dict] = []
    gate = LeaderEpochGate(settled.append)
    gate.observe(100.0, sampled(100.1, {0: 3, 1: 7}))
    gate.hold(refused(101.0, 102.0, partition=0))
    gate.hold(refused(101.0, 102.0, partition=1))
    assert settled == []  # no sample began after the completions yet
    gate.observe(101.5, sampled(101.6, {0: 3, 1: 7}))
    assert settled == []
    # Partition 1 changed leader while its send was out: librdkafka may have re-sent it after
    # NOT_LEADER_OR_FOLLOWER, the first attempt appended.
    gate.observe(102.5, sampled(102.6, {0: 3, 1: 8}))
    assert [(r["partition"], r["status"]) for r in settled] == [(0, "fail"), (1, "info")]
    assert settled[1]["error"] == "NOT_ENOUGH_REPLICAS"  # what the client said is kept
    # A leader change before the invocation does not matter; one seen after it does.
    gate.hold(refused(103.0, 103.5, partition=1))
    gate.hold(refused(102.55, 103.5, partition=1))
    gate.observe(104.0, sampled(104.1, {0: 3, 1: 8}))
    assert [r["status"] for r in settled[2:]] == ["fail", "info"]
    # Completed before a round that already ran: settled at once.
    gate.hold(refused(103.6, 103.9, partition=0))
    assert settled[-1]["status"] == "fail" and len(settled) == 5


def test_what_the_gate_cannot_confirm_is_indeterminate() -> None:
    settled: list[dict] = []
    gate = LeaderEpochGate(settled.append)
    gate.hold(refused(1.0, 2.0))  # no sample before the invocation
    gate.observe(3.0, sampled(3.1, {0: 1}))
    gate.hold(refused(4.0, 5.0))  # the controller never answered again
    gate.observe(6.0, [])
    gate.close()
    gate.hold(refused(7.0, 8.0))  # after the run
    assert [r["status"] for r in settled] == ["info", "info", "info"]


def test_a_partition_missing_from_the_metadata_is_named() -> None:
    with pytest.raises(TargetError, match="partition t-7 is not in the cluster's metadata"):
        pick(role="leader", partition=7)


def test_the_aborted_transactions_are_spread_evenly() -> None:
    assert [n for n in range(30) if aborts(n, 0.1)] == [9, 19, 29]
    assert [n for n in range(12) if aborts(n, 0.25)] == [3, 7, 11]
    assert not any(aborts(n, 0.0) for n in range(50))
    assert all(aborts(n, 1.0) for n in range(50))
