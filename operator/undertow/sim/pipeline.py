"""The consume-transform-produce pipeline in simulation (`workload.pipeline`): the model of
`runner.pipeline_member`'s processes and of `runner.pipeline`'s kills.

A member process is a client host of its own: a group member in `commit: transaction` mode
(`sim.group_member.SimGroupMember`) reading the input topic, and a transactional producer
(`SimPipelineProducer`, librdkafka's transaction manager of `sim.transactional_producer`)
writing `{input}/{txn}` for each record it returns to the same partition of the output
topic. A commit ends the open transaction with the input offsets in it, as
`send_offsets_to_transaction` does: AddOffsetsToTxn to the transaction coordinator, then
TxnOffsetCommit (KIP-447: the member id and generation) to the group coordinator, then
EndTxn; meanwhile the member reads nothing (the real loop is in its synchronous commit). An
aborted transaction sends the member back to the committed offsets; a commit whose outcome
is unknown, or a fatal error, ends the process, which a new one replaces (the real member
exits and the workload starts another).

The process reports each step as the real one does (`pipeline_member`'s messages), to the
same `runner.pipeline.MemberRecorder`, so the history's lines are the same, a killed
process's open transaction included. A kill (`KillableEndpoint.kill`) silences the host at
once: every answer and timer of the dead process is dropped, its connections reset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from minibroker.cluster.types import ErrorCode, TopicPartition
from undertow.runner.group_member import GroupSettings
from undertow.runner.history import HistoryWriter
from undertow.runner.pipeline import KILL_WAIT_S, MemberRecorder, PipelineSettings
from undertow.runner.pipeline_member import POLL_S, output_value
from undertow.runner.transactional_producer import INIT_ATTEMPT_S, TxnSettings
from undertow.sim.clients import RETRY_BACKOFF_MS, Endpoint, NetworkError
from undertow.sim.group_member import SimGroupMember
from undertow.sim.transactional_producer import (
    FATAL,
    RETRIABLE,
    SimTransactionalProducer,
    _Txn,
)

log = logging.getLogger("undertow.sim")

KILL_POLL_MS = 20.0
"""How often a kill waiting for its member to be mid-transaction looks again."""
ABORTABLE_OFFSETS = {ErrorCode.unknown_member_id, ErrorCode.illegal_generation,
                     ErrorCode.fenced_instance_id, ErrorCode.rebalance_in_progress}
"""TxnOffsetCommit answers that make librdkafka's transaction abortable: the member's
generation is gone."""


class KillableEndpoint(Endpoint):
    """A process's transport that its SIGKILL silences: nothing it asked is answered, no
    timer of it fires, and its connections are reset (the broker sees them close)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner.bootstrap)
        self._inner = inner
        self.killed = False

    def exchange(self, address: tuple[str, int], message: Any, timeout_ms: float,
                 on_answer: Callable[[Any, NetworkError | None], None]) -> None:
        if not self.killed:
            self._inner.exchange(address, message, timeout_ms,
                                 lambda answer, error: self.killed or on_answer(answer, error))

    def now_ms(self) -> float:
        return self._inner.now_ms()

    def later(self, delay_ms: float, callback: Callable[[], None]) -> None:
        if not self.killed:
            self._inner.later(delay_ms, lambda: self.killed or callback())

    def kill(self) -> None:
        self.killed = True
        self._inner.close()


class SimPipelineProducer(SimTransactionalProducer):
    """A member's transactional producer: its records are the member's (`transform`), its
    transactions end when the member commits (`commit`, with the offsets) or loses its
    partitions (`abort`)."""

    def __init__(self, name: str, transactional_id: str, client: Endpoint, output_topic: str,
                 partitions: int, settings: TxnSettings, request_timeout_ms: int,
                 end_timeout_ms: float, group_id: str, emit: Callable[..., None],
                 clock_s: Callable[[], float]) -> None:
        super().__init__(0, client, output_topic, partitions, 1.0, 16, settings,
                         request_timeout_ms, end_timeout_ms, None,  # type: ignore[arg-type]
                         lambda _send: None, clock_s)
        self.name, self.transactional_id = name, transactional_id
        self._group_id = group_id
        self._emit = emit
        self.member: SimGroupMember | None = None
        self.ready = False
        self.on_ready: Callable[[], None] = lambda: None
        self.on_exit: Callable[[], None] = lambda: None
        """The process ends: a commit whose outcome is unknown, or a fatal error."""
        self._then: Callable[[bool], None] | None = None
        self._queued: list[tuple[dict[int, int], Callable[[bool], None]]] = []
        self._offsets_sent = False

    # ---- what the member calls (sim.group_member.TransactionalCommits) ---------------------

    @property
    def busy(self) -> bool:
        return self._ending or not self.ready

    def transform(self, partition: int, offset: int, value: str) -> None:
        del offset
        if self._txn is None:
            name = f"{self.name}-t{self._n}"
            self._n += 1
            self._txn = _Txn(name, "commit", self._clock_s())
            self._emit("begin", txn=name, t_begin=self._txn.t_begin)
        txn = self._txn
        out = output_value(value, txn.name)
        send = self._new_send(txn, out, partition, out.encode())
        txn.sends.append(send)
        self._emit("send", txn=txn.name, value=out, partition=partition, t_invoke=send.t_invoke)
        self._register()
        self._pump()

    def commit(self, offsets: dict[int, int], then: Callable[[bool], None]) -> None:
        if self._ending:
            self._queued.append((offsets, then))
            return
        txn = self._txn
        if txn is None:  # nothing transformed since the last commit
            then(False)
            return
        self._then, self._offsets_sent = then, False
        txn.offsets = dict(offsets)
        self._emit("ending", txn=txn.name, intent="commit", t_end_invoke=self._clock_s(),
                   offsets={str(p): o for p, o in sorted(offsets.items())})
        self._end()

    def abort(self) -> None:
        txn = self._txn
        if txn is None or self._ending:
            return
        txn.intent = "abort"
        self._then = None
        self._emit("ending", txn=txn.name, intent="abort", t_end_invoke=self._clock_s(),
                   offsets=None)
        self._end()

    # ---- the transaction manager's steps, for a pipeline -------------------------------------

    def _begin(self) -> None:
        """InitProducerId answered: ready (the member starts reading); no transaction until
        the first record."""
        if not self.ready:
            self.ready = True
            self.on_ready()

    def _end_txn(self, txn: _Txn, commit: bool) -> None:
        """The offsets first (AddOffsetsToTxn, TxnOffsetCommit), then EndTxn."""
        if commit and not self._offsets_sent:
            self._add_offsets(txn)
        else:
            super()._end_txn(txn, commit)

    def _add_offsets(self, txn: _Txn) -> None:
        def answered(code: ErrorCode) -> None:
            if self._txn is not txn:
                return
            if code == ErrorCode.none:
                self._commit_offsets(txn)
            elif code in RETRIABLE and self._client.now_ms() < self._deadline_ms:
                self._client.later(RETRY_BACKOFF_MS, lambda: self._add_offsets(txn))
            else:
                self._offsets_failed(txn, code)

        self._coordinated(("add_offsets_to_txn", (self.transactional_id, self._pid,
                                                  self._epoch, self._group_id)), answered)

    def _commit_offsets(self, txn: _Txn) -> None:
        member = self.member
        assert member is not None
        offsets = txn.offsets

        def send(address: tuple[str, int]) -> None:
            def answered(code: Any, error: NetworkError | None) -> None:
                if self._txn is not txn:
                    return
                if error is None and code == ErrorCode.none:
                    self._offsets_sent = True
                    super(SimPipelineProducer, self)._end_txn(txn, commit=True)
                elif (error is not None or code in RETRIABLE) and \
                        self._client.now_ms() < self._deadline_ms:
                    self._client.later(RETRY_BACKOFF_MS, lambda: member.with_coordinator(send))
                else:
                    self._offsets_failed(txn, ErrorCode.request_timed_out if error else code)

            self._client.call(address, ("txn_offset_commit", {
                "transactional_id": self.transactional_id, "group_id": self._group_id,
                "producer_id": self._pid, "epoch": self._epoch,
                "generation_id": member.generation if member.generation is not None else -1,
                "member_id": member.member_id or "", "instance_id": member.instance_id,
                "offsets": {TopicPartition(member.topic, p): o
                            for p, o in sorted(offsets.items())}}),
                self._socket_timeout_ms, answered)

        member.with_coordinator(send)

    def _offsets_failed(self, txn: _Txn, code: int) -> None:
        """An offsets step that failed: abortable (the generation is gone) or fatal; a
        timeout leaves the commit unknown, as EndTxn's does."""
        if code in ABORTABLE_OFFSETS:
            self._fail(txn, code)
            self._end_txn_abort(txn)
        elif code in FATAL:
            self._fail(txn, code)
            self._finish(txn, "fail", txn.abortable, fatal=True)
        else:
            self._finish(txn, "info", "TIMED_OUT", fatal=True)

    def _end_txn_abort(self, txn: _Txn) -> None:
        super()._end_txn(txn, commit=False)

    def _finish(self, txn: _Txn, status: str, error: str | None, fatal: bool = False) -> None:
        for send in txn.sends:
            self._emit("acked", value=send.value, offset=send.offset, error=send.error)
        self._emit("end", txn=txn.name, status=status, error=error, t_complete=self._clock_s())
        self._txn, self._ending, self._fatal = None, False, False
        then, self._then = self._then, None
        if then is not None:
            then(status == "ok")
        if status == "info" or fatal:
            self.on_exit()  # the real member exits: the workload replaces the process
            return
        if status == "fail" and self.member is not None:
            self.member.rewind()  # read the aborted records again
        if any(s.uncertain for s in txn.sends):
            self.ready = False
            self._init()  # KIP-360: the epoch is bumped before the next transaction
        queued, self._queued = self._queued, []
        for offsets, queued_then in queued:
            self.commit(offsets, queued_then)


class SimPipelineProcess:
    """One member process (`c0.1`): its group member, its producer, its recorder."""

    def __init__(self, slot: str, incarnation: int, first: int, side: Any,
                 cfg_topic: str, partitions: int, settings: PipelineSettings,
                 group: GroupSettings, txns: TxnSettings, request_timeout_ms: int,
                 end_timeout_ms: float, history: HistoryWriter,
                 record_send: Callable[[dict[str, Any]], None],
                 on_exit: Callable[[SimPipelineProcess], None]) -> None:
        """`on_exit(process)`: it ended on its own (a fatal error, a commit whose outcome is
        unknown), as the real member exits with EXIT_FATAL."""
        self.name = f"{slot}.{incarnation}"
        transactional_id = f"undertow-pipeline-{slot}"
        self.recorder = MemberRecorder(self.name, transactional_id, cfg_topic,
                                       settings.output_topic, history, record_send)
        self._side = side
        self._made = lambda: self._make(transactional_id, first, cfg_topic, partitions,
                                        settings, group, txns, request_timeout_ms,
                                        end_timeout_ms, history, on_exit)
        self._links: list[KillableEndpoint] = []
        self.producer: SimPipelineProducer | None = None
        self.member: SimGroupMember | None = None
        self.exited = False
        self.on_ready: Callable[[], None] = lambda: None
        """Once its InitProducerId fenced the previous process (the pipeline's `recover`)."""
        self._stop_asked = False

    def _make(self, transactional_id: str, first: int, cfg_topic: str,
              partitions: int, settings: PipelineSettings, group: GroupSettings,
              txns: TxnSettings, request_timeout_ms: int, end_timeout_ms: float,
              history: HistoryWriter, on_exit: Callable[[SimPipelineProcess], None]) -> None:
        """Its clients, made among its code (each connection on its host)."""
        consumer_link = KillableEndpoint(self._side.endpoint(self.name, cfg_topic))
        producer_link = KillableEndpoint(self._side.endpoint(self.name, settings.output_topic))
        self._links = [consumer_link, producer_link]
        self.producer = SimPipelineProducer(
            self.name, transactional_id, producer_link, settings.output_topic, partitions,
            txns, request_timeout_ms, end_timeout_ms, group.group_id, self._emit,
            self._side.now)
        self.member = SimGroupMember(self.name, consumer_link, cfg_topic, group, history,
                                     self._side.now, first=first, transactional=self.producer,
                                     poll_s=POLL_S)
        self.producer.member = self.member
        self.producer.on_ready = self._ready
        self.producer.on_exit = lambda: (self.kill(), on_exit(self))

    def _emit(self, kind: str, **fields: Any) -> None:
        if not self.exited:
            self.recorder.message({"k": kind, **fields})

    def _ready(self) -> None:
        if self.recorder.ready.is_set() or self.member is None or self.exited:
            return
        self._emit("ready", t=self._side.now())
        self.on_ready()
        if self._stop_asked:
            self.member.stop()  # asked to stop while initialising: it never joins the group
        else:
            self.member.start()

    def start(self) -> None:
        """Run among its code: its clients made, InitProducerId, then the group."""
        if self.exited:
            return
        self._made()
        assert self.producer is not None
        self.producer.start()

    def kill(self) -> None:
        """SIGKILL: silent at once; its open transaction recorded as it died."""
        if self.exited:
            return
        self.exited = True
        for link in self._links:
            link.kill()
        self.recorder.died(self._side.now())
        if self.producer is not None:
            self.producer.close()

    @property
    def closed(self) -> bool:
        return self.exited or (self.member is not None and self.member.closed)

    def stop(self) -> None:
        """Its transaction ends (committed), it leaves the group (`closed` then). One still
        initialising finishes its InitProducerId first and then ends without joining, as
        `pipeline_member` does; it exits if that takes over INIT_ATTEMPT_S (the real one's
        `init_transactions` attempt, which is not retried once it was asked to stop)."""
        if self.member is None:
            self.exited = True  # never started: nothing to end
        elif self.exited or self._stop_asked:
            return
        elif self.recorder.ready.is_set():
            self._stop_asked = True
            self.member.stop()
        else:
            self._stop_asked = True
            self._side.later(self.name, INIT_ATTEMPT_S, self._give_up_initialising)

    def _give_up_initialising(self) -> None:
        if not self.recorder.ready.is_set():
            self.kill()  # init_transactions failed: the real process exits (EXIT_FATAL)


class SimPipeline:
    """`runner.pipeline.Pipeline` in simulation: the member slots, each running one process
    at a time, and the kills of `PipelineSettings.kill_every_s`."""

    def __init__(self, side: Any, history: HistoryWriter,
                 make: Callable[[str, int, int, Callable[[SimPipelineProcess], None]],
                                SimPipelineProcess],
                 members: int, kill_every_s: float | None) -> None:
        """`make(slot, incarnation, index, on_exit)`: a new process of a slot."""
        self._side = side
        self._history = history
        self._make = make
        self._kill_every_s = kill_every_s
        self._slots = [f"c{i}" for i in range(members)]
        self._incarnations = dict.fromkeys(self._slots, 0)
        self.processes: dict[str, SimPipelineProcess] = {}
        self._stopped = False
        self._turn = 0

    def start(self) -> None:
        for slot in self._slots:
            self._start(slot)
        if self._kill_every_s is not None:
            self._side.later("c0", self._kill_every_s, self._kill_next)

    def _start(self, slot: str) -> SimPipelineProcess:
        incarnation = self._incarnations[slot]
        self._incarnations[slot] += 1
        process = self._make(slot, incarnation, self._slots.index(slot), self._exited)
        self.processes[slot] = process
        self._side.among(process.name, process.start)
        return process

    def _exited(self, process: SimPipelineProcess) -> None:
        slot = process.name.split(".")[0]
        if not self._stopped and self.processes.get(slot) is process:
            log.warning("pipeline member %s exited: a new process takes its place",
                        process.name)
            self._start(slot)

    def _kill_next(self) -> None:
        if self._stopped:
            return
        slot = self._slots[self._turn % len(self._slots)]
        self._turn += 1
        self._kill_when_mid_transaction(slot, self._side.now() + KILL_WAIT_S)
        assert self._kill_every_s is not None
        self._side.later("c0", self._kill_every_s, self._kill_next)

    def _kill_when_mid_transaction(self, slot: str, deadline: float) -> None:
        if self._stopped:
            return
        process = self.processes[slot]
        mid = process.recorder.mid_transaction()
        if not mid and self._side.now() < deadline:
            self._side.later("c0", KILL_POLL_MS / 1000,
                             lambda: self._kill_when_mid_transaction(slot, deadline))
            return
        process.kill()
        self._history.fault(fault="kill", target=slot, action="inject",
                            role=f"pipeline member {process.name}"
                                 f"{', mid-transaction' if mid else ''}", t=self._side.now())
        self._history.fault(fault="kill", target=slot, role="pipeline member", action="heal",
                            t=self._side.now())
        replacement = self._start(slot)
        # The `recover` line once the replacement's InitProducerId fenced the dead process,
        # even if the pipeline was asked to stop meanwhile (it still initialises first).
        replacement.on_ready = lambda: self._history.fault(
            fault="kill", target=slot, role="pipeline member", action="recover",
            t=self._side.now())

    def stop(self) -> None:
        """Every member ends its transaction and leaves (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        for process in self.processes.values():
            self._side.among(process.name, process.stop)

    @property
    def closed(self) -> bool:
        return all(p.closed for p in self.processes.values())
