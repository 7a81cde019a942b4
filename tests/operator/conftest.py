"""Fixtures: the real kopf operator loop against kmock's emulator (``tests/conftest.py``),
and a real fault agent on loopback."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import kmock
import pytest
import pytest_asyncio
from kube_helpers import (
    AGENT_TOKEN,
    NAMESPACE,
    RunningAgent,
    Target,
    can_use_netns,
    free_port,
    make_delays,
    make_netfilter,
    running_operator,
)

from undertow.kube.agent import FaultAgent, make_server
from undertow.kube.api import KubeApi
from undertow.kube.config import OperatorConfig
from undertow.kube.operator import Operator
from undertow.kube.platform import Endpoints


@pytest.fixture
def netns() -> Iterator[str | None]:
    """A fresh network namespace (root only; None otherwise)."""
    if not can_use_netns():
        yield None
        return
    name = f"ut-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def agent(target: Target, netns: str | None) -> Iterator[RunningAgent]:
    """A real fault agent on loopback, targeting ``target``, its rules in ``netns``."""
    fault_agent = FaultAgent(make_netfilter(netns), target.processes(),
                             delays=make_delays(netns))
    fault_agent.start()
    server = make_server(fault_agent, "127.0.0.1", 0, AGENT_TOKEN)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield RunningAgent(fault_agent, server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        fault_agent.heal()
        fault_agent.close()


@pytest.fixture
def operator_config(agent: RunningAgent) -> OperatorConfig:
    """Every pod's endpoints on loopback: the agent answers, /v1/state is refused."""
    return OperatorConfig(
        namespaces=(NAMESPACE,), interval_s=0.1, heal_timeout_s=30.0, http_timeout_s=1.0,
        endpoints=Endpoints(host_template="127.0.0.1", admin_port=free_port(),
                            agent_port=agent.port))


@pytest_asyncio.fixture
async def operator(emulator: kmock.KubernetesEmulator, api: KubeApi,
                   operator_config: OperatorConfig) -> AsyncIterator[Operator]:
    """The real kopf operator loop against the emulator."""
    async with running_operator(str(emulator.url), api, operator_config) as reconciler:
        yield reconciler
