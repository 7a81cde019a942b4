"""Helpers shared by the operator tests: the real kopf loop, polling, loopback ports, a
real process for the fault agent to pause, and the agent's iptables half when there is no
root."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kopf
from ports import free_port, ports_free  # noqa: F401  (re-exported for the operator tests)

from undertow.kube.agent import FaultAgent, Netfilter, Processes
from undertow.kube.agent.delays import Delays
from undertow.kube.api import KubeApi
from undertow.kube.config import OperatorConfig
from undertow.kube.handlers import register
from undertow.kube.operator import Operator
from undertow.platform.link_delay import LinkDelay
from undertow.platform.procfs import proc_stat

NAMESPACE = "chaos"
AGENT_TOKEN = "agent-secret"


async def eventually(probe: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Poll ``probe`` (sync, run in a thread) until it returns something truthy. The bound
    is generous: it ends a test that hangs, and a test that passes waits only as long as
    the operator takes (seconds quiet, 15-20 s seen on a 2-core machine with pytest's four
    workers and the operator's loop sharing it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        last = await asyncio.to_thread(probe)
        if last:
            return last
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or probe}; "
                                 f"last: {last!r}")
        await asyncio.sleep(0.05)


def can_use_netns() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "iptables"))


class UnprivilegedNetfilter(Netfilter):
    """Without root there is no network namespace to put rules in: keep them in a set
    (the iptables half of the agent is tested on real namespaces when root)."""

    def __init__(self) -> None:
        super().__init__(())
        self.dropped: set[tuple[str, str]] = set()
        self.queued: set[tuple[str, str, int]] = set()

    def setup(self) -> None:
        self.flush()

    def flush(self) -> None:
        self.dropped.clear()
        self.queued.clear()

    def drop(self, direction: str, peer: str) -> None:
        self.dropped.add((direction, peer))

    def undrop(self, direction: str, peer: str) -> None:
        self.dropped.discard((direction, peer))

    def enqueue(self, direction: str, peer: str, queue: int) -> None:
        self.queued.add((direction, peer, queue))

    def dequeue(self, direction: str, peer: str, queue: int) -> None:
        self.queued.discard((direction, peer, queue))

    def rules(self) -> list[str]:
        return sorted([f"-A {d} {p}" for d, p in self.dropped]
                      + [f"-A {d} {p} NFQUEUE {q}" for d, p, q in self.queued])


class UnprivilegedDelays(Delays):
    """Without root no queue can be bound: remember what would be delayed, and on which
    queue number."""

    def __init__(self) -> None:
        super().__init__()
        self.delayed: dict[tuple[str, str], tuple[int, LinkDelay]] = {}
        self._numbers = iter(range(1, 1 << 16))

    def start(self, direction: str, peer: str, delay: LinkDelay) -> int:
        self.stop(direction, peer)
        queue = next(self._numbers)
        self.delayed[(direction, peer)] = (queue, delay)
        return queue

    def queue(self, direction: str, peer: str) -> int | None:
        found = self.delayed.get((direction, peer))
        return None if found is None else found[0]

    def stop(self, direction: str, peer: str) -> None:
        self.delayed.pop((direction, peer), None)

    def stop_all(self) -> None:
        self.delayed.clear()

    def links(self) -> list[tuple[str, str]]:
        return sorted(self.delayed)


def make_delays(namespace: str | None) -> Delays:
    """Delayers inside ``namespace`` (root), else the unprivileged stand-in."""
    if namespace is None:
        return UnprivilegedDelays()
    return Delays(("ip", "netns", "exec", namespace))


def make_netfilter(namespace: str | None) -> Netfilter:
    """iptables inside ``namespace`` (root), else the unprivileged stand-in."""
    if namespace is None:
        return UnprivilegedNetfilter()
    return Netfilter(("ip", "netns", "exec", namespace, "iptables", "-w"))


SLEEPER = "import time\nwhile True: time.sleep(0.05)"


def record_pid(pid_file: Path, pid: int) -> None:
    """What the broker container's launcher writes for the fault agent
    (``cluster_objects.RECORD_PID``): the pid and its start time, ``PID START``."""
    stat = proc_stat(pid)
    assert stat is not None, f"no process {pid}"
    pid_file.write_text(f"{pid} {stat[1]}\n")


class Target:
    """A real process standing in for the broker, its pid recorded in ``pid_file`` as its
    launcher would. ``code`` runs with ``sys.argv[1]`` the marker and ``args`` after it."""

    def __init__(self, code: str = SLEEPER, *args: str) -> None:
        self.marker = f"undertow-test-target-{uuid.uuid4().hex}"
        self.process = subprocess.Popen([sys.executable, "-c", code, self.marker, *args])
        # Popen returns after fork; wait until exec shows the marker in the command line.
        cmdline = Path(f"/proc/{self.process.pid}/cmdline")
        deadline = time.monotonic() + 10
        while self.marker.encode() not in cmdline.read_bytes():
            if time.monotonic() > deadline:
                raise TimeoutError("the target process did not start")
            time.sleep(0.01)
        self._dir = Path(tempfile.mkdtemp(prefix="undertow-target-"))
        self.pid_file = self._dir / "broker.pid"
        record_pid(self.pid_file, self.process.pid)

    def processes(self) -> Processes:
        """What the fault agent of this target's pod signals."""
        return Processes(self.marker, self.pid_file)

    def state(self) -> str:
        """/proc state letter: T when stopped."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


class RunningAgent:
    def __init__(self, agent: FaultAgent, port: int) -> None:
        self.agent = agent
        self.port = port
        self.url = f"http://127.0.0.1:{port}"


def pod_ip(index: int) -> str:
    return f"10.244.0.{index + 10}"


def add_pods(api: KubeApi, cluster: str = "c", brokers: int = 3,
             only: str | None = None) -> None:
    """What the StatefulSets and the kubelet would show: running, ready pods (``only``: that
    one pod, as a StatefulSet replaces a deleted one)."""
    names = [f"{cluster}-controller-0"] + [f"{cluster}-broker-{i}" for i in range(brokers)]
    for index, name in enumerate(names):
        if only not in (None, name):
            continue
        api.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}",
                                 "labels": {"undertow.dev/cluster": cluster}},
                    "status": running_status(index)})


def running_status(index: int, restarts: int = 0) -> dict[str, Any]:
    return {"podIP": pod_ip(index),
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "minibroker", "restartCount": restarts,
                                   "state": {"running": {}}}]}


def stored(emulator: Any, kind: str, name: str) -> dict[str, Any] | None:
    """The emulator's current copy of an object in NAMESPACE (None: absent or deleted);
    read from memory, so it is safe to call in the event loop that serves the API."""
    import kmock

    from undertow.kube.api import KINDS

    where = KINDS[kind]
    key = (kmock.resource(f"{where.api_version}/{where.plural}"), NAMESPACE, name)
    if key not in emulator.objects or emulator.objects[key].deleted:
        return None
    return copy.deepcopy(emulator.objects[key].raw)


@contextlib.asynccontextmanager
async def running_operator(server: str, api: KubeApi,
                           config: OperatorConfig) -> AsyncIterator[Operator]:
    """The real kopf operator loop against ``server``, in a thread with its own event loop
    (kopf cancels every task of its loop when it stops)."""
    registry = kopf.OperatorRegistry()
    reconciler = Operator(api, config)
    register(registry, reconciler, kopf.ConnectionInfo(server=server))
    settings = kopf.OperatorSettings()
    # Quick to stop and to retry: the emulator answers in microseconds.
    settings.queueing.exit_timeout = 0.1
    settings.queueing.error_delays = (0.1, 0.2, 0.5, 1.0)
    settings.background.instant_exit_timeout = 0.01
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(kopf.operator(registry=registry, settings=settings,
                                      namespaces=[NAMESPACE], standalone=True,
                                      stop_flag=stop, ready_flag=ready))
        except BaseException as exc:  # surfaced below
            failure.append(exc)

    thread = threading.Thread(target=run, name="kopf", daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 10), "the operator did not start"
    try:
        yield reconciler
    finally:
        stop.set()
        # kopf ends a sync handler's task only once its thread returns (kopf's
        # invocation.invoke postpones the cancellation), and a handler's API call is bounded
        # by KubeApi's 10 s, which urllib3 retries up to 3 times: under a loaded machine one
        # slow answer of the emulator has held the stop past 15 s.
        await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive(), "the operator did not stop:\n" + threads_now()
        assert not failure, failure


def threads_now() -> str:
    """Every thread's stack, for a stop that did not come."""
    frames = sys._current_frames()
    return "\n".join(f"--- {t.name}\n" + "".join(traceback.format_stack(frames[t.ident]))
                     for t in threading.enumerate() if t.ident in frames)


def serve_undertow_kinds(emulator: Any) -> None:
    """What installing the two CRDs makes the API server serve."""
    import kmock

    for plural, kind in (("brokerclusters", "BrokerCluster"),
                         ("chaosexperiments", "ChaosExperiment")):
        emulator.resources[f"undertow.dev/v1alpha1/{plural}"] = kmock.ResourceInfo(
            kind=kind, singular=kind.lower(), namespaced=True, subresources={"status"},
            verbs={"get", "list", "watch", "create", "patch", "delete"})
