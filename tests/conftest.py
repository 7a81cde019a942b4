"""Fixtures shared by the operator and container tests: kmock's Kubernetes emulator with
the Undertow kinds, and a client of it."""

from __future__ import annotations

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


# Spark's Python workers run the Python of this test run (the explorer's tasks import
# Undertow), whoever creates the session first.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
