"""The Kafka wire protocol: framing and headers (codec), the listener (kafka_server), the
request handlers over the broker core (apis: replica_apis, cluster_apis) and a small
client (client)."""
