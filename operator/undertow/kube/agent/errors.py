"""The fault agent's one error type, shared by its mechanisms and its server."""

from __future__ import annotations


class AgentError(Exception):
    """A fault could not be applied or removed; ``status`` is the HTTP status to answer.

    It never leaves the agent's process but as that status and an ``{"error": ...}`` body:
    a caller of ``AgentClient`` sees ``control.EndpointRefused`` instead.
    """

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status
