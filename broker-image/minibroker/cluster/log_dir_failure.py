"""A failed log directory (KIP-112), as Kafka 3.7 handles it with one log directory.

An I/O error on a log directory (a full disk's ENOSPC, a dead device's EIO) is reported
once to the `LogDirFailureChannel` (Kafka's ``LogDirFailureChannel.maybeAddOfflineLogDir``)
and the request that hit it is answered ``KAFKA_STORAGE_ERROR``
(``ReplicaManager.appendToLocalLog``). From then on every read or write of the directory's
logs is refused the same way, and the broker's handler takes it offline:
``ReplicaManager.handleLogDirFailure`` stops serving its partitions, then
``LogManager.handleLogDirFailure`` finds no live log directory left ("Shutdown broker
because all log dirs in ... have failed") and halts the process (``Exit.halt(1)``): no
controlled shutdown, so the controller fences the broker when its heartbeats stop, which
removes it from every ISR and elects new leaders (``ReplicationControlManager
.handleBrokerFenced``). The broker comes back only by a restart, which loads its logs
again and catches up from the leaders. minibroker has one log directory, so a failure is
always the last one (KIP-858's JBOD in KRaft, where other directories stay online, is not
modelled).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from minibroker.cluster.errors import KafkaApiError
from minibroker.cluster.types import ErrorCode

log = logging.getLogger("minibroker.log_dir_failure")

LOG_DIR_FAILURE_EXIT_CODE = 1
"""Kafka's ``Exit.halt(1)`` after its last log directory failed."""


class LogDirFailureChannel:
    """Where I/O errors on a log directory are reported; the handler hears each directory
    once, however many requests hit the error."""

    def __init__(self) -> None:
        self._offline: dict[Path, str] = {}
        self._handler: Callable[[Path], None] = lambda _dir: None

    def on_offline(self, handler: Callable[[Path], None]) -> None:
        self._handler = handler

    def is_offline(self, log_dir: Path) -> bool:
        return log_dir in self._offline

    def maybe_add_offline_log_dir(self, log_dir: Path, message: str, error: OSError) -> None:
        if log_dir in self._offline:
            return
        log.error("%s: %s", message, error)
        self._offline[log_dir] = message
        self._handler(log_dir)

    def storage_error(self, log_dir: Path, what: str, error: OSError | None = None
                      ) -> KafkaApiError:
        """Report ``error`` (if any) and return the ``KAFKA_STORAGE_ERROR`` for the request."""
        message = f"Error while {what} in dir {log_dir}"
        if error is not None:
            self.maybe_add_offline_log_dir(log_dir, message, error)
        return KafkaApiError(ErrorCode.kafka_storage_error,
                             f"{message}: the log directory is offline")
