"""Durations as experiment files write them: `500ms`, `30s`, `1m30s`, `2h`; an int is seconds.

Go's `time.Duration` syntax (what Chaos Mesh and most Kubernetes tooling accept) without
negative values or units below a millisecond: the runner schedules faults with millisecond
precision, so anything finer would be silently rounded. Values are held as float seconds
and serialise back to the canonical string, so a dumped spec validates again.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = ["DURATION_PATTERN", "Duration", "format_duration", "parse_duration"]

_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_TERM = r"(\d+(?:\.\d+)?)(ms|h|m|s)"
DURATION_PATTERN = r"^(?:\d+(?:\.\d+)?(?:ms|h|m|s))+$"
"""A string duration: one or more number+unit terms (`1m30s`), shared with the CRD schema."""


def parse_duration(value: Any) -> float:
    """Seconds from `"1m30s"`-style strings or non-negative int seconds.

    Raises `ValueError` with the offending value quoted, which the loader turns into a
    field error such as `spec.faults[1].duration: invalid duration '5q'`.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"invalid duration {value!r}: expected a string like '30s' or int seconds")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        return float(value)
    text = value.strip()
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"invalid duration {value!r}: expected e.g. '500ms', '30s', '1m30s'")
    total_ms = 0.0
    for number, unit in re.findall(_TERM, text):
        total_ms += float(number) * _UNIT_MS[unit]
    if abs(total_ms - round(total_ms)) > 1e-6:
        raise ValueError(f"invalid duration {value!r}: finer than a millisecond")
    return round(total_ms) / 1000


def format_duration(seconds: float) -> str:
    """The canonical string for `seconds`: `90.0 -> "1m30s"`, `0.5 -> "500ms"`."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("h", "m", "s", "ms"):
        count, ms = divmod(ms, _UNIT_MS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "minimum": 0,
            "pattern": DURATION_PATTERN,
        }
    ),
]
"""A duration field: accepts `"1m30s"` or int seconds, holds float seconds."""
