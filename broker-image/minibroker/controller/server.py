"""The controller process: ``QuorumController`` on the network, with metrics and state.

Brokers register, heartbeat, long-poll for metadata changes, and send AlterPartition,
AllocateProducerIds and the admin requests they forward (CreateTopics, DeleteTopics,
CreatePartitions, IncrementalAlterConfigs) over ``minibroker.rpc``. Every state change is
persisted before the answer leaves (the controller fsyncs in ``QuorumController._persist``).

Only peers holding the cluster's secret are served (``rpc_auth``: Kafka's controller
listener takes SASL or mTLS, KIP-631), and each within the ``listener.name.controller.*``
limits of ``config.py``; a metadata long poll waits at most
``controller.metadata.max.wait.ms``, whatever it asks for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from minibroker.admin import AdminServer
from minibroker.cluster.alter_partition_manager import MAX_ALTER_PARTITION_ITEMS
from minibroker.cluster.types import (
    ErrorCode,
    LeaderRecoveryState,
    NewPartitions,
    TopicPartition,
)
from minibroker.config import resolve
from minibroker.controller.quorum_controller import (
    AlterPartitionItem,
    DuplicateBrokerRegistration,
    QuorumController,
)
from minibroker.events import ReplicationEventLog
from minibroker.metrics import controller_registry
from minibroker.rpc import RpcLimits, RpcServer

log = logging.getLogger("minibroker.controller")

TICK_MS = 100



def controller_rpc_limits(config: dict[str, str]) -> RpcLimits:
    """The controller listener's bounds, from the ``listener.name.controller.*`` configs."""
    return RpcLimits(
        max_connections=resolve("listener.name.controller.max.connections", config),
        max_in_flight_per_connection=resolve(
            "listener.name.controller.max.in.flight.requests.per.connection", config),
        max_request_bytes=resolve("listener.name.controller.socket.request.max.bytes",
                                  config))


class ControllerServer:
    def __init__(self, data_dir: Path, config: dict[str, str], secret: bytes) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        self.events = ReplicationEventLog(data_dir)
        self.controller = QuorumController(
            clock_ms=lambda: self._loop.time() * 1000.0, events=self.events, config=config,
            data_dir=data_dir)
        self._changed = asyncio.Condition()
        self.controller.add_listener(self._on_commit)
        self._max_wait_ms: int = resolve("controller.metadata.max.wait.ms", config)
        self.rpc = RpcServer({
            "register_broker": self._register_broker,
            "heartbeat": self._heartbeat,
            "fetch_metadata": self._fetch_metadata,
            "alter_partitions": self._alter_partitions,
            "create_topic": self._create_topic,
            "alter_topic_config": self._alter_topic_config,
            "delete_topics": self._delete_topics,
            "create_partitions": self._create_partitions,
            "allocate_producer_ids": self._allocate_producer_ids,
            "state": self._state,
        }, secret=secret, limits=controller_rpc_limits(config))
        self._tick_task: asyncio.Task | None = None
        self.admin: AdminServer | None = None

    def _on_commit(self, _offset: int) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        self._loop.create_task(notify())

    async def start(self, host: str, port: int, metrics_port: int | None) -> None:
        await self.rpc.start(host, port)
        self._tick_task = asyncio.create_task(self._tick_loop())
        if metrics_port is not None:
            self.admin = AdminServer(self._loop, host, metrics_port,
                                     registry=controller_registry(self.controller),
                                     state=self.state, events=self.events)
            self.admin.start()
        log.info("Controller listening on %s:%d (cluster id %s)", host, self.rpc.port,
                 self.controller.cluster_id)

    async def stop(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
        await self.rpc.stop()
        if self.admin is not None:
            self.admin.stop()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_MS / 1000)
            self.controller.tick()

    async def _register_broker(self, p: dict[str, Any]) -> dict[str, Any]:
        listeners = {name: (host, port)
                     for name, (host, port) in (p.get("listeners") or {}).items()}
        try:
            epoch = self.controller.register_broker(p["broker_id"], p["incarnation_id"],
                                                    p["host"], p["port"], listeners,
                                                    p.get("previous_broker_epoch", -1))
        except DuplicateBrokerRegistration as exc:
            return {"error": ErrorCode.duplicate_broker_registration.name, "message": str(exc)}
        return {"error": ErrorCode.none.name, "broker_epoch": epoch}

    async def _heartbeat(self, p: dict[str, Any]) -> dict[str, Any]:
        """BrokerHeartbeat; ``should_shut_down`` answers a ``want_shut_down`` (Kafka's
        BrokerHeartbeatResponse.ShouldShutDown)."""
        want_shut_down = p.get("want_shut_down", False)
        if not isinstance(want_shut_down, bool):
            raise ValueError(f"want_shut_down: expected a boolean, got {want_shut_down!r}")
        error, fenced = self.controller.heartbeat(p["broker_id"], p["broker_epoch"],
                                                  p["metadata_offset"],
                                                  want_shut_down=want_shut_down)
        return {"error": error.name, "is_fenced": fenced,
                "should_shut_down": want_shut_down and fenced and error == ErrorCode.none}

    async def _fetch_metadata(self, p: dict[str, Any]) -> dict[str, Any]:
        """Long poll: answer as soon as the metadata is newer than ``since``, or after
        ``wait_ms``, clamped to ``controller.metadata.max.wait.ms``: a caller cannot park a
        request (and its task) on the controller for longer. The answer is what changed
        after ``since`` (``{"delta": ...}``) if the caller's image is of this controller
        (``cluster_id``), else the whole image."""
        since, wait_ms = p.get("since", -1), p.get("wait_ms", 1000)
        for name, value in (("since", since), ("wait_ms", wait_ms)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name}: expected an integer, got {value!r}")
        cluster_id = p.get("cluster_id", "")
        if not isinstance(cluster_id, str):
            raise ValueError(f"cluster_id: expected a string, got {cluster_id!r}")
        wait_s = min(max(wait_ms, 0), self._max_wait_ms) / 1000
        # asyncio.timeout, not wait_for: wait_for runs the wait as a task of its own, and a
        # second cancel of this one (a shutdown cancels every task, and the connection's
        # server cancels its requests') left the condition's lock released by the wait's
        # task and again here.
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait_for(
                        lambda: self.controller.metadata_offset > since)
        answer = self.controller.metadata_since(since, cluster_id)
        return answer.to_json()

    async def _alter_partitions(self, p: dict[str, Any]) -> dict[str, Any]:
        """A leader's batch of ISR changes, at most ``MAX_ALTER_PARTITION_ITEMS``; answered
        item by item, in order."""
        items = p["items"]
        if not isinstance(items, list) or len(items) > MAX_ALTER_PARTITION_ITEMS:
            raise ValueError(f"items: expected a list of at most {MAX_ALTER_PARTITION_ITEMS}")
        answers = self.controller.alter_partitions(p["broker_id"], [
            AlterPartitionItem(TopicPartition(i["topic"], i["partition"]), i["leader_epoch"],
                               i["partition_epoch"], tuple(i["new_isr"]),
                               tuple(i.get("broker_epochs", ())),
                               LeaderRecoveryState[i.get("leader_recovery_state", "RECOVERED")])
            for i in items])
        return {"results": [{"error": error.name,
                             "registration": reg.to_json() if reg else None}
                            for error, reg in answers]}

    async def _create_topic(self, p: dict[str, Any]) -> dict[str, Any]:
        error, message = self.controller.create_topic(p["name"], p["partitions"],
                                                      p["replication_factor"], p["config"])
        return {"error": error.name, "message": message}

    async def _alter_topic_config(self, p: dict[str, Any]) -> dict[str, Any]:
        error, message = self.controller.alter_topic_config(p["name"], p["changes"],
                                                            bool(p.get("validate_only")))
        return {"error": error.name, "message": message}

    async def _delete_topics(self, p: dict[str, Any]) -> dict[str, Any]:
        """DeleteTopics forwarded by a broker: the names and the ids (hex) it asks for."""
        names, ids = _strings(p, "names"), _strings(p, "topic_ids")
        return {"results": [{"name": r.name, "topic_id": r.topic_id, "error": r.error.name,
                             "message": r.message}
                            for r in self.controller.delete_topics(names, ids)]}

    async def _create_partitions(self, p: dict[str, Any]) -> dict[str, Any]:
        """CreatePartitions forwarded by a broker: each topic's new count and, optionally,
        the replicas of each new partition; answered topic by topic, in order."""
        topics = p["topics"]
        if not isinstance(topics, list):
            raise ValueError("topics: expected a list")
        requests = [NewPartitions(t["name"], int(t["count"]), None if t["assignments"] is None
                                  else tuple(tuple(map(int, a)) for a in t["assignments"]))
                    for t in topics]
        return {"results": [{"error": error.name, "message": message} for error, message
                            in self.controller.create_partitions(
                                requests, bool(p.get("validate_only")))]}

    async def _allocate_producer_ids(self, p: dict[str, Any]) -> dict[str, Any]:
        error, start, length = self.controller.allocate_producer_ids(p["broker_id"],
                                                                     p["broker_epoch"])
        return {"error": error.name, "producer_id_start": start, "producer_id_len": length}

    async def _state(self, _p: dict[str, Any]) -> dict[str, Any]:
        return self.state()

    def state(self) -> dict[str, Any]:
        return {**self.controller.state(), "rpc": self.rpc.stats()}


def _strings(p: dict[str, Any], key: str) -> list[str]:
    value = p.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key}: expected a list of strings")
    return value
