"""Topic names for the few anomalous records: positions carry a topic as its 64-bit key
(`checks.topic_key`), and only anomalies/ names them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from undertow_analysis import checks
from undertow_analysis.io import History


def spec_topic(meta: dict[str, Any]) -> str | None:
    """The experiment's topic (meta.json's spec.topic.name), if meta.json names it."""
    spec = meta.get("spec")
    topic = spec.get("topic") if isinstance(spec, dict) else None
    name = topic.get("name") if isinstance(topic, dict) else None
    return name if isinstance(name, str) else None


def topic_keys(spark: SparkSession, names: set[str]) -> dict[int, str]:
    """topic_key -> name for a handful of topic names (a one-row query of literals: no Python
    worker)."""
    ordered = sorted(names)
    if not ordered:
        return {}
    keys = spark.range(1).select(*[checks.topic_key(F.lit(n)) for n in ordered]).first()
    return dict(zip(keys, ordered, strict=True))


def topic_names(history: History, values: DataFrame) -> dict[int, str]:
    """topic_key -> name for the topics of the anomalous ones of `values` (the noteworthy ones):
    only they are named in anomalies/.

    The experiment's topic (meta.json) and the sampled ones (cluster.jsonl) name them without
    a pass over sends and reads; only a topic neither knows (say, reads of another topic)
    costs a scan of the topic field of both.
    """
    wanted = {r[0] for r in values.filter(checks.is_anomalous()).select(F.explode(F.array(
        *[F.col(f"{c}.tk") for c in checks.POSITIONS])).alias("tk")).distinct().collect()}
    wanted.discard(None)
    experiment_topic = spec_topic(history.meta)
    sources = (
        lambda: {experiment_topic} if experiment_topic else set(),
        lambda: _topics_in(history, ("cluster",)),
        lambda: _topics_in(history, ("sends", "reads"), keys=wanted),
    )
    named: dict[int, str] = {}
    for names in sources:
        if not wanted - named.keys():
            break
        named |= topic_keys(history.spark, {n for n in names() if isinstance(n, str)})
    return {tk: name for tk, name in named.items() if tk in wanted}


def _topics_in(history: History, files: Sequence[str], keys: set[int] | None = None) -> set[str]:
    """The distinct topics of `files` (only those with a key in `keys`): a read of the one
    field, malformed lines included, which is harmless for naming."""
    uris = [history.file(name) for name in files if history.parsed[name] is not None]
    if not uris:
        return set()
    topics = history.spark.read.schema("topic string").json(uris).filter(F.col("topic").isNotNull())
    if keys is not None:
        topics = topics.filter(checks.topic_key(F.col("topic")).isin(*keys))
    return {r[0] for r in topics.distinct().collect()}
