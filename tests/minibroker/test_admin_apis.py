"""DeleteTopics, CreatePartitions and DescribeConfigs through a real socket, each version
minibroker serves, with ``test_network_apis``' in-memory broker: what the handlers check
themselves (Kafka's ``ControllerApis`` request checks, ``ConfigHelper.describeConfigs``),
what they forward to the controller, and each version's answer."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from test_network_apis import (
    ORDERS_ID,
    FakeBroker,
    build,
    call,
    request_module,
    run,
    versions,
)

from minibroker.cluster.types import ErrorCode, NewPartitions, TopicDeletion
from minibroker.config import CONFIG_DEFS
from minibroker.network.codec import ApiKey

_ZERO = uuid.UUID(int=0)
TIMEOUT = datetime.timedelta(seconds=5)


class AdminFakeBroker(FakeBroker):
    """Records what is forwarded; the controller knows only ``orders``."""

    def __init__(self) -> None:
        super().__init__()
        self.deletions: list[tuple[list[str], list[str]]] = []
        self.growths: list[tuple[list[NewPartitions], bool]] = []
        self.deletion_error = ErrorCode.none

    async def delete_topics(self, names: list[str], topic_ids: list[str]
                            ) -> list[TopicDeletion]:
        self.deletions.append((names, topic_ids))
        return [TopicDeletion(n, ORDERS_ID.hex if n == "orders" else None,
                              self.deletion_error if n == "orders"
                              else ErrorCode.unknown_topic_or_partition) for n in names] + [
            TopicDeletion("orders" if i == ORDERS_ID.hex else None, i,
                          self.deletion_error if i == ORDERS_ID.hex
                          else ErrorCode.unknown_topic_id) for i in topic_ids]

    async def create_partitions(self, topics: list[NewPartitions], validate_only: bool
                                ) -> list[tuple[ErrorCode, str | None]]:
        self.growths.append((topics, validate_only))
        return [(ErrorCode.none, None)] * len(topics)


def run_admin(scenario: Any) -> None:
    run(scenario, AdminFakeBroker())


def delete_request(version: int, *topics: tuple[str | None, uuid.UUID | None]) -> Any:
    m = request_module(ApiKey.DELETE_TOPICS, version)
    if version >= 6:
        return m.DeleteTopicsRequest(timeout=TIMEOUT, topics=tuple(
            m.DeleteTopicState(name=name, topic_id=topic_id or _ZERO)
            for name, topic_id in topics))
    return m.DeleteTopicsRequest(timeout=TIMEOUT, topic_names=tuple(n for n, _ in topics))


@pytest.mark.parametrize("version", versions(ApiKey.DELETE_TOPICS))
def test_delete_topics_checks_duplicates_and_forwards_the_rest(version: int) -> None:
    async def scenario(broker: AdminFakeBroker, port: int) -> None:
        response = await call(port, delete_request(
            version, ("orders", None), ("dup", None), ("dup", None), ("nope", None)))
        answers = {r.name: r for r in response.responses}
        assert answers["orders"].error_code == ErrorCode.none
        assert answers["dup"].error_code == ErrorCode.invalid_request
        assert answers["nope"].error_code == ErrorCode.unknown_topic_or_partition
        assert len(response.responses) == 3
        assert broker.deletions == [(["orders", "nope"], [])]
        if version >= 5:
            assert answers["dup"].error_message == "Duplicate topic name."
        if version >= 6:
            assert answers["orders"].topic_id == ORDERS_ID

    run_admin(scenario)


def test_delete_topics_v6_by_id_and_the_requests_kafka_refuses() -> None:
    async def scenario(broker: AdminFakeBroker, port: int) -> None:
        other = uuid.uuid4()
        response = await call(port, delete_request(
            6, (None, ORDERS_ID), ("both", other), (None, None), (None, other), (None, other)))
        answers = [(r.name, r.topic_id, r.error_code, r.error_message)
                   for r in response.responses]
        assert answers == [
            ("both", other, ErrorCode.invalid_request,
             "You may not specify both topic name and topic id."),
            # kio reads the zero id as None.
            (None, None, ErrorCode.invalid_request, "Neither topic name nor id were specified."),
            (None, other, ErrorCode.invalid_request, "Duplicate topic id."),
            ("orders", ORDERS_ID, ErrorCode.none, None)]
        assert broker.deletions == [([], [ORDERS_ID.hex])]

    run_admin(scenario)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_deletion_disabled_is_invalid_request_before_v3(version: int) -> None:
    """ControllerApis.deleteTopics: TOPIC_DELETION_DISABLED exists from v3."""
    async def scenario(broker: AdminFakeBroker, port: int) -> None:
        broker.deletion_error = ErrorCode.topic_deletion_disabled
        (answer,) = (await call(port, delete_request(version, ("orders", None)))).responses
        assert answer.error_code == (ErrorCode.topic_deletion_disabled if version >= 3
                                     else ErrorCode.invalid_request)

    run_admin(scenario)


@pytest.mark.parametrize("version", versions(ApiKey.CREATE_PARTITIONS))
def test_create_partitions_checks_duplicates_and_forwards_the_rest(version: int) -> None:
    async def scenario(broker: AdminFakeBroker, port: int) -> None:
        m = request_module(ApiKey.CREATE_PARTITIONS, version)
        response = await call(port, m.CreatePartitionsRequest(timeout=TIMEOUT,
                                                              validate_only=True, topics=(
            m.CreatePartitionsTopic(name="orders", count=4, assignments=(
                m.CreatePartitionsAssignment(broker_ids=(2, 1)),
                m.CreatePartitionsAssignment(broker_ids=(1, 2)))),
            m.CreatePartitionsTopic(name="dup", count=2, assignments=None),
            m.CreatePartitionsTopic(name="dup", count=3, assignments=None))))
        assert [(r.name, r.error_code, r.error_message) for r in response.results] == [
            ("dup", ErrorCode.invalid_request, "Duplicate topic name."),
            ("orders", ErrorCode.none, None)]
        assert broker.growths == [([NewPartitions("orders", 4, ((2, 1), (1, 2)))], True)]

    run_admin(scenario)


def describe_request(version: int, *resources: tuple[int, str, tuple[str, ...] | None],
                     synonyms: bool = False, documentation: bool = False) -> Any:
    m = request_module(ApiKey.DESCRIBE_CONFIGS, version)
    return build(
        m.DescribeConfigsRequest,
        resources=tuple(m.DescribeConfigsResource(resource_type=t, resource_name=n,
                                                  configuration_keys=k)
                        for t, n, k in resources),
        include_synonyms=synonyms, include_documentation=documentation)


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_configs_gives_each_topic_configs_source_and_synonyms(version: int) -> None:
    async def scenario(broker: AdminFakeBroker, port: int) -> None:
        topic = broker.image.topics["orders"]
        topic.config["min.insync.replicas"] = "2"
        broker.config.update({"min.insync.replicas": "3",
                              "unclean.leader.election.enable": "true"})
        response = await call(port, describe_request(version, (2, "orders", None),
                                                     synonyms=True, documentation=True))
        (result,) = response.results
        assert (result.error_code, result.resource_name) == (ErrorCode.none, "orders")
        configs = {c.name: c for c in result.configs}
        assert set(configs) == {d.name for d in CONFIG_DEFS.values() if d.topic_level}
        min_isr = configs["min.insync.replicas"]
        assert (min_isr.value, min_isr.config_source, min_isr.read_only) == ("2", 1, False)
        assert [(s.value, s.source) for s in min_isr.synonyms] == [
            ("2", 1), ("3", 4), ("1", 5)]  # topic, static broker, default
        unclean = configs["unclean.leader.election.enable"]
        assert (unclean.value, unclean.config_source) == ("true", 4)
        flush = configs["log.flush.interval.ms"]
        assert (flush.value, flush.config_source, flush.synonyms) == (None, 5, ())
        if version >= 3:
            assert (min_isr.config_type, unclean.config_type, flush.config_type) == (3, 1, 5)
            assert min_isr.documentation == CONFIG_DEFS["min.insync.replicas"].doc
        # Only the keys asked for, and no synonyms unless asked.
        (only,) = (await call(port, describe_request(
            version, (2, "orders", ("min.insync.replicas", "no.such")),))).results
        assert [(c.name, c.synonyms) for c in only.configs] == [("min.insync.replicas", ())]

    run_admin(scenario)


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_configs_errors_and_broker_configs(version: int) -> None:
    async def scenario(broker: AdminFakeBroker, port: int) -> None:
        broker.config["offsets.topic.num.partitions"] = "3"
        response = await call(port, describe_request(
            version, (2, "nope", None), (2, "bad name", None), (4, "1", None), (4, "7", None),
            (4, "", None), (8, "1", None)))
        answers = [(r.error_code, r.error_message) for r in response.results]
        assert answers[0] == (ErrorCode.unknown_topic_or_partition, None)
        assert answers[1][0] == ErrorCode.invalid_topic_exception
        assert answers[2] == (ErrorCode.none, None)
        assert answers[3] == (ErrorCode.invalid_request, "Unexpected broker id, expected 1 or "
                                                         "empty string, but received 7")
        assert answers[4] == (ErrorCode.none, None) and response.results[4].configs == ()
        assert answers[5] == (ErrorCode.invalid_request, "Unsupported resource type: 8")
        configs = {c.name: c for c in response.results[2].configs}
        assert set(configs) == set(CONFIG_DEFS)
        partitions = configs["offsets.topic.num.partitions"]
        assert (partitions.value, partitions.config_source, partitions.read_only) == (
            "3", 4, True)

    run_admin(scenario)
