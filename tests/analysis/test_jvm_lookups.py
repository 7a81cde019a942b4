"""The job's Py4J round trips: a class and a method are looked up once (`jvm_lookups`), and
the pre-started process no longer releases the JVM objects of the Python proxies it drops
(`prestart.keep_jvm_objects`)."""

from __future__ import annotations

from py4j.java_gateway import JVMView, ThreadSafeFinalizer
from pyspark.sql import functions as F

from undertow_analysis.jvm_lookups import remember_jvm_lookups
from undertow_analysis.prestart import keep_jvm_objects

CALLS = 20


def _commands(spark, monkeypatch, build) -> list[str]:
    """The first line of every Py4J command `build` sends (c: a call, r: a lookup)."""
    client = spark.sparkContext._gateway._gateway_client
    sent: list[str] = []
    send = client.send_command

    def counting(command, *args, **kwargs):
        sent.append(command.split("\n", 1)[0])
        return send(command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", counting)
    build()
    monkeypatch.undo()
    return sent


def test_each_function_is_looked_up_once(spark, monkeypatch):
    view = spark.sparkContext._jvm
    remember_jvm_lookups(spark)
    try:
        F.col("warm")  # the first lookups are made and remembered
        sent = _commands(spark, monkeypatch, lambda: [F.col(f"c{i}") for i in range(CALLS)])
        assert sent and "r" not in sent, sent[:6]  # calls ("c") alone, no lookup ("r")
        # Forgotten again, each call looks up its class and method (and more) first.
        view.__class__ = JVMView
        sent = _commands(spark, monkeypatch, lambda: [F.col(f"c{i}") for i in range(CALLS)])
        assert sent.count("r") >= 2 * CALLS
    finally:
        remember_jvm_lookups(spark)
    # The remembered lookups still call what they named.
    row = spark.range(3).select(F.sum(F.col("id") + F.lit(1)).alias("s")).first()
    assert row["s"] == 6


def _released(column) -> bool:
    """Py4J will tell the JVM when the proxy of `column` is dropped (a finalizer is set)."""
    java = column._jc
    client = java._gateway_client
    key = f"{client.address}{client.port}{java._target_id}"
    return key in ThreadSafeFinalizer.finalizers


def test_a_kept_object_is_never_released(spark):
    client = spark.sparkContext._gateway._gateway_client
    before = client.gateway_property.enable_memory_management
    try:
        client.gateway_property.enable_memory_management = True
        released = [F.col("a") for _ in range(CALLS)]
        assert all(_released(c) for c in released)
        keep_jvm_objects(spark)
        kept = [F.col("b") for _ in range(CALLS)]
        assert not any(_released(c) for c in kept)
    finally:
        client.gateway_property.enable_memory_management = before
