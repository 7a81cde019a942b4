"""The fault agent's one error type, shared by its mechanisms, server and client."""

from __future__ import annotations

from undertow.platform.base import PlatformError


class AgentError(PlatformError):
    """A fault could not be applied or removed; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status
