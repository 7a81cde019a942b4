"""Duration parsing and formatting: the syntax every experiment timing field uses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undertow.spec.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("1.5s", 1.5),
        ("1h2m3s4ms", 3723.004),
        ("0s", 0.0),
        (" 10s ", 10.0),
        (45, 45.0),
        (0, 0.0),
    ],
)
def test_parse(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("5q", "expected e.g."),
        ("", "expected e.g."),
        ("-1s", "expected e.g."),
        ("10", "expected e.g."),
        ("s", "expected e.g."),
        ("1.0005s", "finer than a millisecond"),
        (-3, "must not be negative"),
        (True, "expected a string"),
        (1.5, "expected a string"),
        (None, "expected a string"),
    ],
)
def test_parse_rejects(value: object, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(value)
    assert f"invalid duration {value!r}" in str(info.value)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(90, "1m30s"), (0.5, "500ms"), (0, "0s"), (3723.004, "1h2m3s4ms"), (7200, "2h")],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**9))
def test_format_parse_round_trip(ms: int) -> None:
    assert parse_duration(format_duration(ms / 1000)) == ms / 1000
