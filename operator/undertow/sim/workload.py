"""The run's workload in simulation: `runner.workload.Workload` and `drain` over the
librdkafka-like client models (`sim.clients`, `sim.group_member`), in any simulated world.

A world says where its clients run (`ClientSide`): in `sim.simulated_world.SimulatedWorld`,
as Kafka clients of the real brokers on the virtual loop, each client a host of the virtual
network with connections of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from undertow.runner.history import HistoryWriter
from undertow.runner.workload import (
    END_OFFSETS_SHARE,
    ISOLATION_LEVEL,
    MEMBERS_CLOSE_TIMEOUT_S,
    SendOutcomes,
    WorkloadConfig,
    message_timeout_ms,
    outcomes_wait_s,
)
from undertow.sim.clients import Endpoint, SimConsumer, SimProducer
from undertow.sim.consumer_member import SimConsumerMember
from undertow.sim.group_member import SimGroupMember
from undertow.sim.pipeline import SimPipeline, SimPipelineProcess
from undertow.sim.transactional_producer import SimTransactionalProducer

log = logging.getLogger("undertow.sim")

class ClientSide(Protocol):
    """Where a simulated world's client models run."""

    def now(self) -> float:
        """The history's clock."""

    def endpoint(self, client: str, topic: str | None = None) -> Endpoint:
        """The transport of client `client` (`p0`, `c1`, `drain`), called among its code,
        with the metadata of `topic` (default the experiment's)."""

    def among(self, client: str, action: Callable[[], None]) -> None:
        """Run `action` as client `client`'s code (on its host, with its connections)."""

    def later(self, client: str, delay_s: float, action: Callable[[], None]) -> None: ...

    def settle(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Run the world until `condition` holds (True) or `timeout_s` pass (False)."""


def holds(condition: Callable[[], bool]) -> bool:
    """`condition()`, an error counting as not yet (as `RealWorld.until`'s)."""
    try:
        return condition()
    except Exception:
        return False


def reader(history: HistoryWriter, topic: str, phase: str
           ) -> Callable[[str, int, int, str, float], None]:
    def read(consumer: str, partition: int, offset: int, value: str, t: float) -> None:
        history.read(consumer=consumer, phase=phase, topic=topic, partition=partition,
                     offset=offset, value=value, t=t, isolation=ISOLATION_LEVEL)

    return read


class SimWorkload:
    """`runner.workload.Workload` over the client models: producers, the run's consumers (a
    group's members with `cfg.group`) and the rebalancer."""

    def __init__(self, side: ClientSide, cfg: WorkloadConfig, history: HistoryWriter) -> None:
        self._side = side
        self._cfg = cfg
        self._history = history
        self.outcomes = SendOutcomes(history)
        self.epoch_gate = self.outcomes.epoch_gate
        self.producers: list[SimProducer | SimTransactionalProducer] = []
        self.consumers: list[SimConsumer | SimGroupMember] = []
        self.pipeline = None if cfg.pipeline is None else SimPipeline(
            side, history, self._pipeline_process, cfg.consumers, cfg.pipeline.kill_every_s)

    def start(self) -> None:
        """Each client made and started as its own code: the consumers (or the pipeline's
        member processes), then the producers."""
        if self.pipeline is not None:
            self.pipeline.start()
        for i in range(self._cfg.consumers if self.pipeline is None else 0):
            self._side.among(f"c{i}", lambda i=i: self._start_consumer(i))
        for i in range(self._cfg.producers):
            self._side.among(f"p{i}", lambda i=i: self._start_producer(i))
        self._start_rebalancer()

    def _start_consumer(self, index: int) -> None:
        cfg, side, name = self._cfg, self._side, f"c{index}"
        consumer: SimConsumer | SimGroupMember
        if cfg.group is not None:
            member = (SimConsumerMember if cfg.group.group_protocol == "consumer"
                      else SimGroupMember)
            consumer = member(name, side.endpoint(name), cfg.topic, cfg.group, self._history,
                              side.now, first=index)
        else:
            consumer = SimConsumer(name, side.endpoint(name), cfg.topic, cfg.partitions,
                                   reader(self._history, cfg.topic, "run"), side.now,
                                   first=index)
        self.consumers.append(consumer)
        consumer.start()

    def _pipeline_process(self, slot: str, incarnation: int, index: int,
                          on_exit: Callable[[SimPipelineProcess], None]) -> SimPipelineProcess:
        cfg = self._cfg
        assert cfg.pipeline is not None and cfg.group is not None \
            and cfg.transactions is not None, "a pipeline's spec has a group and transactions"
        return SimPipelineProcess(
            slot, incarnation, index, self._side, cfg.topic, cfg.partitions, cfg.pipeline,
            cfg.group, cfg.transactions, cfg.request_timeout_ms, outcomes_wait_s(cfg) * 1000,
            self._history, self.outcomes.settled, on_exit)

    def _start_producer(self, index: int) -> None:
        cfg, endpoint = self._cfg, self._side.endpoint(f"p{index}")
        producer: SimProducer | SimTransactionalProducer
        if cfg.transactions is None:
            producer = SimProducer(index, endpoint, cfg, self.outcomes.submit, self._side.now)
        else:
            producer = SimTransactionalProducer(
                index, endpoint, cfg.topic, cfg.partitions, cfg.rate, cfg.record_size,
                cfg.transactions, cfg.request_timeout_ms, outcomes_wait_s(cfg) * 1000,
                self._history, self.outcomes.settled, self._side.now,
                message_timeout_ms=message_timeout_ms(cfg))
        self.producers.append(producer)
        producer.start()

    def progress(self) -> dict[str, Any]:
        return self.outcomes.progress(0.0)  # a rate of wall-clock acks says nothing here

    def stop_producers(self) -> None:
        for producer in self.producers:
            producer.stop()

    def await_outcomes(self) -> None:
        self._side.settle(lambda: all(p.outstanding == 0 for p in self.producers),
                          outcomes_wait_s(self._cfg))

    def stop_consumers(self) -> list[str]:
        """The members commit and leave, as the real ones do as they close, within
        `MEMBERS_CLOSE_TIMEOUT_S`; the producers' clients close. The names of the members
        still closing then, as `Workload.stop_consumers`'s."""
        for consumer in self.consumers:
            self._side.among(consumer.name, consumer.stop)
        members = self._members()
        pipeline = self.pipeline
        if pipeline is not None:
            pipeline.stop()
        self._side.settle(lambda: all(m.closed for m in members)
                          and (pipeline is None or pipeline.closed), MEMBERS_CLOSE_TIMEOUT_S)
        for producer in self.producers:
            self._side.among(producer.name, producer.close)
        return [m.name for m in members if not m.closed]

    def stop(self) -> None:
        for producer in self.producers:
            producer.stop()
        for consumer in self.consumers:
            self._side.among(consumer.name, consumer.stop)
        if self.pipeline is not None:
            self.pipeline.stop()

    def _members(self) -> list[SimGroupMember]:
        return [c for c in self.consumers if isinstance(c, SimGroupMember)]

    def _start_rebalancer(self) -> None:
        """``Workload``'s rebalancer: every ``rebalance_every_s`` the next member leaves the
        group and joins again, until the members stop."""
        every = self._cfg.rebalance_every_s
        if every is None or self._cfg.group is None or not self._cfg.consumers:
            return
        turn = 0

        def rebalance() -> None:
            nonlocal turn
            members = self._members()
            if not members:
                return
            member = members[turn % len(members)]
            if member.stopping:
                return
            log.info("%s leaves the group and joins again", member.name)
            self._side.among(member.name, member.rejoin)
            turn += 1
            self._side.later("c0", every, rebalance)

        self._side.later("c0", every, rebalance)


def drain(side: ClientSide, cfg: WorkloadConfig, history: HistoryWriter,
          timeout_s: float) -> dict[int, tuple[int | None, int]]:
    """A fresh consumer reads each partition from its start to its end (the HW), as
    ``runner.workload.drain``: ends asked for a share of the time, then read."""
    ends: dict[int, int | None] = dict.fromkeys(range(cfg.partitions))
    made: list[SimConsumer] = []

    def begin() -> None:
        consumer = SimConsumer("drain", side.endpoint("drain", cfg.topic), cfg.topic,
                               cfg.partitions,
                               reader(history, cfg.topic, "drain"), side.now)
        made.append(consumer)
        consumer.end_offsets(lambda p, end: ends.__setitem__(p, end))

    side.among("drain", begin)
    side.settle(lambda: all(e is not None for e in ends.values()),
                timeout_s * END_OFFSETS_SHARE)
    known = [p for p, end in ends.items() if end is not None]
    if not made:  # its code never ran (the world ended first): nothing was read
        return {p: (end, 0) for p, end in ends.items()}
    (consumer,) = made
    side.among("drain", lambda: consumer.start(known))
    side.settle(lambda: all(consumer.positions.get(p, 0) >= (ends[p] or 0) for p in known),
                timeout_s * (1 - END_OFFSETS_SHARE))
    side.among("drain", consumer.stop)
    return {p: (end, consumer.positions.get(p, 0)) for p, end in ends.items()}
