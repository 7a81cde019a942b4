"""A local 3-broker minibroker cluster for the broker benchmarks, with a topic whose ISR is
full before the first record is timed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from minibroker.demo import free_base_port, wait_for_full_isr
from minibroker.local_cluster import die_with_parent


@contextmanager
def running_cluster(config: Mapping[str, str] | None = None) -> Iterator[str]:
    """`minibroker cluster` with broker configs `config`; yields the bootstrap address and
    stops the brokers (and removes their data) however the block ends."""
    base = free_base_port()
    overrides = [arg for key, value in (config or {}).items()
                 for arg in ("--config", f"{key}={value}")]
    with tempfile.TemporaryDirectory(prefix="minibroker-bench-") as data_dir:
        cluster = subprocess.Popen(
            [sys.executable, "-m", "minibroker", "cluster", "--brokers", "3", "--base-port",
             str(base), "--data-dir", data_dir, *overrides],
            preexec_fn=die_with_parent, env={**os.environ, "MINIBROKER_LOG_LEVEL": "WARNING"},
            stdout=subprocess.DEVNULL)
        try:
            yield f"127.0.0.1:{base + 1}"
        finally:
            cluster.terminate()
            cluster.wait(15)


def create_topic(bootstrap: str, topic: str, partitions: int = 1, timeout_s: float = 60.0
                 ) -> None:
    """RF 3, and wait until every partition has a leader and all three replicas in sync.
    Retried while the brokers start, for at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (created := subprocess.run(
            [sys.executable, "-m", "minibroker", "--log-level", "ERROR", "topics", "create",
             "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions),
             "--replication-factor", "3"], capture_output=True, text=True)).returncode:
        if time.monotonic() > deadline:
            raise TimeoutError(f"could not create {topic} within {timeout_s:g} s: "
                               f"{created.stderr.strip()}")
        time.sleep(0.2)
    host, port = bootstrap.rsplit(":", 1)
    asyncio.run(wait_for_full_isr((host, int(port)), topic=topic))
