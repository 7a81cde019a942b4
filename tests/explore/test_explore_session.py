"""The explorer's Spark settings: a local exploration survives a pause of its own JVM
(``spark.network.timeout``), a cluster's keeps Spark's default so a lost executor is seen."""

from __future__ import annotations

from undertow.explore.spark import LOCAL_NETWORK_TIMEOUT, session_config


def test_a_local_exploration_outlives_a_two_minute_pause() -> None:
    for master in (None, "local[2]", "local[*]"):
        config = session_config(master)
        assert config["spark.network.timeout"] == LOCAL_NETWORK_TIMEOUT
        assert int(LOCAL_NETWORK_TIMEOUT.removesuffix("s")) > 120  # Spark's default


def test_a_cluster_master_keeps_the_default_heartbeat_timeout() -> None:
    config = session_config("spark://spark-master:7077")
    assert "spark.network.timeout" not in config
    assert config["spark.python.worker.reuse"] == "true"
