"""Prometheus metrics, named as Kafka's JMX exporter names them so alert rules carry over.

Collectors read a state snapshot taken on the event loop at scrape time; nothing is
counted on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class _BrokerCollector:
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        parts = s["partitions"]
        leaders = [p for p in parts if p["role"] == "leader"]
        yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions",
                                "Led partitions whose ISR is smaller than the replica set.",
                                value=sum(1 for p in leaders if len(p["isr"]) < len(p["replicas"])))
        yield GaugeMetricFamily("kafka_server_replicamanager_leadercount",
                                "Partitions this broker leads.", value=len(leaders))
        yield GaugeMetricFamily("kafka_server_replicamanager_partitioncount",
                                "Partition replicas on this broker.", value=len(parts))
        yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks",
                                  "ISR shrinks committed by this broker as leader.",
                                  value=s["isr_shrinks"])
        yield CounterMetricFamily("kafka_server_replicamanager_isrexpands",
                                  "ISR expansions committed by this broker as leader.",
                                  value=s["isr_expands"])
        yield GaugeMetricFamily("minibroker_disk_stalled", "1 while a disk stall is injected.",
                                value=1 if s["disk_stalled"] else 0)
        for name, key, doc in (
            ("kafka_log_log_logendoffset", "log_end_offset", "Log end offset (LEO)."),
            ("kafka_cluster_partition_highwatermark", "high_watermark", "High watermark."),
            ("kafka_cluster_partition_leaderepoch", "leader_epoch", "Leader epoch."),
            ("kafka_log_log_logstartoffset", "log_start_offset", "Log start offset."),
        ):
            family = GaugeMetricFamily(name, doc, labels=["topic", "partition"])
            for p in parts:
                family.add_metric([p["topic"], str(p["partition"])], p[key])
            yield family


def broker_registry(snapshot: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_BrokerCollector(snapshot))
    return registry


class _Registration(Protocol):
    @property
    def fenced(self) -> bool: ...


class ControllerState(Protocol):
    """What the controller's metrics read (`QuorumController` has it): a protocol, so that
    the brokers, which share this module, do not load the controller's."""

    @property
    def brokers(self) -> Mapping[int, _Registration]: ...

    @property
    def unclean_elections(self) -> int: ...

    @property
    def metadata_offset(self) -> int: ...

    def offline_partitions_count(self) -> int: ...


class _ControllerCollector:
    def __init__(self, controller: ControllerState) -> None:
        self._controller = controller

    def collect(self) -> Iterator[Metric]:
        c = self._controller
        brokers = list(c.brokers.values())
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_offlinepartitionscount",
                                "Partitions without a leader.", value=c.offline_partitions_count())
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_activebrokercount",
                                "Unfenced brokers.", value=sum(1 for b in brokers if not b.fenced))
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_fencedbrokercount",
                                "Fenced brokers.", value=sum(1 for b in brokers if b.fenced))
        yield CounterMetricFamily("kafka_controller_controllerstats_uncleanleaderelections",
                                  "Unclean leader elections.", value=c.unclean_elections)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_metadataoffset",
                                "Offset of the latest committed metadata change.",
                                value=c.metadata_offset)


def controller_registry(controller: ControllerState) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_ControllerCollector(controller))
    return registry
