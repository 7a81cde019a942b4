"""AlterPartition batching (Kafka's AlterPartitionManager): one request in flight, the
changes queued meanwhile in the next, each item answered with its own result, a lost
request answered REQUEST_TIMED_OUT for every item."""

from __future__ import annotations

from collections.abc import Callable

from minibroker.cluster import alter_partition_manager
from minibroker.cluster.alter_partition_manager import AlterPartitionManager, Answer
from minibroker.cluster.partition import AlterPartitionRequest
from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.events import IsrChangeReason


def request(partition: int) -> AlterPartitionRequest:
    return AlterPartitionRequest(TopicPartition("t", partition), 0, 0, (1,),
                                 IsrChangeReason.LAG, "a test")


class Controller:
    """Holds each transmitted batch until the test answers it."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[int], Callable[[list[Answer] | None], None]]] = []

    def transmit(self, batch: list[AlterPartitionRequest],
                 answered: Callable[[list[Answer] | None], None]) -> None:
        self.batches.append(([r.tp.partition for r in batch], answered))


def test_one_request_in_flight_and_the_rest_in_the_next(monkeypatch) -> None:
    monkeypatch.setattr(alter_partition_manager, "MAX_ALTER_PARTITION_ITEMS", 2)
    controller = Controller()
    manager = AlterPartitionManager(controller.transmit)
    got: dict[int, ErrorCode] = {}

    def send(partition: int) -> None:
        manager.send(request(partition), lambda error, _reg: got.__setitem__(partition, error))

    for partition in range(4):
        send(partition)
    assert [b for b, _ in controller.batches] == [[0]]  # the others wait for its answer
    controller.batches[0][1]([(ErrorCode.none, None)])
    assert got == {0: ErrorCode.none}
    assert [b for b, _ in controller.batches] == [[0], [1, 2]]  # at most 2 a request
    controller.batches[1][1](None)  # lost
    assert got == {0: ErrorCode.none, 1: ErrorCode.request_timed_out,
                   2: ErrorCode.request_timed_out}
    assert [b for b, _ in controller.batches] == [[0], [1, 2], [3]]


def test_a_change_an_answer_causes_goes_in_the_next_request() -> None:
    controller = Controller()
    manager = AlterPartitionManager(controller.transmit)
    manager.send(request(0), lambda _error, _reg: manager.send(request(9), lambda *_: None))
    manager.send(request(1), lambda *_: None)
    controller.batches[0][1]([(ErrorCode.invalid_update_version, None)])
    assert [b for b, _ in controller.batches] == [[0], [1, 9]]
