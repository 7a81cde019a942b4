"""The one client of the control endpoints: the small HTTP APIs beside the Kafka listeners.

Every broker and the controller serve ``/v1/state`` and their failpoints (``admin.py``),
every pod's fault agent its faults (``kube/agent/client.py``); all of them take JSON, answer
a JSON object and, except for reads, want a bearer token. This module does the HTTP once.

Its callers decide one thing from a failure: whether the endpoint *refused* the request
(it was there and said no: a wrong token, a missing process, a bad argument) or could
*not be reached* (nothing answered as the endpoint would). During a fault the second is
usually the fault itself: a killed broker, a pod being replaced, a power-loss failpoint
that exits the broker before it answers. So there are exactly two error types, told apart
by type, and both are ``PlatformError``s for the callers that need not tell them apart.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from undertow.platform.errors import PlatformError

_DETAIL_CHARS = 300
"""How much of an error body goes into an error message."""


class EndpointError(PlatformError):
    """A control-endpoint request failed: ``EndpointUnreachable`` or ``EndpointRefused``."""


class EndpointUnreachable(EndpointError):
    """No answer the endpoint could have given: the connection was refused, reset or timed
    out, the name did not resolve, or the response was cut short or is not a JSON object
    (a node exiting mid-answer, or something else listening there)."""


class EndpointRefused(EndpointError):
    """The endpoint answered with an HTTP error status: it is there and said no."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        """The body's ``error`` field (every Undertow endpoint answers ``{"error": ...}``),
        else the body itself, shortened."""


class ControlClient:
    """JSON requests to one control endpoint (``base_url``, e.g. ``http://10.0.0.5:9200``),
    with ``Authorization: Bearer TOKEN`` when a token is given."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method: str, path: str,
                body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``method path`` with ``body`` as JSON (none when None); the answer's JSON object,
        ``{}`` for an empty answer."""
        url = f"{self.base_url}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:  # before OSError: HTTPError is one
            detail = _detail(exc)
            raise EndpointRefused(f"{method} {url}: HTTP {exc.code} {detail}".rstrip(),
                                  exc.code, detail) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise EndpointUnreachable(f"{method} {url}: {exc}") from exc
        if not payload.strip():
            return {}
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise EndpointUnreachable(f"{method} {url}: the answer is not a JSON object: "
                                      f"{payload[:200]!r}")
        return answer


def _detail(error: urllib.error.HTTPError) -> str:
    """What an error answer says: its ``error`` field, else its text."""
    try:
        text = error.read().decode(errors="replace").strip()
    except (OSError, http.client.HTTPException):
        return ""  # the status is all the endpoint managed to say
    try:
        message = json.loads(text).get("error")
    except (ValueError, AttributeError):
        message = None
    return message if isinstance(message, str) else text[:_DETAIL_CHARS]
