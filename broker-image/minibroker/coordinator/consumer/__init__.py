"""Kafka 4's consumer group protocol (KIP-848, Kafka's
``org.apache.kafka.coordinator.group.modern.consumer``): groups whose target assignment the
coordinator computes with a server-side assignor, and towards which each member reconciles
with its own member epoch."""
