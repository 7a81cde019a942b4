"""Fixtures shared by the operator and container tests: kmock's Kubernetes emulator with
the Undertow kinds, and a client of it; and a bound on an asyncio test's loop teardown."""

from __future__ import annotations

import asyncio
import asyncio.runners
import io
import os
import sys
from pathlib import Path

import kmock
import kmock._internal.parsing as kmock_parsing
import pytest
import pytest_asyncio

# The Kubernetes, container and runner tests' helpers serve the tests beside them too.
sys.path.insert(0, str(Path(__file__).parent / "operator"))
sys.path.insert(0, str(Path(__file__).parent / "containers"))
sys.path.insert(0, str(Path(__file__).parent / "runner"))

from kube_helpers import NAMESPACE, serve_undertow_kinds

from undertow.kube.api import KubeApi
from undertow.platform.ports import PORT_RANGE_ENV, port_range


@pytest_asyncio.fixture
async def bare_emulator(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    """The emulator serving Kubernetes' own kinds and the namespace the tests use (kopf
    lists namespaces and serves the ones that exist), but not yet the Undertow kinds."""
    kmock.resources.load_bundled()
    kmock.objects["v1/namespaces", None, NAMESPACE] = {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "uid": f"uid-{NAMESPACE}", "resourceVersion": "1"}}
    return kmock


@pytest_asyncio.fixture
async def emulator(bare_emulator: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    """The emulator serving core, apps, batch, rbac and the two Undertow kinds."""
    serve_undertow_kinds(bare_emulator)
    return bare_emulator


def _parse_path(path: str) -> kmock_parsing.ParsedPath:
    """kmock 0.8 takes ``/api/v1/namespaces`` for a namespaced path missing its name and
    answers 500; a real API server reads it as the cluster-scoped list of namespaces."""
    if path.strip("/") == "api/v1/namespaces":
        return kmock_parsing.ParsedPath(group="", version="v1", plural="namespaces")
    return _kmock_parse_path(path)


_kmock_parse_path = kmock_parsing.parse_path
kmock_parsing.parse_path = _parse_path


@pytest.fixture
def api(emulator: kmock.KubernetesEmulator) -> KubeApi:
    return KubeApi.for_server(str(emulator.url))


def _worker_port_range() -> None:
    """Each pytest-xdist worker takes its own slice of the ports below the ephemeral range,
    so that one worker's experiment never takes a port another's stopped broker binds again
    (undertow.platform.ports)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or PORT_RANGE_ENV in os.environ:
        return
    low, high = port_range()
    width = (high - low) // int(count)
    start = low + int(worker.removeprefix("gw")) * width
    os.environ[PORT_RANGE_ENV] = f"{start}-{start + width}"


_worker_port_range()


# Spark's Python workers run the Python of this test run (the explorer's tasks import
# Undertow), whoever creates the session first.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


TASK_CANCELLATION_TIMEOUT_S = 5.0
"""How long the tasks left on an asyncio test's loop have to end once cancelled."""


def _cancel_all_tasks_within_a_bound(loop: asyncio.AbstractEventLoop) -> None:
    """``asyncio.Runner.close``'s cancellation of the tasks left on a loop, with a bound.

    pytest-asyncio closes each test's loop with ``asyncio.Runner``, which cancels every
    task left on it and waits for all of them with no bound: one task that ignores its
    cancellation (catches CancelledError and carries on: a component whose stop did not end
    it) holds the teardown until pytest-timeout's global timeout, whose traceback shows
    only the runner's wait. Here the wait ends after ``TASK_CANCELLATION_TIMEOUT_S``, and
    the teardown fails naming each such task and where it stands; the loop is closed
    regardless. pytest-asyncio offers no hook around the runner's close, and ``Runner.close``
    calls this module function by name, so it is replaced for the session."""
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.wait(tasks, timeout=TASK_CANCELLATION_TIMEOUT_S))
    stuck = [task for task in tasks if not task.done()]
    if stuck:
        pytest.fail(_ignored_cancellation(stuck), pytrace=False)
    for task in tasks:  # as asyncio's own: a task that failed is reported, not lost
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler({
                "message": "unhandled exception during asyncio.run() shutdown",
                "exception": task.exception(), "task": task})


def _ignored_cancellation(tasks: list[asyncio.Task]) -> str:
    out = io.StringIO()
    print(f"{len(tasks)} task(s) left on the test's event loop ignored their cancellation "
          f"for {TASK_CANCELLATION_TIMEOUT_S:g} s at its teardown (whatever started them "
          f"did not end them when it stopped):", file=out)
    for task in tasks:
        print(f"- {task.get_name()}: {task.get_coro()!r}", file=out)
        task.print_stack(file=out)
    return out.getvalue()


_unbounded_cancel_all_tasks = asyncio.runners._cancel_all_tasks


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with a ``long`` test first. pytest-xdist (``make test``) hands files out by
    their number of tests, most first, and in this order among files of the same number: a
    long file handed out last keeps one worker busy while the others have nothing left."""
    long_files = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in long_files)


def pytest_configure() -> None:
    asyncio.runners._cancel_all_tasks = _cancel_all_tasks_within_a_bound


def pytest_unconfigure() -> None:
    asyncio.runners._cancel_all_tasks = _unbounded_cancel_all_tasks
