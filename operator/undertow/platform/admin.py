"""A node's admin endpoint: ``/v1/state`` and the broker failpoints.

The same on every platform; only the URL differs (loopback, a namespace address, a pod).
Errors are ``control.EndpointUnreachable`` and ``control.EndpointRefused``.
"""

from __future__ import annotations

from typing import Any

from undertow.platform.control import ControlClient

TIMEOUT_S = 2.0
"""Short: the runner polls /v1/state while it waits for a node, and a node that takes
longer than this to answer is as good as not serving."""


class AdminClient:
    """The admin endpoint of one broker or the controller; ``failpoint_token`` is needed
    only for the failpoints (``/v1/state`` is open, as the readiness probe reads it)."""

    def __init__(self, base_url: str, failpoint_token: str | None = None,
                 timeout_s: float = TIMEOUT_S) -> None:
        self._control = ControlClient(base_url, failpoint_token, timeout_s=timeout_s)

    def state(self) -> dict[str, Any]:
        return self._control.request("GET", "/v1/state")

    def set_failpoint(self, name: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._control.request("POST", f"/v1/failpoints/{name}", body or {})

    def clear_failpoint(self, name: str) -> dict[str, Any]:
        return self._control.request("DELETE", f"/v1/failpoints/{name}")

    def events(self, log_id: str | None, offset: int) -> dict[str, Any]:
        """The node's replication events from byte ``offset`` of its events log on:
        ``{"log_id", "events", "next_offset"}``. A ``log_id`` that is not the node's current
        one (its disk was replaced) answers from the start of the new log."""
        query = f"offset={offset}" + (f"&log_id={log_id}" if log_id else "")
        return self._control.request("GET", f"/v1/events?{query}")
