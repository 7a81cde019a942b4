"""The workload's consume-transform-produce pipeline (`workload.pipeline`): its member
processes (`runner.pipeline_member`), what they report turned into history lines, and the
kills that replace them.

Each member slot (`c0`, `c1`, ...) runs one process at a time, named `c0.0`, `c0.1`, ... in
the history: each process is a consumer and a producer of its own, and the slot's processes
share one `transactional.id`, so that each new one fences the one before (KIP-98). A process
reports each thing it does as it does it (`pipeline_member`); `MemberRecorder` writes what
the history keeps: reads and group actions at once, a transaction's sends, its line and its
offset commits once it ended. When a process dies with a transaction open (killed, or
crashed) the recorder ends it as the dead process could not: `fail` when the process had
not called the commit (without EndTxn(commit) the coordinator can only abort it), `info`
when it had (the commit may have gone through).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import undertow
import undertow_history
from undertow.runner.abort import Abort
from undertow.runner.group_member import GroupSettings
from undertow.runner.history import HistoryWriter
from undertow.runner.pipeline_member import MemberConfig
from undertow.runner.transactional_producer import Ended, Send, record_transaction

log = logging.getLogger("undertow.pipeline")

DIED = "MEMBER_DIED"
"""txns.jsonl's error of a transaction whose process died with it open."""
KILL_WAIT_S = 5.0
"""How long a kill waits for its member to be mid-transaction (an open transaction with a
record sent); past it the member is killed anyway."""
STOP_GRACE_S = 5.0
"""Beyond its end timeout, how long a stopping member may take to end its transaction."""
MAX_RESTARTS = 20
"""Processes a slot may start after ones that died on their own, before it gives up."""


@dataclass(frozen=True)
class PipelineSettings:
    """`workload.pipeline` in the runner's units."""

    output_topic: str
    kill_every_s: float | None


@dataclass
class _Open:
    txn: str
    t_begin: float
    sends: dict[str, Send] = field(default_factory=dict)
    intent: str = "commit"
    t_end_invoke: float | None = None
    offsets: dict[int, int] | None = None


class MemberRecorder:
    """What one member process reports, as history lines (see the module)."""

    def __init__(self, name: str, transactional_id: str, input_topic: str, output_topic: str,
                 history: HistoryWriter, record_send: Callable[[dict[str, Any]], None]) -> None:
        self.name = name
        self._transactional_id = transactional_id
        self._input, self._output = input_topic, output_topic
        self._history = history
        self._record_send = record_send
        self._open: _Open | None = None
        self.ready = threading.Event()

    def mid_transaction(self) -> bool:
        """A transaction is open, has sent a record, and its end has not been called."""
        txn = self._open
        return txn is not None and bool(txn.sends) and txn.t_end_invoke is None

    def line(self, text: str) -> None:
        """One line of the process's stdout."""
        self.message(json.loads(text))

    def message(self, message: dict[str, Any]) -> None:
        """One report of the process (`pipeline_member`'s lines, or the simulated member's
        own, `sim.pipeline`)."""
        message = dict(message)
        kind = message.pop("k")
        if kind == "ready":
            self.ready.set()
        elif kind == "read":
            self._history.read(consumer=self.name, phase="run", topic=self._input,
                               isolation="read_committed", **message)
        elif kind == "group":
            self._history.group(member=self.name, topic=self._input, **message)
        elif kind == "begin":
            self._open = _Open(message["txn"], message["t_begin"])
        elif kind == "send" and self._open is not None:
            send = Send(message["value"], message["partition"], message["t_invoke"])
            self._open.sends[send.value] = send
        elif kind == "acked" and self._open is not None:
            if (send := self._open.sends.get(message["value"])) is not None:
                send.offset, send.error = message["offset"], message["error"]
        elif kind == "ending" and self._open is not None:
            self._open.intent, self._open.t_end_invoke = message["intent"], message["t_end_invoke"]
            offsets = message["offsets"]
            self._open.offsets = None if offsets is None else {
                int(p): o for p, o in offsets.items()}
        elif kind == "end" and self._open is not None:
            self._end(message["status"], message["error"], message["t_complete"])

    def died(self, t: float) -> None:
        """The process is gone: end the transaction it left open."""
        txn = self._open
        if txn is not None:
            called = txn.t_end_invoke is not None and txn.intent == "commit"
            self._end("info" if called else "fail", DIED, t)

    def _end(self, status: str, error: str | None, t_complete: float) -> None:
        txn, self._open = self._open, None
        assert txn is not None
        record_transaction(self._history, self._record_send, Ended(
            self.name, self._output, self._transactional_id, txn.txn, txn.intent, status,
            error, txn.t_begin, txn.t_end_invoke, t_complete, txn.offsets),
            list(txn.sends.values()))
        for partition, offset in sorted((txn.offsets or {}).items()):
            self._history.group(member=self.name, member_id=None, generation=None,
                                type="commit", topic=self._input, partition=partition,
                                offset=offset, status=status,
                                error=None if status == "ok" else error,
                                t_invoke=txn.t_end_invoke, t=t_complete)


class MemberSlot:
    """Member `cN`: its current process and the thread relaying its stdout."""

    def __init__(self, slot: str, config: Callable[[str], MemberConfig], history: HistoryWriter,
                 record_send: Callable[[dict[str, Any]], None], logs: Path) -> None:
        self.slot = slot
        self._config = config
        self._history = history
        self._record_send = record_send
        self._logs = logs
        self._incarnation = 0
        self._restarts = 0
        self._lock = threading.Lock()
        self._stopping = False
        self._process: subprocess.Popen[bytes] | None = None
        self._relay: threading.Thread | None = None
        self._recoveries: list[threading.Thread] = []
        self.recorder: MemberRecorder | None = None

    def start(self) -> None:
        """A new process for this slot (its first, or the replacement of a dead one)."""
        name = f"{self.slot}.{self._incarnation}"
        self._incarnation += 1
        config = self._config(name)
        recorder = MemberRecorder(name, config.transactional_id, config.input_topic,
                                  config.output_topic, self._history, self._record_send)
        self._logs.mkdir(parents=True, exist_ok=True)
        with open(self._logs / f"{name}.log", "ab") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "undertow.runner.pipeline_member", config.to_json()],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                env={**os.environ, "PYTHONPATH": python_path()})
        self._process, self.recorder = process, recorder
        self._relay = threading.Thread(target=self._run_relay, args=(process, recorder),
                                       name=f"relay-{name}", daemon=True)
        self._relay.start()

    def _run_relay(self, process: subprocess.Popen[bytes], recorder: MemberRecorder) -> None:
        assert process.stdout is not None
        for raw in whole_lines(process.stdout):
            recorder.line(raw)
        code = process.wait()
        recorder.died(time.time())
        with self._lock:
            if self._stopping or code == -signal.SIGKILL:
                return
            log.warning("pipeline member %s exited with %s: a new process takes its place",
                        recorder.name, code)
            self._restarts += 1
            if self._restarts <= MAX_RESTARTS:
                self.start()

    def kill(self, stopped: threading.Event) -> None:
        """SIGKILL the process mid-transaction (waiting up to KILL_WAIT_S for one) and start
        its replacement; faults.jsonl gets the kill and the replacement's start (`heal`) at
        once, and its readiness (`recover`: its InitProducerId fenced the dead process) from a
        thread of its own, so that the next kill keeps to its time. Gives way as soon as
        `stopped` is set."""
        recorder, process = self.recorder, self._process
        if recorder is None or process is None:
            return
        deadline = time.monotonic() + KILL_WAIT_S
        while not recorder.mid_transaction() and time.monotonic() < deadline:
            if stopped.wait(0.02):
                return
        with self._lock:
            if self._stopping or stopped.is_set():
                return
            mid = recorder.mid_transaction()
            process.kill()
            self._history.fault(fault="kill", target=self.slot, action="inject",
                                role=f"pipeline member {recorder.name}"
                                     f"{', mid-transaction' if mid else ''}")
        assert self._relay is not None
        self._relay.join()
        with self._lock:
            if self._stopping or stopped.is_set():
                return
            self._history.fault(fault="kill", target=self.slot, role="pipeline member",
                                action="heal")
            self.start()
            replacement, relay = self.recorder, self._relay
        assert replacement is not None and relay is not None
        watcher = threading.Thread(target=self._record_recovery, args=(replacement, relay),
                                   name=f"recovery-{replacement.name}", daemon=True)
        self._recoveries.append(watcher)
        watcher.start()

    def _record_recovery(self, replacement: MemberRecorder, relay: threading.Thread) -> None:
        """A replacement asked to stop still initialises first (`pipeline_member`), so its
        readiness is waited for until its last line is relayed."""
        while not replacement.ready.wait(0.1) and relay.is_alive():
            pass
        if not replacement.ready.is_set():
            return  # it died before it was ready: no recovery to record
        self._history.fault(fault="kill", target=self.slot, role="pipeline member",
                            action="recover")

    def join_recoveries(self) -> None:
        """Once the processes stopped: every watcher of a replacement's readiness has ended."""
        for watcher in self._recoveries:
            watcher.join()

    def request_stop(self) -> None:
        """Close the process's stdin: it ends its transaction and leaves the group."""
        with self._lock:
            self._stopping = True
            process = self._process
        if process is not None and process.stdin is not None:
            process.stdin.close()

    def wait_stopped(self, deadline: float) -> None:
        """SIGKILL the process at `deadline` (time.monotonic()) if it has not exited;
        returns once its lines are all recorded."""
        process, relay = self._process, self._relay
        if process is None or relay is None:
            return
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("pipeline member %s did not stop in time: killed", self.slot)
            process.kill()
        relay.join()


def whole_lines(stream: IO[bytes]) -> Any:
    """The stream's lines, without a last one cut short by the process's death."""
    for raw in stream:
        if raw.endswith(b"\n"):
            yield raw.decode()


def python_path() -> str:
    """Where the member process finds the undertow packages, as this process did."""
    roots = {str(Path(undertow.__file__).resolve().parents[1]),
             str(Path(undertow_history.__file__).resolve().parents[1])}
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*sorted(roots), *([existing] if existing else [])])


class Pipeline:
    """The pipeline's member slots, and the kills of `PipelineSettings.kill_every_s`."""

    def __init__(self, slots: list[MemberSlot], settings: PipelineSettings, abort: Abort,
                 stop_timeout_s: float) -> None:
        self.slots = slots
        self._settings = settings
        self._abort = abort
        self._stop_timeout_s = stop_timeout_s
        self._stopped = threading.Event()
        self._killer = threading.Thread(target=self._kill_in_turn, name="pipeline-killer",
                                        daemon=True)

    @classmethod
    def build(cls, members: int, config: Callable[[str, str], MemberConfig],
              settings: PipelineSettings, history: HistoryWriter,
              record_send: Callable[[dict[str, Any]], None], abort: Abort,
              end_timeout_s: float) -> Pipeline:
        """`config(slot, process name)`: the member configuration of one process."""
        logs = history.directory.parent / "pipeline"
        slots = [MemberSlot(f"c{i}", lambda name, slot=f"c{i}": config(slot, name), history,
                            record_send, logs) for i in range(members)]
        return cls(slots, settings, abort, end_timeout_s + STOP_GRACE_S)

    def start(self) -> None:
        for slot in self.slots:
            slot.start()
        if self._settings.kill_every_s is not None:
            self._killer.start()

    def _kill_in_turn(self) -> None:
        """A kill at every multiple of `kill_every_s` from the start, a slot in turn (as
        `SimPipeline` does), whatever the last replacement takes to get ready."""
        every = self._settings.kill_every_s
        assert every is not None
        started = time.monotonic()
        turn = 0
        while not self._stopped.wait(max(0.0, started + (turn + 1) * every - time.monotonic())) \
                and not self._abort.is_set():
            self.slots[turn % len(self.slots)].kill(self._stopped)
            turn += 1

    def stop(self) -> None:
        """Every member ends its transaction and leaves (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._killer.is_alive():
            self._killer.join()
        for slot in self.slots:
            slot.request_stop()
        deadline = time.monotonic() + self._stop_timeout_s
        for slot in self.slots:
            slot.wait_stopped(deadline)
            slot.join_recoveries()


def member_config(slot: str, name: str, *, bootstrap: str, input_topic: str,
                  settings: PipelineSettings, group: GroupSettings, producer: dict[str, Any],
                  transaction_timeout_ms: int, end_timeout_s: float) -> MemberConfig:
    """Process `name` of member `slot`: the slot's transactional.id, the group's settings."""
    return MemberConfig(name=name, transactional_id=f"undertow-pipeline-{slot}",
                        bootstrap=bootstrap, input_topic=input_topic,
                        output_topic=settings.output_topic, group=group, producer=producer,
                        transaction_timeout_ms=transaction_timeout_ms,
                        end_timeout_s=end_timeout_s)
