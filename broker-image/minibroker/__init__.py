"""minibroker: a small Kafka-compatible broker that replicates with ISR, HW and leader epochs."""
