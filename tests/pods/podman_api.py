"""The few API-server requests a runner Job and an analysis Job make, answered from podman's
state for ``make e2e-pods`` (see ``pods_helpers``), and the podman command it uses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import urllib.request
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pods_helpers import ClusterOnPods

NAMESPACE = "undertow"


def podman(*args: str, check: bool = True, timeout: float = 300,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(Path(__file__).resolve().parents[2] / "scripts" /
                                          "containers.conf"))
    result = subprocess.run(["podman", *args], capture_output=True, text=True, env=env,
                            timeout=timeout, check=False, input=input)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


class PodmanApi:
    """The requests the runner's platform and the analysis Job make, answered from podman.

    GET a Pod: its uid, labels and IP, the ``minibroker`` container's state and restart
    count, and Ready as the kubelet would compute it from the pod's own readiness probe;
    DELETE a cluster Pod (``ClusterOnPods.delete_pod``: the StatefulSet replaces it); POST
    an Event; GET and PATCH a ConfigMap (the report); GET the cluster's Secret.
    """

    def __init__(self, pods: ClusterOnPods, host: str) -> None:
        self.pods = pods
        self.objects: dict[str, dict[str, dict[str, Any]]] = {
            "ConfigMap": {}, "Event": {}, "Secret": {pods.secret["metadata"]["name"]:
                                                     pods.secret}}
        self._server = ThreadingHTTPServer((host, 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def pod(self, name: str) -> dict[str, Any] | None:
        inspected = podman("pod", "inspect", "--format", "{{.ID}}|{{.State}}", name,
                           check=False)
        if inspected.returncode != 0 or name not in self.pods.pods:
            return None
        pod_id, pod_state = inspected.stdout.strip().split("|", 1)
        ip = self.pods.pods[name]
        main = self.pods.container_state(name, "minibroker")
        running = main["Status"] == "running"
        ready = running and pod_state == "Running" and _probe(f"http://{ip}:9100/v1/state")
        labels = dict(self.pods.labels.get(name, {}))
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": pod_id,
                         "labels": labels},
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                "containerStatuses": [{
                    "name": "minibroker", "restartCount": main["RestartCount"],
                    "state": {"running": {}} if running else {"terminated": {
                        "exitCode": main.get("ExitCode")}}}],
            },
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self
        path_re = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>[a-z]+)"
                             r"(?:/(?P<name>[^/?]+))?")
        kinds = {"pods": "Pod", "events": "Event", "configmaps": "ConfigMap",
                 "secrets": "Secret"}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Mapping[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, message: str) -> None:
                self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "code": code, "message": message})

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def _route(self) -> tuple[str, str | None] | None:
                match = path_re.match(self.path)
                if not match or match["ns"] != NAMESPACE or match["plural"] not in kinds:
                    self._status(404, f"{self.command} {self.path} is not served here")
                    return None
                return kinds[match["plural"]], match["name"]

            def do_GET(self) -> None:
                route = self._route()
                if route is None:
                    return
                kind, name = route
                body = api.pod(name) if kind == "Pod" and name else \
                    api.objects.get(kind, {}).get(name or "")
                if body is None:
                    self._status(404, f"{kind.lower()}s \"{name}\" not found")
                else:
                    self._reply(200, body)

            def do_POST(self) -> None:
                route = self._route()
                if route is None:
                    return
                kind, _ = route
                body = self._body()
                api.objects.setdefault(kind, {})[body["metadata"]["name"]] = body
                self._reply(201, body)

            def do_DELETE(self) -> None:
                route = self._route()
                if route is None:
                    return
                kind, name = route
                grace = int(self._body().get("gracePeriodSeconds") or 0)
                if kind != "Pod" or not name or not api.pods.delete_pod(name, grace):
                    self._status(404, f"{kind.lower()}s \"{name}\" not found")
                    return
                self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

            def do_PATCH(self) -> None:
                route = self._route()
                if route is None:
                    return
                kind, name = route
                current = api.objects.get(kind, {}).get(name or "")
                if current is None:
                    self._status(404, f"{kind.lower()}s \"{name}\" not found")
                    return
                patch = self._body()
                current.setdefault("data", {}).update(patch.get("data") or {})
                self._reply(200, current)

        return Handler


def _probe(url: str) -> bool:
    """The readiness probe: an HTTP GET answered 2xx within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return 200 <= response.status < 300
    except OSError:
        return False
