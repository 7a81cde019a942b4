"""What the platform and the operator call to reach a pod's fault agent."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from undertow.kube.agent.errors import AgentError


class AgentClient:
    """What the platform and the operator call; errors are ``AgentError`` (status 0:
    the agent could not be reached)."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def pause(self, deadline_s: float) -> None:
        self._call("POST", "/v1/pause", {"deadline_s": deadline_s})

    def resume(self) -> None:
        self._call("POST", "/v1/resume", {})

    def kill(self, deadline_s: float) -> None:
        self._call("POST", "/v1/kill", {"deadline_s": deadline_s})

    def release(self) -> None:
        self._call("POST", "/v1/release", {})

    def drop(self, direction: str, peer: str, deadline_s: float) -> None:
        self._call("PUT", f"/v1/drops/{direction}/{peer}", {"deadline_s": deadline_s})

    def undrop(self, direction: str, peer: str) -> None:
        self._call("DELETE", f"/v1/drops/{direction}/{peer}", {})

    def heal(self) -> None:
        self._call("POST", "/v1/heal", {})

    def faults(self) -> dict[str, Any]:
        return self._call("GET", "/v1/faults", None)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise AgentError(f"{method} {url}: HTTP {exc.code} {detail}", exc.code) from exc
        except (OSError, ValueError) as exc:
            raise AgentError(f"{method} {url}: {exc}", 0) from exc
