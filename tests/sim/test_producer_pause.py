"""A producer's pause in simulation (`pause` of `{producer: N}`): its host is a node of the
virtual loop, so SIGSTOP holds its client model's code (its rate timer, linger, request and
message timeouts, its reads of the brokers' answers) until SIGCONT, as a stopped librdkafka
process's threads are held, while the other producer goes on. Read from the history, as the
analysis reads it: `sends.jsonl` against the pause's lines in `faults.jsonl`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from library_sims import library_history, shared_root
from small_experiment import small_experiment

from minibroker.environment import context_of
from undertow.explore.draw import draw, experiment_with
from undertow.explore.runs import simulate
from undertow.explore.space import FaultSpace
from undertow.platform.errors import PlatformError
from undertow.platform.simulated import SimulatedPlatform
from undertow.sim.world import run_simulated
from undertow.spec import load_experiment

pytestmark = pytest.mark.long  # whole experiments simulated: run first (tests/conftest.py)

EXPERIMENTS = Path(__file__).parents[2] / "experiments"
PAUSED = "client-p0"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pause_window(history: Path, target: str = PAUSED) -> list[tuple[float, float]]:
    """(inject, heal) of every pause of `target`, in the history's time."""
    faults = [f for f in _lines(history / "faults.jsonl")
              if f["fault"] == "pause" and f["target"] == target]
    injects = [f["t"] for f in faults if f["action"] == "inject"]
    heals = [f["t"] for f in faults if f["action"] == "heal"]
    assert len(injects) == len(heals) >= 1, faults
    return list(zip(injects, heals, strict=True))


def _during(sends: list[dict[str, Any]], producer: str, start: float, end: float
            ) -> tuple[int, int]:
    """How many of `producer`'s sends were made, and how many settled, strictly inside
    (start, end)."""
    own = [s for s in sends if s["producer"] == producer]
    made = sum(start < s["t_invoke"] < end for s in own)
    settled = sum(s["t_complete"] is not None and start < s["t_complete"] < end for s in own)
    return made, settled


def test_the_platform_holds_a_paused_client_s_timers_until_it_resumes(tmp_path: Path) -> None:
    """The primitives under the pause unit: a timer of p0's code due while it is paused runs
    at SIGCONT, late, and one of the shared client host's runs on time; a client with no
    process of its own cannot be paused."""
    platform = SimulatedPlatform(tmp_path, 3, {}, ephemeral_storage=True, processes=("p0",))
    loop, ran = platform.loop, {}
    try:
        assert platform.client_processes == (PAUSED,)
        for host in (PAUSED, "client"):
            loop.call_later(1.0, lambda host=host: ran.setdefault(host, loop.time()),
                            context=context_of(platform.client_environment(host)))
        platform.pause_client(PAUSED)
        assert platform.is_client_paused(PAUSED) and platform.is_client_running(PAUSED)
        loop.wait_until(lambda: loop.time() >= 3.0, 5.0, "3 s to pass")
        assert ran == {"client": 1.0}
        resumed = loop.time()
        platform.resume_client(PAUSED)
        loop.wait_until(lambda: PAUSED in ran, 1.0, "the held timer to run")
        assert ran[PAUSED] == resumed >= 3.0 and not platform.is_client_paused(PAUSED)
        with pytest.raises(PlatformError, match="client-p1 has no process of its own"):
            platform.pause_client("client-p1")
    finally:
        platform.stop()


def test_a_paused_producer_sends_nothing_until_it_resumes_and_the_other_goes_on(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """producer-pause-txn at seed 1: p0, paused 10 s mid-transaction, neither makes a send
    nor learns an outcome while paused (its rate timer and its reads held), and makes sends
    again after SIGCONT, the first of them fenced (the coordinator aborted its transaction
    with a bumped epoch meanwhile); p1 sends and commits all along."""
    history = library_history(shared_root(tmp_path_factory), "producer-pause-txn")
    sends = _lines(history / "sends.jsonl")
    ((inject, heal),) = _pause_window(history)
    assert heal - inject == pytest.approx(10.0)
    assert _during(sends, "p0", inject, heal) == (0, 0)
    after = [s for s in sends if s["producer"] == "p0" and s["t_invoke"] > heal]
    assert len(after) > 500, len(after)
    assert sum(s["status"] == "ok" for s in after) > 0
    assert any(s["error"] == "INVALID_PRODUCER_EPOCH" for s in sends if s["producer"] == "p0")
    made, settled = _during(sends, "p1", inject, heal)
    assert made > 900 and settled > 900, (made, settled)  # 100 records/s for 10 s
    before = [s for s in sends if s["producer"] == "p0" and s["t_invoke"] < inject]
    assert len(before) > 500, len(before)


def test_a_producer_pause_replays_exactly(tmp_path: Path,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """The held client callbacks run in one order: `undertow run --platform sim` in a process
    of its own string hashing gives the bytes of the library's simulation of the file."""
    first = {p.name: p.read_bytes() for p in sorted(
        library_history(shared_root(tmp_path_factory), "producer-pause-txn").iterdir())}
    own = os.environ.get("PYTHONHASHSEED", "")
    other = str(int(own) + 1) if own.isdigit() else "4"
    out = tmp_path / "b"
    subprocess.run(
        [sys.executable, "-m", "undertow", "run", str(EXPERIMENTS / "producer-pause-txn.yaml"),
         "--platform", "sim", "--seed", "1", "--out", str(out), "--no-analysis",
         "--no-progress"],
        check=True, env={**os.environ, "PYTHONHASHSEED": other}, capture_output=True,
        timeout=240)
    second = {p.name: p.read_bytes() for p in sorted((out / "history").iterdir())}
    assert first == second
    assert b'"target":"client-p0"' in first["faults.jsonl"]


RANDOM_PAUSES = """\
    - random:
        kinds: [pause]
        targets: [{producer: 1}]
        interval: {min: 1s, max: 2s}
        duration: {min: 1s, max: 2s}"""


def test_a_random_schedule_pauses_a_producer_in_simulation(tmp_path: Path) -> None:
    """A random schedule may draw a producer's pause now that the simulator holds it: each
    drawn pause holds p1's sends alone, p0 unaffected."""
    experiment = tmp_path / "random-pause.yaml"
    experiment.write_text(small_experiment("random-pause", "8s", RANDOM_PAUSES,
                                           workload={"producers": 2, "retries": 5}))
    run_simulated(load_experiment(experiment), tmp_path / "out", seed=3)
    history = tmp_path / "out" / "history"
    sends = _lines(history / "sends.jsonl")
    windows = _pause_window(history, "client-p1")
    assert len(windows) >= 2, windows
    for inject, heal in windows:
        assert _during(sends, "p1", inject, heal) == (0, 0)
        made, _ = _during(sends, "p0", inject, heal)
        assert made >= 50 * (heal - inject), (made, inject, heal)  # 100 records/s


def test_an_exploration_draws_and_simulates_a_producer_s_pause(tmp_path: Path) -> None:
    """`undertow explore` may draw a producer's pause: the drawn schedule's trial runs in
    simulation (no error row) and pauses that producer's host."""
    experiment = tmp_path / "explore-pause.yaml"
    experiment.write_text(small_experiment("explore-pause", "8s",
                                           workload={"producers": 2, "retries": 5})
                          + "  explore: {kinds: [pause], targets: [{producer: 1}], "
                            "faults: {min: 2, max: 2}}\n")
    loaded = load_experiment(experiment)
    schedule = draw(FaultSpace.of(loaded), 7)
    assert {f.target.producer for f in schedule.faults} == {1}
    outcome = simulate(experiment_with(loaded, schedule), schedule.seed,
                       schedule.as_spec_faults())
    assert outcome.error is None and outcome.verdict == "clean", outcome
    assert outcome.faults_skipped == 0, outcome
