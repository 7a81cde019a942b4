"""Kafka's ``CleanShutdownFileHandler`` (KAFKA-15582): the proof of a clean shutdown.

A broker that stops cleanly writes its broker epoch to ``.kafka_cleanshutdown`` in its log
directory after flushing every log. The next start takes the file (reads and deletes it, so a
crash later cannot pass for clean) and offers the epoch at registration as
``previousBrokerEpoch``; the controller calls the restart clean only when that is the epoch it
registered last (``ClusterControlManager.registerBroker``, KAFKA-15586). A broker that was
killed, halted or lost power wrote nothing: its previous epoch is -1, an unclean shutdown.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from minibroker.fsutil import atomic_write, fsync_dir

log = logging.getLogger("minibroker.storage")

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
NO_PREVIOUS_EPOCH = -1
_VERSION = 0


def write_clean_shutdown(log_dir: Path, broker_epoch: int) -> None:
    """Record a clean shutdown of the incarnation with this broker epoch (fsynced)."""
    atomic_write(log_dir / CLEAN_SHUTDOWN_FILE,
                 json.dumps({"version": _VERSION, "brokerEpoch": broker_epoch}).encode())


def take_clean_shutdown(log_dir: Path) -> int:
    """The broker epoch of the last clean shutdown, deleting the proof; -1 when there is
    none or it cannot be read (Kafka reads any failure as unclean)."""
    path = log_dir / CLEAN_SHUTDOWN_FILE
    try:
        content = json.loads(path.read_text())
        epoch = int(content["brokerEpoch"]) if content.get("version") == _VERSION else -1
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        epoch = NO_PREVIOUS_EPOCH
    if path.exists():
        path.unlink()
        fsync_dir(log_dir)
    if epoch != NO_PREVIOUS_EPOCH:
        log.info("The last shutdown was clean (broker epoch %d)", epoch)
    return epoch
