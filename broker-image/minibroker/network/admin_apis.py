"""DeleteTopics and CreatePartitions: admin requests a broker forwards to the controller, as
Kafka 4.2's brokers do (``KafkaApis.forwardToController``). The request-shape checks of
Kafka's ``ControllerApis`` (duplicate names, a topic named both by name and by id, or by
neither) are made here, and what remains goes to the controller in one call, which answers
topic by topic (``QuorumController.delete_topics``, ``create_partitions``).

Unlike Kafka, the answers are not shuffled (``ControllerApis.deleteTopics`` shuffles them so
that their order cannot tell absent topics from forbidden ones; minibroker has no ACLs, and a
fixed order keeps a simulation's runs identical)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import ErrorCode, NewPartitions, TopicDeletion
from minibroker.network.codec import ApiKey, Request
from minibroker.network.responses import NO_THROTTLE, build, response_module

__all__ = ["AdminApis", "AdminBroker"]

_ZERO_UUID = uuid.UUID(int=0)
_DELETE_TOPICS_BY_ID = 6  # DeleteTopics v6 names topics by id too (KIP-516)
_TOPIC_DELETION_DISABLED_ERROR = 3  # the first DeleteTopics version that has the error


class AdminBroker(Protocol):
    """What AdminApis needs of the broker: the controller calls it forwards."""

    async def delete_topics(self, names: list[str], topic_ids: list[str]
                            ) -> list[TopicDeletion]: ...

    async def create_partitions(self, topics: list[NewPartitions], validate_only: bool
                                ) -> list[tuple[ErrorCode, str | None]]: ...


class AdminApis:
    """The handlers of DeleteTopics and CreatePartitions, for ``KafkaApis``."""

    def __init__(self, broker: AdminBroker) -> None:
        self._broker = broker

    # -- DeleteTopics --------------------------------------------------------------------

    async def handle_delete_topics(self, request: Request) -> ResponsePayload:
        """Kafka 4.2's ``ControllerApis.deleteTopics``: each name and id once (a duplicate
        is INVALID_REQUEST, and so is a topic given both a name and an id, or neither),
        then the controller deletes the rest. Waits at most the request's timeout."""
        body, version = request.body, request.api_version
        m = response_module(ApiKey.DELETE_TOPICS, version)
        if version >= _DELETE_TOPICS_BY_ID:
            given = [(t.name, t.topic_id) for t in body.topics]
        else:
            given = [(name, None) for name in body.topic_names]
        results: list[TopicDeletion] = []
        names: dict[str, int] = {}
        ids: dict[str, int] = {}
        for name, topic_id in given:
            by_id = topic_id is not None and topic_id != _ZERO_UUID
            if name is None and not by_id:
                results.append(TopicDeletion(None, None, ErrorCode.invalid_request,
                                             "Neither topic name nor id were specified."))
            elif name is not None and by_id:
                results.append(TopicDeletion(name, topic_id.hex, ErrorCode.invalid_request,
                                             "You may not specify both topic name and topic "
                                             "id."))
            elif name is not None:
                names[name] = names.get(name, 0) + 1
            else:
                ids[topic_id.hex] = ids.get(topic_id.hex, 0) + 1
        results += [TopicDeletion(name, None, ErrorCode.invalid_request, "Duplicate topic name.")
                    for name, count in names.items() if count > 1]
        results += [TopicDeletion(None, topic_id, ErrorCode.invalid_request,
                                  "Duplicate topic id.")
                    for topic_id, count in ids.items() if count > 1]
        unique_names = [name for name, count in names.items() if count == 1]
        unique_ids = [topic_id for topic_id, count in ids.items() if count == 1]
        timeout = body.timeout.total_seconds()
        if unique_names or unique_ids:
            try:
                results += await asyncio.wait_for(
                    self._broker.delete_topics(unique_names, unique_ids), timeout)
            except TimeoutError:
                results += [TopicDeletion(name, topic_id, ErrorCode.request_timed_out,
                                          f"not deleted within {timeout:g} s")
                            for name, topic_id in [*((n, None) for n in unique_names),
                                                   *((None, i) for i in unique_ids)]]
        return build(m.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(
            self._deletion_result(m, version, result) for result in results))

    @staticmethod
    def _deletion_result(m: Any, version: int, result: TopicDeletion) -> Any:
        error, message = result.error, result.message
        if error == ErrorCode.topic_deletion_disabled and version < \
                _TOPIC_DELETION_DISABLED_ERROR:
            error, message = (ErrorCode.invalid_request,
                              "This version does not support topic deletion.")
        return build(m.DeletableTopicResult,
                     name=result.name if version >= _DELETE_TOPICS_BY_ID else result.name or "",
                     topic_id=uuid.UUID(result.topic_id) if result.topic_id else _ZERO_UUID,
                     error_code=error, error_message=message)

    # -- CreatePartitions ----------------------------------------------------------------

    async def handle_create_partitions(self, request: Request) -> ResponsePayload:
        """Kafka 4.2's ``ControllerApis.createPartitions``: a topic named twice is
        INVALID_REQUEST ("Duplicate topic name."), the others go to the controller together
        (``QuorumController.create_partitions``). Waits at most the request's timeout."""
        body = request.body
        m = response_module(ApiKey.CREATE_PARTITIONS, request.api_version)
        counts: dict[str, int] = {}
        for topic in body.topics:
            counts[topic.name] = counts.get(topic.name, 0) + 1
        results = [(name, ErrorCode.invalid_request, "Duplicate topic name.")
                   for name, count in counts.items() if count > 1]
        wanted = [NewPartitions(t.name, t.count, None if t.assignments is None else tuple(
                      tuple(a.broker_ids) for a in t.assignments))
                  for t in body.topics if counts[t.name] == 1]
        timeout = body.timeout.total_seconds()
        if wanted:
            try:
                outcomes = await asyncio.wait_for(
                    self._broker.create_partitions(wanted, body.validate_only), timeout)
            except TimeoutError:
                outcomes = [(ErrorCode.request_timed_out,
                             f"not created within {timeout:g} s")] * len(wanted)
            results += [(t.name, error, message)
                        for t, (error, message) in zip(wanted, outcomes, strict=True)]
        return build(m.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(
            m.CreatePartitionsTopicResult(name=name, error_code=error, error_message=message)
            for name, error, message in results))
