"""The shrinks' progress, live, and the best schedule each has found so far.

A shrink runs in a Spark task (`spark.in_parallel`), and a task's result (an accumulator's
too) reaches the driver only when the task ends: minutes later, or never if the user stops
`undertow explore` with Ctrl-C. So each task sends its events as it goes, one JSON line
each, over a TCP connection to a `Listener` in the driver, at ``spark.driver.host`` (which
every executor reaches already: it is where Spark's own RPC runs). The driver's `Board`
turns them into lines of progress and keeps each mechanism's best schedule, which Ctrl-C
writes out. An event that cannot be sent (a firewall between the executors and the driver)
is dropped: the shrink goes on and its result comes back with the task; only the live lines,
and what Ctrl-C would keep beyond the schedule the shrink started from, are missing.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import SparkSession

from .draw import Schedule
from .robust import VARIANTS
from .shrink import Step

__all__ = ["Best", "Board", "Listener", "Sender", "step_event"]

log = logging.getLogger("undertow.explore")

Event = dict[str, Any]
QUIET_S = 30.0
"""After this long without a line, `Board.ticking` says where each shrink is."""


class Sender:
    """A task's end of the channel: `send` writes one event, and never fails the task (a
    channel that broke once stays silent). Pickled into the task without its socket."""

    def __init__(self, address: tuple[str, int], token: str) -> None:
        self.address = address
        self.token = token
        self._socket: socket.socket | None = None
        self._broken = False

    def __getstate__(self) -> dict[str, Any]:
        return {"address": self.address, "token": self.token}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(tuple(state["address"]), state["token"])  # type: ignore[misc]

    def send(self, event: Event) -> None:
        if self._broken:
            return
        try:
            if self._socket is None:
                self._socket = socket.create_connection(self.address, timeout=5)
                self._socket.sendall(f"{self.token}\n".encode())
            self._socket.sendall(f"{json.dumps(event)}\n".encode())
        except OSError:
            self._broken = True
            self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True  # a task killed by Ctrl-C leaves its connection open
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], token: str,
                 on_event: Callable[[Event], None]) -> None:
        super().__init__(address, _Handler)
        self.token = token
        self.on_event = on_event


class _Handler(socketserver.StreamRequestHandler):
    """One task's connection: the token, then events, in the order the task sent them."""

    server: _Server

    def handle(self) -> None:
        token = self.rfile.readline().decode(errors="replace").strip()
        if not hmac.compare_digest(token, self.server.token):
            return  # not one of ours
        for line in self.rfile:
            try:
                self.server.on_event(json.loads(line))
            except Exception:  # a bad event must not end the others' progress
                log.debug("dropped shrink event %r", line, exc_info=True)


class Listener:
    """The driver's end: `with Listener(spark, on_event) as sender`, then pass
    ``sender`` into the tasks. ``on_event`` is called from the listener's threads."""

    def __init__(self, spark: SparkSession, on_event: Callable[[Event], None]) -> None:
        sc = spark.sparkContext
        if sc.master.startswith("local"):
            bind = advertised = "127.0.0.1"
        else:  # Spark's own choice of where executors reach the driver
            conf = sc.getConf()
            advertised = conf.get("spark.driver.host", socket.gethostname()) or ""
            bind = conf.get("spark.driver.bindAddress", advertised) or advertised
        self._advertised = advertised
        self._server = _Server((bind, 0), secrets.token_hex(16), on_event)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="undertow-shrink-progress")

    def __enter__(self) -> Sender:
        self._thread.start()
        return Sender((self._advertised, self._server.server_address[1]), self._server.token)

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class Best:
    """One mechanism's best schedule so far, and how far its shrink got."""

    seed: int
    found_faults: int
    schedule: Schedule
    robust: bool | None = None
    """Whether the shrink keeps only edits that lose under the timing variants too; None
    before it started (the schedule lost at nominal timing when drawn)."""
    budget: int = 0
    tries: int = 0
    """The shrink's tries when it kept its last edit."""
    simulations: int = 0
    """Simulations run so far, the timing variants' included."""
    finished: bool = False


class Board:
    """The shrinks' events as lines of progress, and the best schedule of each mechanism:
    the one drawn, until its shrink starts from another or keeps an edit. While
    `ticking`, a quiet spell of `quiet_s` gets a line too: an experiment whose simulations
    take half a minute each checks a schedule under its timing variants for minutes before
    any edit is kept."""

    def __init__(self, best: dict[str, Best], on_line: Callable[[str], None],
                 quiet_s: float = QUIET_S) -> None:
        self.best = best
        self._on_line = on_line
        self._quiet_s = quiet_s
        self._lock = threading.Lock()
        self._started = self._spoke = time.monotonic()

    def snapshot(self) -> dict[str, Best]:
        with self._lock:
            return {m: replace(b) for m, b in self.best.items()}

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(min(1.0, self._quiet_s)):
                self.tick()

        thread = threading.Thread(target=tick, daemon=True, name="undertow-shrink-tick")
        thread.start()
        try:
            yield
        finally:
            stop.set()

    def tick(self) -> None:
        """A line of where each shrink is, if none came for `quiet_s`."""
        with self._lock:
            now = time.monotonic()
            if now - self._spoke < self._quiet_s:
                return
            where = "; ".join(
                f"{m} {b.simulations} simulation(s), best {len(b.schedule.faults)} fault(s)"
                + (" (done)" if b.finished else "") for m, b in self.best.items())
            self._say(f"  ... shrinking for {now - self._started:.0f} s: {where}")

    def _say(self, line: str) -> None:
        self._spoke = time.monotonic()
        self._on_line(line)

    def __call__(self, event: Event) -> None:
        with self._lock:
            mechanism = event["mechanism"]
            best = self.best[mechanism]
            kind = event["event"]
            if kind == "simulated":
                best.simulations += 1
                return
            if "schedule" in event:
                best.schedule = Schedule.from_json(event["schedule"])
            faults = len(best.schedule.faults)
            if kind == "checking":
                line = (f"seed {event['seed']} ({event['faults']} fault(s)): does it lose "
                        f"under all {len(VARIANTS)} timing variants?")
            elif kind == "start":
                best.seed, best.found_faults = event["seed"], faults
                best.robust = event["robust"]
                line = (f"shrinking seed {event['seed']}'s schedule ({faults} fault(s)), "
                        + ("keeping what still loses under the timing variants"
                           if best.robust else "at nominal timing only (no schedule lost "
                           "under all the timing variants)"))
            elif kind == "step":
                best.tries = event["tries"]
                line = (f"try {best.tries}/{best.budget}: {event['edit']}; {faults} fault(s) "
                        f"left: {best.schedule.describe()}")
            else:
                best.finished = True
                line = f"shrunk from {best.found_faults} to {faults} fault(s)"
            self._say(f"  {mechanism}: {line}")


def step_event(mechanism: str, step: Step) -> Event:
    """A `Step` as the event a task sends."""
    return {"mechanism": mechanism, "event": "step", "edit": step.edit, "tries": step.tries,
            "schedule": step.schedule.to_json()}
