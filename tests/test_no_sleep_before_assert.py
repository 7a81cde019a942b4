"""No test sleeps and then asserts on state.

A sleep before an assertion is a guess at how long something takes: on a loaded machine
the thing asserted on (a stall, a hold, a task) may not have happened yet, or may already
be over. Tests wait on the state itself with a bounded poll instead. The rule, on the
syntax tree of every module under ``tests/``: a statement that is a call of ``sleep``
(``time.sleep``, ``asyncio.sleep``, awaited or not, or a bare ``sleep``) must not be
followed by an ``assert`` later in the same block. A poll loop's sleep ends its loop's
body, and the assert after the loop is in the enclosing block, so polls pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def _is_sleep(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Expr):
        return False
    call = statement.value
    if isinstance(call, ast.Await):
        call = call.value
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name == "sleep"


def _blocks(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every statement list: bodies, else and finally branches, handlers, match cases."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def sleeps_before_asserts(source: str) -> list[int]:
    """The lines of the sleeps that an ``assert`` follows in the same block."""
    return sorted(
        statement.lineno
        for block in _blocks(ast.parse(source))
        for i, statement in enumerate(block)
        if _is_sleep(statement) and any(isinstance(s, ast.Assert) for s in block[i + 1:]))


def test_no_test_sleeps_before_an_assertion() -> None:
    found = [f"{path.relative_to(TESTS.parent)}:{line}"
             for path in sorted(TESTS.rglob("*.py"))
             for line in sleeps_before_asserts(path.read_text())]
    assert not found, ("a sleep followed by an assert: wait on the state with a bounded "
                       "poll instead, at " + ", ".join(found))


@pytest.mark.parametrize(("source", "lines"), [
    # What the rule is for: the sleeps this repository's tests had.
    ("time.sleep(0.5)\nassert held.poll() is None\n", [1]),
    ("time.sleep(0.3)\ncount = len(acked)\ntime.sleep(0.8)\nassert len(acked) == count\n",
     [1, 3]),
    ("async def f():\n    await asyncio.sleep(0.01)\n    response = await handle()\n"
     "    assert response.error_code == 0\n", [2]),
    ("with cluster:\n    sleep(1)\n    assert cluster.ready\n", [2]),
    # Polls, fakes and deadlines pass.
    ("while not ready():\n    time.sleep(0.1)\nassert state() == 'ok'\n", []),
    ("while True:\n    if done():\n        break\n    assert time.monotonic() < deadline\n"
     "    time.sleep(0.2)\nassert result()\n", []),
    ("async def request():\n    await asyncio.sleep(0)\n    return answer\n", []),
    ("SLEEPER = 'import time; time.sleep(600)'\nassert SLEEPER\n", []),
], ids=["sleep-assert", "sleep-observe-sleep-assert", "await-sleep-call-assert",
        "bare-sleep-in-with", "poll-loop", "deadline-in-loop", "fake-round-trip",
        "sleep-in-a-string"])
def test_the_rule_flags_sleeps_before_asserts_and_passes_polls(source: str,
                                                               lines: list[int]) -> None:
    assert sleeps_before_asserts(source) == lines
