"""A small JSON client for the Kubernetes API: objects as plain dicts, errors with their status.

Built on the official client's ``ApiClient`` (authentication, in-cluster and kubeconfig
loading, token refresh) but without its generated models, so that the operator, the
runner's platform and the jobs read and write exactly the manifests ``cluster_objects.py``
and ``experiment_objects.py`` build. Updates are JSON merge patches: the same patch works
on any API server (and on the test emulator), and a dict in the patch only touches the
keys it names.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from undertow.platform.base import PlatformError

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST API."""

    api_version: str
    plural: str

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"


KINDS: dict[str, Kind] = {
    "Pod": Kind("v1", "pods"),
    "Service": Kind("v1", "services"),
    "ConfigMap": Kind("v1", "configmaps"),
    "Secret": Kind("v1", "secrets"),
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "PersistentVolumeClaim": Kind("v1", "persistentvolumeclaims"),
    "Event": Kind("v1", "events"),
    "StatefulSet": Kind("apps/v1", "statefulsets"),
    "Job": Kind("batch/v1", "jobs"),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "BrokerCluster": Kind("undertow.dev/v1alpha1", "brokerclusters"),
    "ChaosExperiment": Kind("undertow.dev/v1alpha1", "chaosexperiments"),
}


class ApiError(PlatformError):
    """The API server refused a request; ``status`` is its HTTP status (0: unreachable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def labels_match(body: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = body.get("metadata", {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


class KubeApi:
    """Namespaced CRUD on the kinds in ``KINDS``; thread-safe (one urllib3 pool)."""

    def __init__(self, api_client: k8s_client.ApiClient, timeout_s: float = TIMEOUT_S) -> None:
        self._client = api_client
        self._timeout_s = timeout_s
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In a pod: its service account; elsewhere: the current kubeconfig context."""
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            try:
                k8s_config.load_kube_config(client_configuration=configuration)
            except (k8s_config.ConfigException, OSError) as exc:
                raise PlatformError(f"no Kubernetes credentials: not in a pod and no usable "
                                    f"kubeconfig ({exc})") from exc
        return cls(k8s_client.ApiClient(configuration))

    @classmethod
    def for_server(cls, url: str) -> KubeApi:
        """An unauthenticated client of ``url`` (a local API server or emulator)."""
        configuration = k8s_client.Configuration(host=url.rstrip("/"))
        return cls(k8s_client.ApiClient(configuration))

    # ---- verbs ----------------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._call("GET", self._path(kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str,
             labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Objects of ``kind`` in ``namespace`` carrying every label of ``labels``."""
        query = {}
        if labels:
            query["labelSelector"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        items = self._call("GET", self._path(kind, namespace), query=query).get("items", [])
        # Also filtered here: the selector is a server-side optimisation, not the contract.
        return [item for item in items if labels_match(item, labels or {})]

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``body`` in its ``metadata.namespace``; 409 when it exists already."""
        namespace = body["metadata"]["namespace"]
        return self._call("POST", self._path(body["kind"], namespace), body=dict(body))

    def patch(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        """JSON merge patch; ``None`` values remove keys."""
        path = self._path(kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self._call("PATCH", path, body=dict(patch), content_type=MERGE_PATCH)

    def delete(self, kind: str, namespace: str, name: str, *,
               grace_period_s: int | None = None, propagation: str | None = None) -> bool:
        """Delete the object; False when it was already gone."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        if propagation is not None:
            options["propagationPolicy"] = propagation
        try:
            self._call("DELETE", self._path(kind, namespace, name), body=options)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def apply(self, body: Mapping[str, Any],
              immutable: tuple[tuple[str, ...], ...] = ()) -> dict[str, Any]:
        """Create the object, or merge-patch the existing one to ``body``.

        ``immutable`` paths (e.g. ``("spec", "volumeClaimTemplates")``) are left out of the
        patch: the API server rejects any change to them once the object exists.
        """
        meta = body["metadata"]
        current = self.get(body["kind"], meta["namespace"], meta["name"])
        if current is None:
            try:
                return self.create(body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
        patch = json.loads(json.dumps(body))
        for path in immutable:
            parent = patch
            for key in path[:-1]:
                parent = parent.get(key, {})
            parent.pop(path[-1], None)
        return self.patch(body["kind"], meta["namespace"], meta["name"], patch)

    # ---- plumbing -------------------------------------------------------------------------

    @staticmethod
    def _path(kind: str, namespace: str, name: str | None = None) -> str:
        try:
            where = KINDS[kind]
        except KeyError:
            raise PlatformError(f"kind {kind!r} is not one this client knows") from None
        path = f"{where.prefix}/namespaces/{quote(namespace)}/{where.plural}"
        return f"{path}/{quote(name)}" if name else path

    def _call(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
              body: dict[str, Any] | None = None,
              content_type: str = "application/json") -> dict[str, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        with self._lock:  # param_serialize refreshes tokens; serialise that part only
            _, url, headers, payload, _ = self._client.param_serialize(
                method=method, resource_path=path, query_params=list((query or {}).items()),
                header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            response = self._client.call_api(method, url, header_params=headers, body=payload,
                                              _request_timeout=self._timeout_s)
            response.read()
        except k8s_client.ApiException as exc:
            raise ApiError(f"{method} {path}: HTTP {exc.status} {exc.reason}", exc.status or 0) \
                from exc
        except Exception as exc:  # urllib3 connection errors, timeouts
            raise ApiError(f"{method} {path}: {exc}", 0) from exc
        text = response.data.decode("utf-8", "replace") if response.data else ""
        if not 200 <= response.status < 300:
            raise ApiError(f"{method} {path}: HTTP {response.status} {_message(text)}",
                           response.status)
        return json.loads(text) if text.strip() else {}


def _message(text: str) -> str:
    """The ``message`` of a Kubernetes Status body, or the body itself."""
    try:
        return str(json.loads(text).get("message", text))[:500]
    except (ValueError, AttributeError):
        return text[:500]
