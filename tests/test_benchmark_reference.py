"""The benchmarks' machine reference (benchmarks/reference.py): it times its loop, and what the
scripts print and record from it says what a reader needs, namely both readings, whether the
machine's speed held, and figures scaled to the reference machine. No assertion depends on
how fast this machine is: the readings are taken with a tiny loop, or set by hand where the
text or the arithmetic is checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from reference import (
    AT,
    HELD,
    ITERATIONS,
    REFERENCE_S,
    Reading,
    Reference,
    brief,
    loop_seconds,
)


def test_the_loop_is_timed_for_the_whole_length_from_its_best_share() -> None:
    seconds = loop_seconds(iterations=20_000, repeats=4)
    assert 0 < seconds < 10
    reading = Reading.take(iterations=20_000, repeats=2)
    assert reading.loop_s > 0 and reading.load >= 0 and reading.cpus >= 1


def test_a_reference_measures_at_the_start_and_at_the_end() -> None:
    # The benchmarks run the full-length loop; a tiny one keeps the test quick.
    reference = Reference.measure(iterations=20_000)
    assert reference.start.loop_s > 0 and "0.02M-iteration" in reference.start_line()
    assert reference.end is None and reference.drift() is None and reference.held() is None
    assert "no reading at the end" in reference.end_line()
    assert reference.finish() is reference and reference.end is not None
    assert reference.drift() is not None and reference.end.loop_s > 0
    assert reference.record()["iterations"] == 20_000


def test_figures_are_scaled_to_the_reference_machine() -> None:
    slow = Reference(Reading(loop_s=2 * REFERENCE_S, load=2.0, cpus=2))
    # A machine twice as slow as the reference one: its rates double, its durations halve.
    assert slow.rate(0.8) == pytest.approx(1.6)
    assert slow.duration(10.0) == pytest.approx(5.0)
    same = Reference(Reading(loop_s=REFERENCE_S, load=0.0, cpus=2))
    assert same.rate(3.1) == pytest.approx(3.1) and same.duration(3.0) == pytest.approx(3.0)


def test_the_lines_give_both_readings_and_whether_the_speed_held() -> None:
    reference = Reference(Reading(loop_s=1.52, load=0.84, cpus=2))
    start = reference.start_line()
    assert f"{ITERATIONS / 1e6:g}M-iteration" in start
    assert all(text in start for text in ("1.52 s", "load 0.84", "2 CPUs", AT, f"{REFERENCE_S:g}"))

    reference.end = Reading(loop_s=1.60, load=1.1, cpus=2)
    assert reference.held()
    end = reference.end_line()
    assert all(text in end for text in ("1.52 s at the start", "1.60 s at the end", "load 1.10",
                                        "held (+5%)"))
    assert "NOT" not in end

    reference.end = Reading(loop_s=1.52 * (1 + HELD) * 1.2, load=3.0, cpus=2)
    assert reference.held() is False
    assert "did NOT hold" in reference.end_line()
    assert "not comparable" in reference.end_line()


def test_the_record_is_json_and_brief_reads_it() -> None:
    reference = Reference(Reading(loop_s=1.5, load=0.5, cpus=2))
    unfinished = json.loads(json.dumps(reference.record()))
    assert unfinished["end"] is None and unfinished["held"] is None
    assert brief(unfinished) == "reference 1.50 s"

    reference.end = Reading(loop_s=3.0, load=2.5, cpus=2)
    record = json.loads(json.dumps(reference.record()))
    assert record["start"] == {"loop_s": 1.5, "load": 0.5}
    assert record["end"] == {"loop_s": 3.0, "load": 2.5}
    assert record["drift"] == 1.0 and record["held"] is False
    assert record["iterations"] == ITERATIONS and record["reference_s"] == REFERENCE_S
    assert record["cpus"] == 2 and record["python"]
    assert brief(record) == "reference 1.50-3.00 s, NOT held"
