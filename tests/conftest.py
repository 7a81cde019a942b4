"""Fixtures shared by the operator and container tests: kmock's Kubernetes emulator with
the Undertow kinds, and a client of it."""

from __future__ import annotations

import kmock
import pytest
import pytest_asyncio

from undertow.kube.api import KubeApi


@pytest_asyncio.fixture
async def emulator(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    """The emulator serving core, apps, batch, rbac and the two Undertow kinds."""
    kmock.resources.load_bundled()
    for plural, kind in (("brokerclusters", "BrokerCluster"),
                         ("chaosexperiments", "ChaosExperiment")):
        kmock.resources[f"undertow.dev/v1alpha1/{plural}"] = kmock.ResourceInfo(
            kind=kind, singular=kind.lower(), namespaced=True, subresources={"status"},
            verbs={"get", "list", "watch", "create", "patch", "delete"})
    return kmock


@pytest.fixture
def api(emulator: kmock.KubernetesEmulator) -> KubeApi:
    return KubeApi.for_server(str(emulator.url))
