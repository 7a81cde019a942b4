"""Undertow: chaos experiments against Kafka-style replicated logs."""
