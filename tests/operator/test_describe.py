"""``undertow describe`` at a terminal: an address where nothing listens, or a topic the
cluster does not have, is one line on stderr naming it and exit 2, in seconds; not
librdkafka's log of every refused reconnection nor a ``KafkaError{...}`` repr."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from ports import free_port

from undertow.cli import EXIT_ERROR
from undertow.cluster_view.kafka import DESCRIBE_TIMEOUT_S
from undertow.platform.local import LocalPlatform, LocalPlatformConfig


def describe(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``undertow describe ARGS`` in a process of its own: librdkafka writes its logs to
    file descriptor 2 from its own threads, which only a whole process's stderr shows."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "undertow", "describe", *args],
                          capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def test_an_address_where_nothing_listens_is_one_line_in_seconds() -> None:
    address = f"127.0.0.1:{free_port()}"
    done, seconds = describe("--bootstrap", address)
    assert done.returncode == EXIT_ERROR
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line == f"undertow: describe {address}: no Kafka broker answers (Connection refused)"
    # librdkafka's first refused connection is reported at once; the bound leaves the
    # interpreter's start on a loaded machine room, and stays well under the 12 s
    # librdkafka took to give up on its own.
    assert seconds < DESCRIBE_TIMEOUT_S + 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    with LocalPlatform(LocalPlatformConfig(workdir=tmp_path_factory.mktemp("describe"),
                                           brokers=1)) as platform:
        yield platform


@pytest.mark.slow
def test_a_topic_the_cluster_lacks_is_named_in_one_line(cluster: LocalPlatform) -> None:
    done, _ = describe("--bootstrap", cluster.bootstrap, "--topic", "nosuch")
    assert done.returncode == EXIT_ERROR
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"undertow: describe {cluster.bootstrap}: no topic 'nosuch' on this cluster "
        f"(Kafka's UNKNOWN_TOPIC_OR_PART)"]

    done, _ = describe("--bootstrap", cluster.bootstrap)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("brokers: 0; controller:"), done.stdout
    assert done.stderr == ""
