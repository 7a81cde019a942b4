"""The one exception the core raises: a Kafka error code with a message for the log."""

from __future__ import annotations

from minibroker.cluster.types import ErrorCode


class KafkaApiError(Exception):
    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(f"{code.name.upper()}: {message}" if message else code.name.upper())
        self.code = code
        self.message = message
