"""What the platform and the operator call to reach a pod's fault agent.

Errors are ``control.EndpointRefused`` (the agent could not do it; its ``status`` is the
one the server chose from ``AgentError``) and ``control.EndpointUnreachable`` (no agent
answering: its pod, with its rules and its processes, is gone or restarting).
"""

from __future__ import annotations

from typing import Any

from undertow.platform.control import ControlClient
from undertow.platform.link_delay import LinkDelay

TIMEOUT_S = 10.0
"""Long enough for a pause or a kill, which answer once the target has stopped or died
(``processes.STOP_TIMEOUT_S``); a kill with a grace period waits that much longer."""


class AgentClient:
    """The fault agent of one pod (see the package docstring for its API)."""

    def __init__(self, base_url: str, token: str, timeout_s: float = TIMEOUT_S) -> None:
        self._control = ControlClient(base_url, token, timeout_s=timeout_s)

    def pause(self, deadline_s: float) -> None:
        self._control.request("POST", "/v1/pause", {"deadline_s": deadline_s})

    def resume(self) -> None:
        self._control.request("POST", "/v1/resume", {})

    def kill(self, deadline_s: float, grace_s: float = 0.0) -> None:
        """SIGKILL the target (with ``grace_s`` above 0, SIGTERM first): the agent answers
        once it is dead, so the request may take the grace period longer."""
        if grace_s <= 0:
            self._control.request("POST", "/v1/kill", {"deadline_s": deadline_s})
            return
        control = self._control
        patient = ControlClient(control.base_url, control.token,
                                timeout_s=control.timeout_s + grace_s)
        patient.request("POST", "/v1/kill", {"deadline_s": deadline_s, "grace_s": grace_s})

    def hold_restart(self, deadline_s: float) -> None:
        self._control.request("POST", "/v1/hold", {"deadline_s": deadline_s})

    def release(self) -> None:
        self._control.request("POST", "/v1/release", {})

    def drop(self, direction: str, peer: str, deadline_s: float) -> None:
        self._control.request("PUT", f"/v1/drops/{direction}/{peer}", {"deadline_s": deadline_s})

    def undrop(self, direction: str, peer: str) -> None:
        self._control.request("DELETE", f"/v1/drops/{direction}/{peer}", {})

    def delay(self, direction: str, peer: str, delay: LinkDelay, deadline_s: float) -> None:
        self._control.request("PUT", f"/v1/delays/{direction}/{peer}", {
            "latency_s": delay.latency_s, "jitter_s": delay.jitter_s,
            "correlation": delay.correlation, "deadline_s": deadline_s})

    def undelay(self, direction: str, peer: str) -> None:
        self._control.request("DELETE", f"/v1/delays/{direction}/{peer}", {})

    def undelay_all(self) -> None:
        self._control.request("DELETE", "/v1/delays", {})

    def undrop_all(self) -> None:
        self._control.request("DELETE", "/v1/drops", {})

    def faults(self) -> dict[str, Any]:
        return self._control.request("GET", "/v1/faults")
