"""The drain after healing (`workload.drain`) against real brokers: a partition whose leader
never comes back is reported with an unknown end, not read, and does not stop the drain of
the others or fail the run (a run that did not heal still gets its report)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from confluent_kafka import Producer

from undertow.cluster_view.kafka import admin_client, create_topic
from undertow.platform.base import wait_for
from undertow.platform.local import LocalPlatform, LocalPlatformConfig
from undertow.runner.abort import Abort
from undertow.runner.history import HistoryWriter
from undertow.runner.workload import drain

TIMEOUT_S = 4.0


def test_a_partition_without_a_leader_has_an_unknown_end_and_the_rest_is_drained(
        tmp_path: Path) -> None:
    with LocalPlatform(LocalPlatformConfig(workdir=tmp_path / "cluster", brokers=2)) as platform:
        create_topic(admin_client(platform.bootstrap), "d", 2, 1, {})
        producer = Producer({"bootstrap.servers": platform.bootstrap, "acks": "all"})
        for i in range(20):
            producer.produce("d", value=b"v-%d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        view = wait_for(lambda: platform.cluster_view(replicas=True), 10, "the cluster view")
        leader_of_1 = view.partition("d", 1).leader
        platform.kill(f"broker-{leader_of_1}")  # replication factor 1: d-1 goes offline
        wait_for(lambda: not platform.cluster_view().partition("d", 1).has_leader, 30,
                 "d-1 to go offline", ignore=(Exception,))
        # d-0 must still be served: it was led by the other broker.
        assert platform.cluster_view().partition("d", 0).leader != leader_of_1

        abort = Abort()
        history = HistoryWriter(tmp_path / "history", abort)
        started = time.monotonic()
        drained = drain(platform.bootstrap, "d", 2, history, abort, TIMEOUT_S)
        took = time.monotonic() - started
        history.close()

    assert drained == {0: (10, 10), 1: (None, 0)}
    assert took < TIMEOUT_S + 6  # bounded: the deadline, plus one answer's wait and the close
    reads = [json.loads(line) for line in (tmp_path / "history" / "reads.jsonl").open()]
    assert sorted(r["offset"] for r in reads if r["partition"] == 0) == list(range(10))
    assert {r["phase"] for r in reads} == {"drain"}
    assert abort.reason is None
