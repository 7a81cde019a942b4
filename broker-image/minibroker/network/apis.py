"""KafkaApis: turns parsed Kafka requests into calls on the broker core and back.

The core (``ReplicaManager``) is callback-based and knows nothing of the wire; the
handlers own every protocol detail: version-specific response shapes, partitions unknown
to the metadata image, sessionless fetches, acks=0. One handler per API serves all of
its supported versions: responses are built from a superset of fields and each
version's class keeps the fields it has (``responses.build``). The handlers of the APIs
that read and write the replicas are in ``replica_apis``, FindCoordinator in
``coordinator_apis``, the group coordinator's in ``group_apis``, the transaction
coordinator's in ``txn_apis``, DeleteTopics and CreatePartitions in ``admin_apis``,
DescribeConfigs in ``config_apis``, the others in ``cluster_apis``.
"""

from __future__ import annotations

from typing import Protocol

from kio.static.protocol import ResponsePayload

from minibroker.network.admin_apis import AdminApis, AdminBroker
from minibroker.network.cluster_apis import ClusterApis, ClusterBroker
from minibroker.network.codec import ApiKey, Request
from minibroker.network.config_apis import ConfigApis, ConfigBroker
from minibroker.network.coordinator_apis import CoordinatorApis, CoordinatorBroker
from minibroker.network.group_apis import GroupApis, GroupBroker
from minibroker.network.replica_apis import ReplicaApis, ReplicaBroker
from minibroker.network.txn_apis import TxnApis, TxnBroker

__all__ = ["BrokerApi", "KafkaApis"]


class BrokerApi(ReplicaBroker, ClusterBroker, AdminBroker, ConfigBroker, CoordinatorBroker,
                GroupBroker, TxnBroker, Protocol):
    """What KafkaApis needs of the broker: the ReplicaManager's API (``ReplicaBroker``),
    what it forwards to the controller (``ClusterBroker``, ``AdminBroker``,
    ``CoordinatorBroker``), its configs (``ConfigBroker``) and its coordinators
    (``GroupBroker``, ``TxnBroker``)."""


class KafkaApis:
    """The request handler of ``KafkaServer`` (Kafka's ``KafkaApis``)."""

    def __init__(self, broker: BrokerApi) -> None:
        replicas, cluster, groups = ReplicaApis(broker), ClusterApis(broker), GroupApis(broker)
        coordinators, txns = CoordinatorApis(broker), TxnApis(broker)
        admin, configs = AdminApis(broker), ConfigApis(broker)
        self.fetch_sessions = replicas.fetch_sessions
        """The incremental fetch sessions this broker serves (KIP-227's FetchSessionCache)."""
        self._handlers = {
            ApiKey.PRODUCE: replicas.handle_produce,
            ApiKey.FETCH: replicas.handle_fetch,
            ApiKey.LIST_OFFSETS: replicas.handle_list_offsets,
            ApiKey.METADATA: cluster.handle_metadata,
            ApiKey.FIND_COORDINATOR: coordinators.handle_find_coordinator,
            ApiKey.JOIN_GROUP: groups.handle_join_group,
            ApiKey.SYNC_GROUP: groups.handle_sync_group,
            ApiKey.HEARTBEAT: groups.handle_heartbeat,
            ApiKey.LEAVE_GROUP: groups.handle_leave_group,
            ApiKey.OFFSET_COMMIT: groups.handle_offset_commit,
            ApiKey.OFFSET_FETCH: groups.handle_offset_fetch,
            ApiKey.LIST_GROUPS: groups.handle_list_groups,
            ApiKey.DESCRIBE_GROUPS: groups.handle_describe_groups,
            ApiKey.API_VERSIONS: cluster.handle_api_versions,
            ApiKey.CREATE_TOPICS: cluster.handle_create_topics,
            ApiKey.DELETE_TOPICS: admin.handle_delete_topics,
            ApiKey.CREATE_PARTITIONS: admin.handle_create_partitions,
            ApiKey.DESCRIBE_CONFIGS: configs.handle_describe_configs,
            ApiKey.DELETE_GROUPS: groups.handle_delete_groups,
            ApiKey.INIT_PRODUCER_ID: txns.handle_init_producer_id,
            ApiKey.DESCRIBE_TRANSACTIONS: txns.handle_describe_transactions,
            ApiKey.LIST_TRANSACTIONS: txns.handle_list_transactions,
            ApiKey.DESCRIBE_TOPIC_PARTITIONS: cluster.handle_describe_topic_partitions,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: cluster.handle_incremental_alter_configs,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: replicas.handle_offset_for_leader_epoch,
            ApiKey.WRITE_TXN_MARKERS: replicas.handle_write_txn_markers,
            ApiKey.ADD_PARTITIONS_TO_TXN: txns.handle_add_partitions_to_txn,
            ApiKey.END_TXN: txns.handle_end_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: txns.handle_add_offsets_to_txn,
            ApiKey.TXN_OFFSET_COMMIT: groups.handle_txn_offset_commit,
            ApiKey.CONSUMER_GROUP_HEARTBEAT: groups.handle_consumer_group_heartbeat,
            ApiKey.CONSUMER_GROUP_DESCRIBE: groups.handle_consumer_group_describe,
        }

    async def handle(self, request: Request) -> ResponsePayload | None:
        return await self._handlers[request.api_key](request)
