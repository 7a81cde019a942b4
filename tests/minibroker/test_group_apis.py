"""The group coordinator's wire handlers (``network/group_apis.py``) at every version
minibroker serves: any request kio can encode gets a response of that version that encodes
and decodes again; FindCoordinator names the leader of the group's ``__consumer_offsets``
partition and, while the topic does not exist, asks for it once."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.find_coordinator.v1 import request as find_v1
from kio.schema.find_coordinator.v4 import request as find_v4
from kio.schema.join_group.v5 import request as join_v5

from minibroker.cluster.scheduler import AsyncioScheduler
from minibroker.cluster.types import (
    BrokerEndpoint,
    ErrorCode,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicImage,
    TopicPartition,
)
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC, partition_for
from minibroker.events import ReplicationEventLog
from minibroker.network.apis import KafkaApis
from minibroker.network.codec import (
    SUPPORTED_API_VERSIONS,
    ApiKey,
    Request,
    decode_response,
    encode_response,
    request_schema,
    response_schema,
)

GROUP_APIS = [ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH,
              ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS]
SERVED = [(api, v) for api in GROUP_APIS
          for v in range(SUPPORTED_API_VERSIONS[api][0], SUPPORTED_API_VERSIONS[api][1] + 1)]
PARTITIONS = 3


class Broker:
    """What the handlers need of a broker: broker 1 leads every partition of
    ``__consumer_offsets`` (or the topic is missing), its coordinator, the controller."""

    def __init__(self, tmp_path: Any, *, with_topic: bool = True) -> None:
        reg = PartitionRegistration((1, 2), (1, 2), 1, 0, 0)
        topics = {"t": TopicImage("t", "11" * 16, {}, {0: reg})}
        if with_topic:
            topics[OFFSETS_TOPIC] = TopicImage(OFFSETS_TOPIC, "00" * 16, {},
                                               dict.fromkeys(range(PARTITIONS), reg))
        self.image = MetadataImage(1, {1: BrokerEndpoint(1, "host-1", 9001)}, topics)
        self.created: list[tuple[str, int, int, dict[str, str]]] = []
        self.group_coordinator = GroupCoordinator(
            1, AsyncioScheduler(asyncio.get_running_loop()),
            config={"group.initial.rebalance.delay.ms": "0"},
            events=ReplicationEventLog(tmp_path), append=self._append,
            local_partition=lambda _tp: None, metadata_image=lambda: self.image)
        for partition in range(PARTITIONS):
            self.group_coordinator.on_leadership_change(
                TopicPartition(OFFSETS_TOPIC, partition), True, 0)

    @staticmethod
    def _append(*, acks: int, timeout_ms: int, entries: dict, on_complete: Any) -> None:
        on_complete({tp: ProduceResult(ErrorCode.none, base_offset=0) for tp in entries})

    def metadata_image(self) -> MetadataImage:
        return self.image

    def broker_config(self) -> dict[str, str]:
        return {}

    async def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                           config: dict[str, str]) -> tuple[ErrorCode, str | None]:
        self.created.append((name, num_partitions, replication_factor, config))
        return ErrorCode.none, None


async def until(condition: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Let the event loop run until ``condition`` holds: what the test waits for is state,
    not time (bounded, so a broken coordinator fails rather than hangs)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.001)


async def answer(broker: Broker, api: ApiKey, version: int, body: Any) -> Any:
    await until(lambda: not broker.group_coordinator.state()["loading_partitions"],
                "the coordinator to load its (empty) partitions")
    response = await asyncio.wait_for(
        KafkaApis(broker).handle(Request(api, version, 7, "test", body)), 5)
    frame = encode_response(7, response)
    correlation_id, decoded = decode_response(frame[4:], response_schema(api, version))
    assert (correlation_id, decoded) == (7, response)
    return response


@pytest.mark.parametrize(("api", "version"), SERVED)
def test_every_served_version_answers_any_request_with_its_own_response(
        tmp_path: Any, api: ApiKey, version: int) -> None:
    body_type = request_schema(api, version)

    @settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(body_type))
    def check(body: Any) -> None:
        async def main() -> None:
            response = await answer(Broker(tmp_path), api, version, body)
            assert type(response).__version__ == version

        asyncio.run(main())

    check()


def test_find_coordinator_names_the_leader_of_the_groups_partition(tmp_path: Any) -> None:
    async def main() -> None:
        broker = Broker(tmp_path)
        single = await answer(broker, ApiKey.FIND_COORDINATOR, 1,
                              find_v1.FindCoordinatorRequest(key="g", key_type=0))
        assert (single.error_code, single.node_id, single.host, single.port) == (
            ErrorCode.none, 1, "host-1", 9001)
        batch = await answer(broker, ApiKey.FIND_COORDINATOR, 4, find_v4.FindCoordinatorRequest(
            key_type=0, coordinator_keys=("a", "b")))
        assert [(c.key, c.node_id) for c in batch.coordinators] == [("a", 1), ("b", 1)]
        unknown = await answer(broker, ApiKey.FIND_COORDINATOR, 4,
                               find_v4.FindCoordinatorRequest(key_type=2, coordinator_keys=("x",)))
        assert unknown.coordinators[0].error_code == ErrorCode.invalid_request

    asyncio.run(main())


def test_find_coordinator_asks_for_the_offsets_topic_once_while_it_is_missing(
        tmp_path: Any) -> None:
    async def main() -> None:
        broker = Broker(tmp_path, with_topic=False)
        apis = KafkaApis(broker)
        request = Request(ApiKey.FIND_COORDINATOR, 1, 1, "t",
                          find_v1.FindCoordinatorRequest(key="g", key_type=0))
        first, second = await apis.handle(request), await apis.handle(request)
        assert first.error_code == second.error_code == ErrorCode.coordinator_not_available
        await until(lambda: broker.created, "the request to create the offsets topic")
        assert broker.created == [(OFFSETS_TOPIC, 10, 3, {"cleanup.policy": "compact"})]

    asyncio.run(main())


def test_join_group_v5_two_steps_through_the_wire_handler(tmp_path: Any) -> None:
    async def main() -> None:
        broker = Broker(tmp_path)

        def join(member_id: str) -> join_v5.JoinGroupRequest:
            return join_v5.JoinGroupRequest(
                group_id="g", session_timeout=datetime.timedelta(seconds=10),
                rebalance_timeout=datetime.timedelta(seconds=30), member_id=member_id,
                group_instance_id=None, protocol_type="consumer",
                protocols=(join_v5.JoinGroupRequestProtocol(name="range", metadata=b"s"),))

        first = await answer(broker, ApiKey.JOIN_GROUP, 5, join(""))
        assert first.error_code == ErrorCode.member_id_required
        joined = await answer(broker, ApiKey.JOIN_GROUP, 5, join(first.member_id))
        assert (joined.error_code, joined.generation_id, joined.leader) == (
            ErrorCode.none, 1, first.member_id)
        assert joined.protocol_name == "range"
        group = broker.group_coordinator.manager.get_group("g")
        assert group is not None and group.members[first.member_id].client_host == ""
        assert partition_for("g", PARTITIONS) in broker.group_coordinator.manager.owned_partitions

    asyncio.run(main())
