"""A workload producer as a process of its own, for a schedule that pauses it (`pause` with
`target: {producer: N}`): a thread of the runner cannot be SIGSTOPped alone, a process can.

The process runs exactly what the producer's thread would (`workload.producer_worker`: the
same librdkafka configuration, the same records at the same rate, the same transactions
with the same `record_transaction`), and hands the run what the thread would, one JSON line
on its stdout per call (`k` says which): `submit`, a send's outcome (`SendOutcomes.submit`);
`settled`, a transactional send with its transaction's outcome (`SendOutcomes.settled`);
`txn`, a transaction's line (`HistoryWriter.transaction`). `ProducerProcess`, on the
runner's side, makes those calls as it reads them, so the history is the one the thread
would have written; only the timing differs by the pipe's microseconds. Producers no
schedule pauses stay threads, so nothing else about a run changes.

It is started with the workload's other clients, before the workload begins, and reports
`ready` once its client is built; it sends its first record when the runner writes `go` on
its stdin (as the thread starts when the workload does), and stops as the thread does (its
last outcomes awaited for at most `outcomes_wait_s`) when its stdin closes. When the runner
dies it dies too, even stopped: the platform starts it with PR_SET_PDEATHSIG=SIGKILL, which
a stopped process does not ignore, and locally the guardian also SIGCONTs and SIGKILLs its
process group.

Run as ``python -m undertow.runner.producer_process CONFIG`` (`ProducerProcessConfig` as
JSON).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from undertow.runner.abort import Abort, WorkerFailed
from undertow.runner.pipeline import python_path, whole_lines
from undertow.runner.transactional_producer import TransactionLog, TxnSettings

if TYPE_CHECKING:
    from undertow.runner.workload import WorkloadConfig

log = logging.getLogger("undertow.workload")

READY_TIMEOUT_S = 60.0
"""How long a producer process may take to start and build its client."""
STOP_GRACE_S = 5.0
"""Beyond its last outcomes' bound, how long a stopping producer process may take to exit
before it is SIGKILLed."""
ABORT_POLL_S = 0.2


class ClientProcess(Protocol):
    """What the platform's `start_client` returns (`platform.process.ChildProcess`)."""

    @property
    def stdin(self) -> Any: ...

    @property
    def stdout(self) -> Any: ...

    def kill(self) -> None: ...

    def wait_exit(self, timeout: float) -> int: ...


StartClient = Callable[..., ClientProcess]
"""`Platform.start_client(client, argv, env=..., log_path=...)`."""


@dataclass(frozen=True)
class ProducerProcessConfig:
    """What a producer process is started with (its command line's JSON): the thread's
    arguments."""

    index: int
    bootstrap: str
    workload: WorkloadConfig

    def to_json(self) -> str:
        # The producer's part of the workload: a group or pipeline is not its business.
        cfg = replace(self.workload, group=None, pipeline=None, rebalance_every_s=None,
                      process_producers=())
        return json.dumps({"index": self.index, "bootstrap": self.bootstrap,
                           "workload": asdict(cfg)})

    @classmethod
    def from_json(cls, text: str) -> ProducerProcessConfig:
        from undertow.runner.workload import WorkloadConfig

        fields = json.loads(text)
        workload, txns = fields["workload"], fields["workload"]["transactions"]
        return cls(fields["index"], fields["bootstrap"], WorkloadConfig(**{
            **workload, "process_producers": (),
            "transactions": None if txns is None else TxnSettings(**txns)}))


class ProducerProcess:
    """Producer `pN`'s own process, driven as the workload drives a producer thread
    (`start`, `stop`, `join`), what it reports relayed into the run (see the module)."""

    def __init__(self, config: ProducerProcessConfig, start_client: StartClient, *,
                 submit: Callable[[dict[str, Any]], None],
                 settled: Callable[[dict[str, Any]], None], transactions: TransactionLog,
                 abort: Abort, logs: Path, end_timeout_s: float) -> None:
        """`submit`, `settled`, `transactions`: where the thread's calls would have gone;
        `end_timeout_s`: how long the process waits for its last outcomes once stopped."""
        self.name = f"p{config.index}"
        self._config = config
        self._start_client = start_client
        self._submit, self._settled = submit, settled
        self._transactions = transactions
        self._abort = abort
        self._log_path = logs / f"{self.name}.log"
        self._stop_timeout_s = end_timeout_s + STOP_GRACE_S
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._deadline = 0.0
        self._process: ClientProcess | None = None
        self._relay: threading.Thread | None = None

    def prepare(self) -> None:
        """Start the process and return once its client is built (`ready`)."""
        self._process = self._start_client(
            self.name, [sys.executable, "-m", __name__, self._config.to_json()],
            env={**os.environ, "PYTHONPATH": python_path()}, log_path=self._log_path)
        self._relay = threading.Thread(target=self._run_relay, args=(self._process,),
                                       name=f"relay-{self.name}", daemon=True)
        self._relay.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready.wait(ABORT_POLL_S):
            if not self._relay.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}'s process did not start (see {self._log_path})")
            self._abort.raise_if_set()

    def start(self) -> None:
        """The first record now."""
        assert self._process is not None, "prepared first"
        self._process.stdin.write(b"go\n")
        self._process.stdin.flush()

    def stop(self) -> None:
        """Close its stdin: it stops sending and waits for its last outcomes; on an aborted
        run it is killed instead, as the thread stops waiting for them (idempotent)."""
        process, first = self._process, not self._stopping.is_set()
        if first:
            self._deadline = time.monotonic() + self._stop_timeout_s
            self._stopping.set()
        if process is None:
            return
        if self._abort.is_set():
            process.kill()
            return
        if not first:
            return
        try:
            process.stdin.close()
        except OSError as exc:  # gone already: the relay says what happened
            log.debug("%s: closing its stdin: %s", self.name, exc)

    def join(self) -> None:
        """Until its last line is relayed and it exited; SIGKILLed past its bound (its last
        outcomes' and STOP_GRACE_S) or as soon as the run is aborted."""
        process, relay = self._process, self._relay
        if process is None or relay is None:
            return
        self.stop()
        while relay.is_alive() and time.monotonic() < self._deadline \
                and not self._abort.is_set():
            relay.join(ABORT_POLL_S)
        if relay.is_alive():
            if not self._abort.is_set():
                log.warning("%s's process did not stop within %.0f s: killed", self.name,
                            self._stop_timeout_s)
            process.kill()
            relay.join()

    def _run_relay(self, process: ClientProcess) -> None:
        for raw in whole_lines(process.stdout):
            self._relay_line(raw)
        try:
            code: int | str = process.wait_exit(STOP_GRACE_S)
        except Exception as exc:  # it closed its stdout yet runs on: gone to us all the same
            code = str(exc)
        if not self._stopping.is_set() or code not in (0, -signal.SIGKILL):
            # The thread's failure would have aborted the run (`Abort`): so does this.
            self._abort.fail(WorkerFailed(self.name, RuntimeError(
                f"its process ended with {code} (see {self._log_path})")))

    def _relay_line(self, raw: str) -> None:
        message = json.loads(raw)
        kind = message.pop("k")
        if kind == "ready":
            self._ready.set()
        elif kind == "submit":
            self._submit(message)
        elif kind == "settled":
            self._settled(message)
        elif kind == "txn":
            self._transactions.transaction(**message)


class _TransactionLines:
    """The child's `TransactionLog`: each transaction's line goes to stdout."""

    def __init__(self, emit: Callable[..., None]) -> None:
        self._emit = emit

    def transaction(self, **fields: Any) -> None:
        self._emit("txn", **fields)


def _stop_when_stdin_closes(stop: Callable[[], None]) -> None:
    while sys.stdin.buffer.read(4096):
        pass
    stop()


def main(argv: Sequence[str]) -> int:
    from undertow.runner.pipeline_member import Emitter
    from undertow.runner.workload import producer_worker

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    config = ProducerProcessConfig.from_json(argv[1])
    emit = Emitter(sys.stdout.fileno())
    failed: list[BaseException] = []

    def hook(args: threading.ExceptHookArgs) -> None:
        failed.append(args.exc_value or RuntimeError(args.exc_type.__name__))
        threading.__excepthook__(args)

    threading.excepthook = hook
    worker = producer_worker(config.index, config.bootstrap, config.workload,
                             submit=lambda send: emit("submit", **send),
                             settled=lambda send: emit("settled", **send),
                             transactions=_TransactionLines(emit), abort=Abort())
    emit("ready")
    if sys.stdin.buffer.readline().strip() != b"go":
        return 0  # stopped before the workload began
    threading.Thread(target=_stop_when_stdin_closes, args=(worker.stop,), daemon=True,
                     name="stdin").start()
    worker.start()
    worker.join()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
