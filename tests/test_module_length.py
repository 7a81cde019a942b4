"""A module over 500 lines says at its top why it is long.

The project's style: small modules with one job each. A module that grows past 500 lines
either is split by job or carries, in its module docstring, a paragraph saying why it is one
unit (``Long (about N lines) ...`` or ``It is long because ...``), so that a reviewer reads
the reason before the code. The rule covers every module of the three import roots.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("broker-image", "operator", "analysis")
LIMIT = 500
REASON = re.compile(r"\blong\b", re.IGNORECASE)


def _long_modules() -> list[Path]:
    return sorted(path for source in SOURCES for path in (ROOT / source).rglob("*.py")
                  if len(path.read_text().splitlines()) > LIMIT)


def says_why_long(source: str) -> bool:
    """Whether the module docstring has a paragraph naming the module as long."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    return any(REASON.search(paragraph) for paragraph in docstring.split("\n\n"))


def test_the_rule_reads_the_docstring_not_the_code() -> None:
    assert says_why_long('"""Parses.\n\nLong (about 600 lines): one state machine."""\n')
    assert not says_why_long('"""Parses frames."""\n# long comment\nLONG = 1\n')


@pytest.mark.parametrize("path", _long_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_says_why(path: Path) -> None:
    assert says_why_long(path.read_text()), (
        f"{path.relative_to(ROOT)} has over {LIMIT} lines: split it by job, or say at its top "
        "why it is one unit")
