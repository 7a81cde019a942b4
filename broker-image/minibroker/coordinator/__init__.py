"""The group coordinator (Kafka's classic ``kafka.coordinator.group``): groups, their
members and rebalances, and the offsets they commit, all stored in ``__consumer_offsets``."""
