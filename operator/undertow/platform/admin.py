"""Calls to a node's HTTP endpoint: ``/v1/state`` and the broker failpoints.

The same on every platform; only the URL differs (loopback, a namespace address, a pod).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from undertow.platform.base import PlatformError

TIMEOUT_S = 2.0


class AdminError(PlatformError):
    """The admin endpoint refused a request (``status`` set) or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def get_state(base_url: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    return _request("GET", f"{base_url}/v1/state", timeout=timeout)


def set_failpoint(base_url: str, name: str, token: str, body: dict[str, Any] | None = None,
                  timeout: float = TIMEOUT_S) -> dict[str, Any]:
    return _request("POST", f"{base_url}/v1/failpoints/{name}", body=body or {}, token=token,
                    timeout=timeout)


def clear_failpoint(base_url: str, name: str, token: str,
                    timeout: float = TIMEOUT_S) -> dict[str, Any]:
    return _request("DELETE", f"{base_url}/v1/failpoints/{name}", token=token, timeout=timeout)


def _request(method: str, url: str, *, body: dict[str, Any] | None = None,
             token: str | None = None, timeout: float) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise AdminError(f"{method} {url}: HTTP {exc.code} {detail}", exc.code) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise AdminError(f"{method} {url}: {exc}") from exc
    if not payload.strip():
        return {}
    try:
        return json.loads(payload)
    except ValueError as exc:
        raise AdminError(f"{method} {url}: response is not JSON: {payload[:200]!r}") from exc
