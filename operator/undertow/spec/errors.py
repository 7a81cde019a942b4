"""`SpecError`: one line naming the file, the document and the field, e.g.

`experiments/x.yaml: ChaosExperiment/foo: spec.faults[1].duration: invalid duration '5q'`

The CLI prints it and exits 2; nothing has started when it is raised.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from .meta import FieldError

__all__ = ["SpecError", "format_loc", "spec_error_from_validation"]

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class SpecError(ValueError):
    """An experiment that must not run; `str(error)` is the whole message."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        document: str | None = None,
        path: str | None = None,
    ) -> None:
        self.source = source
        self.document = document
        self.path = path
        self.detail = message
        super().__init__(": ".join(p for p in (source, document, path, message) if p))


def format_loc(loc: Sequence[str | int]) -> str:
    """`("spec", "faults", 1, "duration") -> "spec.faults[1].duration"`; dotted config
    keys are quoted: `spec.config["min.insync.replicas"]`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            text += f".{part}" if text else part
        else:
            text += f'["{part}"]'
    return text


def _describe(error: Any) -> tuple[tuple[str | int, ...], str]:
    loc = tuple(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        return (*loc, *cause.loc), cause.message
    if isinstance(cause, Exception):
        return loc, str(cause)
    if error["type"] == "missing":
        return loc, "required"
    message: str = error["msg"]
    if error["type"] in ("model_type", "dict_type"):
        message = "expected a mapping"
    elif error["type"] == "list_type":
        message = "expected a list"
    elif message.startswith("Input should be "):
        message = "expected " + message.removeprefix("Input should be ")
    else:
        message = message[0].lower() + message[1:]
    got = repr(error["input"])
    return loc, f"{message}, got {got if len(got) <= 60 else got[:57] + '...'}"


def spec_error_from_validation(
    exc: ValidationError,
    *,
    source: str | None,
    document: str | None,
) -> SpecError:
    """The first validation error as a `SpecError` (with a count of the others)."""
    errors = exc.errors()
    loc, message = _describe(errors[0])
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return SpecError(message, source=source, document=document, path=format_loc(loc))
