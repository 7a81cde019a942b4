"""The missing-tool rule (``tests/tools.py``): in CI a test whose tool is missing fails,
elsewhere it skips with the install command; ``.ci/run`` turns CI on, and no test looks for
Chromium, kcat or podman without the helper."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
import tools

TESTS = Path(__file__).parent
CI_RUN = TESTS.parent / ".ci" / "run"
ABSENT = "undertow-no-such-tool"
INSTALL = "apt-get install -y undertow-no-such-tool"
CI_TOOLS = re.compile(r"kcat|podman|chromium", re.IGNORECASE)


def outcome(*names: str) -> BaseException:
    """What ``require_tool`` raised for ``names``, a skip or a failure: caught here either
    way, since a skip escaping the test would report it skipped, not failed."""
    try:
        tools.require_tool(*names, install=INSTALL)
    except (pytest.fail.Exception, pytest.skip.Exception) as raised:
        return raised
    raise AssertionError(f"require_tool found {names}")


@pytest.mark.parametrize("value", ["true", "1", "yes", "True"])
def test_in_ci_a_missing_tool_fails_naming_its_install_command(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(tools.CI_VARIABLE, value)
    failed = outcome(ABSENT)
    assert isinstance(failed, pytest.fail.Exception), repr(failed)
    assert f"{ABSENT} is not installed ({INSTALL})" in str(failed)


@pytest.mark.parametrize("value", [None, "", "0", "false", "False", "no"])
def test_outside_ci_a_missing_tool_skips_naming_its_install_command(
        monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(tools.CI_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(tools.CI_VARIABLE, value)
    skipped = outcome(ABSENT, f"{ABSENT}-too")
    assert isinstance(skipped, pytest.skip.Exception), repr(skipped)
    assert str(skipped) == f"{ABSENT} or {ABSENT}-too is not installed ({INSTALL})"


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_present_tool_is_found_in_ci_or_not(monkeypatch: pytest.MonkeyPatch,
                                              ci: str) -> None:
    monkeypatch.setenv(tools.CI_VARIABLE, ci)
    sh = shutil.which("sh")
    assert sh is not None
    assert tools.require_tool("sh", install=INSTALL) == sh
    # The first name on PATH wins; a missing one before it is passed over.
    assert tools.require_tool(ABSENT, "sh", install=INSTALL) == sh


def test_ci_run_turns_ci_on(monkeypatch: pytest.MonkeyPatch) -> None:
    exported = re.search(rf"^export {tools.CI_VARIABLE}=(\S+)$", CI_RUN.read_text(), re.M)
    assert exported, f"{CI_RUN} does not export {tools.CI_VARIABLE}"
    monkeypatch.setenv(tools.CI_VARIABLE, exported[1])
    assert tools.in_ci()


def _looks_for_a_ci_tool(call: ast.Call, source: str) -> bool:
    """A skip, a skipif or a PATH lookup whose text names Chromium, kcat or podman."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in ("skip", "skipif", "which", "importorskip"):
        return False
    return bool(CI_TOOLS.search(ast.get_source_segment(source, call) or ""))


def test_no_test_looks_for_chromium_kcat_or_podman_itself() -> None:
    """Each goes through tests/tools.py, so that in CI its absence fails."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in ("tools.py", "test_tools.py"):
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and _looks_for_a_ci_tool(node, source):
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert found == []


def test_the_rule_sees_a_skip_and_a_lookup_of_each_tool() -> None:
    """The scan above flags what it exists to flag (and passes other skips)."""
    flagged = [
        'shutil.which("kcat")',
        'pytest.skip("podman is not installed")',
        'pytest.mark.skipif(CHROME is None, reason="no headless Chromium")',
        'which("chromium-headless-shell")',
    ]
    passed = ['pytest.skip("needs a JVM")', 'shutil.which("kubectl")',
              'tools.require_tool("kcat", install="apt-get install -y kcat")']
    for text, expected in [*((t, True) for t in flagged), *((t, False) for t in passed)]:
        call = ast.parse(text).body[0].value
        assert isinstance(call, ast.Call)
        assert _looks_for_a_ci_tool(call, text) is expected, text
