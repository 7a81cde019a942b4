"""No test sleeps and then checks state.

A sleep before a check is a guess at how long something takes: on a loaded machine the
thing checked (a stall, a hold, a task) may not have happened yet, or may already be over.
Tests wait on the state itself with a bounded poll instead. The rule, on the syntax tree of
every module under ``tests/``:

- a *sleep* is a call of ``time.sleep`` or ``asyncio.sleep`` under any name (``sleep``,
  ``from time import sleep as pause``), anywhere in a statement (``asyncio.gather(
  asyncio.sleep(1), ...)``), a wait on an ``Event`` made on the spot (``Event().wait(1)``:
  nothing can set it), a blocking ``sleep`` command (``subprocess.run(["sleep", "1"])``,
  ``os.system("sleep 1")``), or a call of a function of the tests whose body sleeps outside
  any poll loop (a helper, followed across modules of ``tests/``);
- a *check* is an ``assert``, a ``raise`` or a ``pytest.fail(...)``;
- a sleep must not be followed by a check later in its block, nor, climbing out of the
  ``if``, ``with`` and ``try`` blocks around it, later in any enclosing block of the same
  function. Climbing stops at a poll loop (a ``while``, or a ``for`` that can ``break`` or
  ``return``): a poll's sleep ends its body, and the check after the loop is on the state
  the loop waited for;
- a ``while`` loop that sleeps has a deadline: its body fails (a check), or the loop reads
  a clock (``time.monotonic()``, ``loop.time()``).

``asyncio.sleep`` in a module that runs on the simulator's virtual clock (it imports
``undertow.sim.virtual_loop`` or ``test_virtual_loop``'s runner) is exact, not a guess, and
is no sleep; ``time.sleep`` there still is.

A sleep that is the point of a test (a fault it injects, not a wait) carries the marker
``# hold:`` and a reason on its line; ``HOLDS`` names every such function, and a marker
anywhere else, or on a line without a sleep, fails the rule.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
HOLD = re.compile(r"#\s*hold:\s*\S")
HOLDS = {
    ("minibroker/test_broker_lifecycle.py", "_hold_the_event_loop"),
    ("runner/test_proxy_delay.py", "test_requests_in_flight_are_delayed_together_and_in_order"),
}
"""The deliberate holds, (module under tests/, function): the event loop held as a fault,
and requests spaced in time so that a delayed link holds several chunks at once."""

_SLEEP_MODULES = {"time", "asyncio"}
_BLOCKING_RUNS = {"run", "call", "check_call", "check_output", "system", "getoutput",
                  "getstatusoutput"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class Module:
    """One module's names: what each imported name is, and its functions."""

    tree: ast.Module
    holds: set[int]
    """The lines with a ``# hold:`` comment."""
    sleep_names: set[str] = field(default_factory=lambda: {"sleep"})
    """Names bound to time.sleep or asyncio.sleep (``sleep``, ``pause``)."""
    module_names: dict[str, str] = field(default_factory=dict)
    """Local name -> module, for ``import time``, ``import asyncio as aio``."""
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Local name -> (module, name) for ``from helpers import wait as w``."""
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    """The module's own (top-level) functions."""
    virtual: bool = False
    """Runs its asyncio code on the simulator's virtual clock, where ``asyncio.sleep`` is
    exact: it imports ``undertow.sim.virtual_loop`` (or ``test_virtual_loop``'s runner)."""
    time_sleeps: set[str] = field(default_factory=set)
    """The names in ``sleep_names`` bound to ``time.sleep``: real even on a virtual clock."""


def _module(source: str) -> Module:
    tree = ast.parse(source)
    module = Module(tree, {
        token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and HOLD.match(token.string)})
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module.module_names[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module in _SLEEP_MODULES and alias.name == "sleep":
                    module.sleep_names.add(local)
                    if node.module == "time":
                        module.time_sleeps.add(local)
                else:
                    module.imported[local] = (node.module.rsplit(".", 1)[-1], alias.name)
            module.virtual |= node.module.endswith("virtual_loop")
    module.functions = {node.name: node for node in tree.body if isinstance(node, _FUNCTIONS)}
    if module.virtual:
        module.sleep_names = module.time_sleeps
    return module


def _walk_expression(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it contains, but not the bodies of functions and lambdas defined in
    it (they run later, if at all)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (*_FUNCTIONS, ast.Lambda, ast.ClassDef)):
            yield from _walk_expression(child)


def _is_event(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        getattr(node.func, "id", None) == "Event" or getattr(node.func, "attr", None) == "Event")


def _runs_sleep(call: ast.Call) -> bool:
    """A blocking run of the ``sleep`` command: ``["sleep", "1"]`` or ``"sleep 1"``."""
    if not call.args:
        return False
    first = call.args[0]
    if isinstance(first, (ast.List, ast.Tuple)) and first.elts:
        first = first.elts[0]
    return (isinstance(first, ast.Constant) and isinstance(first.value, str)
            and re.match(r"\s*(\S*/)?sleep\b", first.value) is not None)


class Rule:
    """The rule over a set of modules (by their name), following helpers across them."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self._by_stem: dict[str, list[str]] = {}
        for name in modules:
            self._by_stem.setdefault(Path(name).stem, []).append(name)
        self._sleeper: dict[tuple[str, str], bool] = {}

    def _resolve(self, module: str, call: ast.Call) -> tuple[str, str] | None:
        """The (module, function) of the tests a call names, if any."""
        func = call.func
        here = self.modules[module]
        if isinstance(func, ast.Name):
            if func.id in here.functions:
                return module, func.id
            if func.id in here.imported:
                stem, name = here.imported[func.id]
                # As pytest imports them: the module beside this one, else the only one.
                candidates = self._by_stem.get(stem, [])
                beside = [c for c in candidates if Path(c).parent == Path(module).parent]
                if beside or len(candidates) == 1:
                    return (beside or candidates)[0], name
        return None

    def is_sleep_call(self, module: str, call: ast.Call) -> bool:
        here = self.modules[module]
        func = call.func
        if isinstance(func, ast.Name) and func.id in here.sleep_names:
            return True
        if isinstance(func, ast.Attribute):
            owner = func.value
            owner_module = (here.module_names.get(owner.id)
                            if isinstance(owner, ast.Name) else None)
            sleeps_on = owner_module or getattr(owner, "id", None)
            if func.attr == "sleep" and (sleeps_on == "time" or (
                    sleeps_on == "asyncio" and not here.virtual)):
                return True
            if func.attr == "wait" and _is_event(owner):
                return True
            if func.attr in _BLOCKING_RUNS and _runs_sleep(call):
                return True
        target = self._resolve(module, call)
        return target is not None and self.sleeps(*target)

    def is_sleep(self, module: str, statement: ast.stmt) -> bool:
        """Whether ``statement`` itself (not a block inside it) sleeps, unmarked."""
        if statement.lineno in self.modules[module].holds:
            return False
        headers: list[ast.AST]
        if isinstance(statement, (ast.If, ast.While)):
            headers = [statement.test]
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            headers = [item.context_expr for item in statement.items]
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            headers = [statement.iter]
        elif isinstance(statement, (*_FUNCTIONS, ast.ClassDef, ast.Try, ast.Match)):
            headers = []
        else:
            headers = [statement]
        return any(isinstance(node, ast.Call) and self.is_sleep_call(module, node)
                   for header in headers for node in _walk_expression(header))

    def sleeps(self, module: str, name: str) -> bool:
        """Whether calling the function sleeps: a sleep in its body outside any loop."""
        key = (module, name)
        if key not in self._sleeper:
            self._sleeper[key] = False  # recursion: not a sleeper until shown to be
            function = self.modules[module].functions.get(name)
            self._sleeper[key] = function is not None and any(
                self.is_sleep(module, s) for s in _outside_loops(function.body))
        return self._sleeper[key]

    def violations(self, module: str) -> list[int]:
        """The lines of the sleeps a check follows."""
        found = set()
        for chain in _statements(self.modules[module].tree.body, []):
            statement, climbs = chain
            if self.is_sleep(module, statement) and any(_has_check(later)
                                                        for later in climbs):
                found.add(statement.lineno)
        return sorted(found)


    def unbounded_polls(self, module: str) -> list[int]:
        """The lines of the ``while`` loops that sleep with no deadline: nothing in the body
        fails, and the loop reads no clock (``time.monotonic()``, ``loop.time()``)."""
        found = []
        for node in ast.walk(self.modules[module].tree):
            if not isinstance(node, ast.While) or not any(
                    self.is_sleep(module, s) for s in _outside_loops(node.body)):
                continue
            clock = any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) in (
                "monotonic", "time") for n in _walk_expression(node))
            if not clock and not any(_has_check(s) for s in node.body):
                found.append(node.lineno)
        return found


def _outside_loops(block: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A function body's statements that run once per call: not in a loop, not in a nested
    function."""
    for statement in block:
        yield statement
        if isinstance(statement, (ast.While, ast.For, ast.AsyncFor, *_FUNCTIONS,
                                  ast.ClassDef)):
            continue
        for inner in _inner_blocks(statement):
            yield from _outside_loops(inner)


def _inner_blocks(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(statement, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(statement, "handlers", []):
        yield handler.body
    for case in getattr(statement, "cases", []):
        yield case.body


def _is_poll(statement: ast.stmt) -> bool:
    """A loop that waits on something: a ``while``, or a ``for`` that can leave early."""
    if isinstance(statement, ast.While):
        return True
    if isinstance(statement, (ast.For, ast.AsyncFor)):
        return any(isinstance(n, (ast.Break, ast.Return)) for s in statement.body
                   for n in _walk_expression(s))
    return False


def _statements(block: list[ast.stmt], after: list[list[ast.stmt]]
                ) -> Iterator[tuple[ast.stmt, list[ast.stmt]]]:
    """Every statement with the statements that run after it up to the end of its
    function (or poll loop): later in its block, then after each enclosing block."""
    for i, statement in enumerate(block):
        rest = block[i + 1:]
        later = [s for enclosing in after for s in enclosing]
        yield statement, rest + later
        if isinstance(statement, (*_FUNCTIONS, ast.ClassDef)):
            yield from _statements(statement.body, [])
            continue
        inner_after = [] if _is_poll(statement) else [rest, *after]
        for inner in _inner_blocks(statement):
            yield from _statements(inner, inner_after)


def _has_check(statement: ast.stmt) -> bool:
    for node in _walk_expression(statement):
        if isinstance(node, (ast.Assert, ast.Raise)):
            return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "fail" and getattr(node.func.value, "id", None)
                == "pytest"):
            return True
    return False


def _markers(module: Module) -> Iterator[tuple[int, str | None]]:
    """Each ``# hold:`` marker's line and the function it is in (None at module level)."""
    owners: dict[int, str] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, _FUNCTIONS):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                owners[line] = node.name  # innermost last: ast.walk goes outside in
    for number in sorted(module.holds):
        yield number, owners.get(number)


def check(sources: dict[str, str]) -> list[str]:
    """Every breach of the rule in ``sources`` (module name -> source), as
    ``module:line: what``."""
    modules = {name: _module(source) for name, source in sources.items()}
    rule = Rule(modules)
    found = [f"{name}:{line}: a sleep a check follows"
             for name in modules for line in rule.violations(name)]
    found += [f"{name}:{line}: a poll without a deadline"
              for name in modules for line in rule.unbounded_polls(name)]
    for name, module in modules.items():
        for line, owner in _markers(module):
            statement = next((s for s in ast.walk(module.tree)
                              if isinstance(s, ast.stmt) and s.lineno == line), None)
            unmarked = Rule({**modules, name: Module(
                module.tree, module.holds - {line}, module.sleep_names, module.module_names,
                module.imported, module.functions)})
            if statement is None or not unmarked.is_sleep(name, statement):
                found.append(f"{name}:{line}: a hold marker on a line that does not sleep")
            elif (name, owner) not in HOLDS:
                found.append(f"{name}:{line}: a hold HOLDS does not name ({owner})")
    return found


def _tests_sources() -> dict[str, str]:
    return {str(path.relative_to(TESTS)): path.read_text()
            for path in sorted(TESTS.rglob("*.py"))}


def test_no_test_sleeps_before_a_check() -> None:
    found = check(_tests_sources())
    assert not found, ("a sleep followed by a check: wait on the state with a bounded poll "
                       "instead (or mark a deliberate hold), at " + "; ".join(found))


def test_every_hold_is_marked_where_holds_names_it() -> None:
    sources = _tests_sources()
    marked = {(name, owner) for name, source in sources.items()
              for _, owner in _markers(_module(source))}
    assert marked == HOLDS


def sleeps_before_checks(source: str, **helpers: str) -> list[int]:
    """The lines of ``source``'s sleeps a check follows and of its polls without a deadline
    (``helpers``: other modules, by name, that it may import from)."""
    rule = Rule({"m": _module(source), **{n: _module(s) for n, s in helpers.items()}})
    return sorted({*rule.violations("m"), *rule.unbounded_polls("m")})


@pytest.mark.parametrize(("source", "lines"), [
    # What the rule is for: the sleeps this repository's tests had.
    ("time.sleep(0.5)\nassert held.poll() is None\n", [1]),
    ("time.sleep(0.3)\ncount = len(acked)\ntime.sleep(0.8)\nassert len(acked) == count\n",
     [1, 3]),
    ("async def f():\n    await asyncio.sleep(0.01)\n    response = await handle()\n"
     "    assert response.error_code == 0\n", [2]),
    ("with cluster:\n    sleep(1)\n    assert cluster.ready\n", [2]),
    # The escapes the first rule had.
    ("def hold():\n    time.sleep(1)\n\ndef test():\n    hold()\n    assert ready()\n", [5]),
    ("def hold():\n    if slow:\n        time.sleep(1)\n\ndef test():\n    hold()\n"
     "    assert ready()\n", [6]),
    ("if slow:\n    time.sleep(1)\nassert ready()\n", [2]),
    ("with cluster:\n    time.sleep(1)\nassert cluster.ready\n", [2]),
    ("with a:\n    if b:\n        time.sleep(1)\n    x = 1\nassert x\n", [3]),
    ("try:\n    time.sleep(1)\nfinally:\n    stop()\nassert stopped()\n", [2]),
    ("from time import sleep as pause\npause(1)\nassert ready()\n", [2]),
    ("import time as clock\nclock.sleep(1)\nassert ready()\n", [2]),
    ("Event().wait(1)\nassert ready()\n", [1]),
    ("threading.Event().wait(timeout=1)\nassert ready()\n", [1]),
    ("async def f():\n    await asyncio.gather(asyncio.sleep(1), poke())\n"
     "    assert ready()\n", [2]),
    ("subprocess.run(['sleep', '1'])\nassert ready()\n", [1]),
    ("subprocess.check_call('sleep 1', shell=True)\nassert ready()\n", [1]),
    ("os.system('sleep 1')\nassert ready()\n", [1]),
    ("time.sleep(1)\nif not ready():\n    pytest.fail('not ready')\n", [1]),
    ("time.sleep(1)\nif not ready():\n    raise AssertionError('not ready')\n", [1]),
    ("for _ in range(3):\n    time.sleep(1)\nassert ready()\n", [2]),
    ("def f():\n    def hold():\n        time.sleep(1)\n    assert ready()\n", []),
    ("while not ready():\n    time.sleep(0.1)\n", [1]),
    ("async def f():\n    while pool.waiting < 3:\n        await asyncio.sleep(0)\n", [2]),
    # Polls, fakes, deadlines and marked holds pass.
    ("while not ready():\n    assert time.monotonic() < deadline\n    time.sleep(0.1)\n"
     "assert state() == 'ok'\n", []),
    ("while not ready() and time.monotonic() < deadline:\n    time.sleep(0.1)\n", []),
    ("while True:\n    if done():\n        break\n    assert time.monotonic() < deadline\n"
     "    time.sleep(0.2)\nassert result()\n", []),
    ("for _ in range(50):\n    if done():\n        break\n    time.sleep(0.1)\n"
     "else:\n    pytest.fail('never done')\n", []),
    ("def until(ok):\n    while not ok():\n        assert time.monotonic() < deadline\n"
     "        time.sleep(0.1)\n\ndef test():\n    until(ready)\n    assert state()\n", []),
    ("async def request():\n    await asyncio.sleep(0)\n    return answer\n", []),
    ("SLEEPER = 'import time; time.sleep(600)'\nassert SLEEPER\n", []),
    ("sleeper = subprocess.Popen(['sleep', '30'])\nassert sleeper.pid\n", []),
    ("from undertow.sim.virtual_loop import run_simulation\n"
     "async def main():\n    await asyncio.sleep(2)\n    assert loop.time() == 2\n", []),
    ("from test_virtual_loop import run\ntime.sleep(1)\nassert done()\n", [2]),
    ("assert done.wait(5)\n", []),
    ("def hold():\n    time.sleep(1)  # hold: the fault under test\n\ndef test():\n"
     "    hold()\n    assert ready()\n", []),
], ids=["sleep-assert", "sleep-observe-sleep-assert", "await-sleep-call-assert",
        "bare-sleep-in-with", "helper", "helper-nested-sleep", "nested-if", "nested-with",
        "nested-twice", "try-finally", "alias", "module-alias", "event-wait",
        "event-wait-timeout", "sleep-in-gather", "subprocess-sleep", "shell-sleep",
        "os-system-sleep", "pytest-fail", "raise", "for-without-break",
        "sleeper-defined-not-called", "poll-without-deadline",
        "async-poll-without-deadline", "poll-loop", "deadline-in-condition", "deadline-in-loop",
        "for-else-poll", "poll-helper", "fake-round-trip", "sleep-in-a-string", "sleep-process",
        "virtual-clock", "real-sleep-on-a-virtual-clock",
        "event-wait-on-state", "marked-hold"])
def test_the_rule_flags_sleeps_before_checks_and_passes_polls(source: str,
                                                              lines: list[int]) -> None:
    assert sleeps_before_checks(source) == lines


def test_the_rule_follows_a_helper_into_the_module_it_comes_from() -> None:
    helpers = "import time\n\ndef settle():\n    time.sleep(1)\n"
    source = "from helpers import settle as calm\n\ncalm()\nassert ready()\n"
    assert sleeps_before_checks(source, helpers=helpers) == [3]
    assert sleeps_before_checks(source) == []  # a module outside the tests is not followed


def test_a_hold_marker_must_sleep_and_be_named() -> None:
    marked = "def hold():\n    time.sleep(1)  # hold: the fault\n"
    assert check({"m.py": marked}) == ["m.py:2: a hold HOLDS does not name (hold)"]
    stale = "def hold():\n    x = 1  # hold: once a sleep\n"
    assert check({"m.py": stale}) == ["m.py:2: a hold marker on a line that does not sleep"]
