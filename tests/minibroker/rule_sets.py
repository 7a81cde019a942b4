"""The two rule sets of the controller, for tests that pin one (``eligible.leader.replicas
.version``: Kafka 3.7's rules, or 4.1+'s with eligible leader replicas, the default)."""

KAFKA_3_7 = {"eligible.leader.replicas.version": "0"}
KAFKA_4_2 = {"eligible.leader.replicas.version": "1"}
