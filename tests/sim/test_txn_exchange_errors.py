"""The simulated clients read a transactional exchange's per-partition answer as librdkafka
does: the first partition error stands for the request, none when every partition took it."""

from __future__ import annotations

from types import SimpleNamespace

from minibroker.cluster.types import ErrorCode, TopicPartition
from undertow.sim.kafka_endpoint import _add_partitions_to_txn, _txn_offset_commit


def test_the_first_partition_error_stands_for_the_request() -> None:
    add = _add_partitions_to_txn(("tx", 1, 0, [TopicPartition("t", 0), TopicPartition("t", 1)]))
    assert add.decode is not None

    def added(*codes: int) -> SimpleNamespace:
        return SimpleNamespace(results_by_topic_v3_and_below=[SimpleNamespace(
            results_by_partition=[SimpleNamespace(partition_error_code=c) for c in codes])])

    assert add.decode(added(0, 0)) == ErrorCode.none
    assert add.decode(added(0, ErrorCode.concurrent_transactions)) == \
        ErrorCode.concurrent_transactions
    commit = _txn_offset_commit({
        "transactional_id": "tx", "group_id": "g", "producer_id": 1, "epoch": 0,
        "generation_id": 3, "member_id": "m", "instance_id": None,
        "offsets": {TopicPartition("t", 0): 5}})
    assert commit.decode is not None

    def committed(*codes: int) -> SimpleNamespace:
        return SimpleNamespace(topics=[SimpleNamespace(
            partitions=[SimpleNamespace(error_code=c) for c in codes])])

    assert commit.decode(committed(0)) == ErrorCode.none
    assert commit.decode(committed(ErrorCode.illegal_generation, 0)) == \
        ErrorCode.illegal_generation
