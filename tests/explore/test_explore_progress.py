"""The shrinks' progress: events a task sends reach the driver's board in order, become
lines a person can read and keep the best schedule so far; a stranger's connection is not
heard."""

from __future__ import annotations

import pickle
import socket
import time
from types import SimpleNamespace
from typing import Any

from undertow.explore.draw import FixedFault, Schedule
from undertow.explore.progress import Best, Board, Listener, step_event
from undertow.explore.shrink import Step
from undertow.spec import TargetSelector

DRAWN = Schedule((FixedFault("kill", TargetSelector(role="leader"), 3000, 4000),
                  FixedFault("pause", TargetSelector(role="follower"), 5000, 2000)), seed=7)
SHRUNK = DRAWN.with_faults(DRAWN.faults[:1])
LOCAL: Any = SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]"))
"""What `Listener` reads of a local session."""


def test_a_tasks_events_become_lines_and_the_best_so_far() -> None:
    lines: list[str] = []
    board = Board({"acks1": Best(7, 2, DRAWN, budget=40)}, lines.append)
    with Listener(LOCAL, board) as sender:
        in_task = pickle.loads(pickle.dumps(sender))  # as Spark ships it
        in_task.send({"mechanism": "acks1", "event": "checking", "seed": 7, "faults": 2})
        in_task.send({"mechanism": "acks1", "event": "start", "seed": 7, "robust": True,
                      "schedule": DRAWN.to_json()})
        in_task.send(step_event("acks1", Step("removed fault 2", SHRUNK, 3)))
        in_task.close()
        deadline = time.monotonic() + 10
        while len(lines) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert lines == [
        "  acks1: seed 7 (2 fault(s)): does it lose under all 6 timing variants?",
        "  acks1: shrinking seed 7's schedule (2 fault(s)), keeping what still loses under "
        "the timing variants",
        "  acks1: try 3/40: removed fault 2; 1 fault(s) left: kill {role: leader} at 3s for 4s"]
    best = board.snapshot()["acks1"]
    assert (best.schedule, best.tries, best.robust, best.finished) == (SHRUNK, 3, True, False)


def test_a_connection_without_the_token_is_not_heard() -> None:
    lines: list[str] = []
    board = Board({"acks1": Best(7, 2, DRAWN, budget=40)}, lines.append)
    with Listener(LOCAL, board) as sender, \
            socket.create_connection(sender.address, timeout=5) as stranger:
        stranger.sendall(b'guess\n{"mechanism": "acks1", "event": "done"}\n')
        stranger.shutdown(socket.SHUT_WR)
        stranger.recv(1)  # the listener closed it
    assert lines == [] and not board.snapshot()["acks1"].finished


def test_a_task_whose_driver_is_gone_shrinks_on_silently() -> None:
    with Listener(LOCAL, lambda _event: None) as sender:
        pass
    sender.send({"mechanism": "acks1", "event": "done"})  # refused: no exception
    sender.send({"mechanism": "acks1", "event": "done"})


def test_a_quiet_spell_gets_a_line_of_where_each_shrink_is() -> None:
    """Simulations of half a minute each: minutes may pass before a shrink keeps an edit."""
    lines: list[str] = []
    board = Board({"acks1": Best(7, 2, DRAWN, budget=40)}, lines.append, quiet_s=3600)
    board({"mechanism": "acks1", "event": "simulated"})
    board({"mechanism": "acks1", "event": "simulated"})
    board.tick()
    assert lines == [], "not after a line came"
    quiet = Board(board.best, lines.append, quiet_s=0)
    with quiet.ticking():
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
    assert lines[0].startswith("  ... shrinking for ")
    assert lines[0].endswith(": acks1 2 simulation(s), best 2 fault(s)")
