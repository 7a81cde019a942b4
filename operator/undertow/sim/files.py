"""Where a simulation's files go: its nodes' data directories and histories on scratch
space, its nodes' log lines in one file stamped with virtual time; and the simulated disk's
fsync."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from undertow.platform.procfs import alive


def scratch_root() -> Path:
    """Where throwaway simulated clusters and histories go: memory when the machine offers
    it (/dev/shm), else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


def scratch_dir(prefix: str) -> Path:
    """A new directory on scratch space for one simulation, named ``{prefix}{pid}-...``
    after this process. Those of processes that are gone are removed first: a worker that
    was SIGKILLed (Spark kills its Python workers when an exploration is interrupted) never
    ran its cleanup, and on /dev/shm what it left holds memory."""
    root = scratch_root()
    for stale in root.glob(f"{prefix}*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))


def simulated_fsync(_fd: int) -> None:
    """The simulated disk's fsync (``minibroker.environment.Environment.fsync``): at once.
    No crash of the machine takes the page cache in simulation; a power loss keeps what the
    broker marked durable (``minibroker.storage.durability``), whether or not the OS wrote
    it. A real fsync costs the explorer time and tells the simulation nothing."""


@contextlib.contextmanager
def broker_logs(path: Path, clock: Callable[[], float]) -> Iterator[None]:
    """The simulated nodes' logs (minibroker's loggers) go to ``path`` meanwhile, each line
    stamped with the virtual time, as a real node's go to its own log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(virtual).3f %(levelname)s %(name)s: %(message)s"))

    def stamp(record: logging.LogRecord) -> bool:
        record.virtual = clock()
        return True

    handler.addFilter(stamp)
    logger = logging.getLogger("minibroker")
    previous = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate, level = previous
        logger.setLevel(level)
        handler.close()
