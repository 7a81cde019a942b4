"""Reading a history directory and writing the report, through Spark and Hadoop's FileSystem.

Every path is a URI Spark understands (file://, hdfs://, s3a://, or a plain local path), so the
same code reads a two-minute local run and a week-long soak on object storage.

Malformed lines (torn writes after a crash, bad types, missing fields) are skipped, counted and
located by file and line number; they never stop the analysis.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from undertow_analysis.checks import MAX_OFFSET, MAX_PARTITION
from undertow_analysis.precheck import OPTIONAL_FILES
from undertow_history import schema

CORRUPT = "_corrupt_record"
MAX_MALFORMED_EXAMPLES = 100

_SPARK_TYPES = {"string": T.StringType(), "int": T.IntegerType(), "long": T.LongType(),
                "double": T.DoubleType(), "boolean": T.BooleanType()}


def spark_type(json_type: schema.JsonType) -> T.DataType:
    """The Spark type that reads a JSON value of `json_type` (a JSON object of any shape has
    none: Spark reads no such field)."""
    if json_type.kind == "array":
        return T.ArrayType(spark_type(json_type.element))
    if json_type.kind == "map":
        return T.MapType(T.StringType(), spark_type(json_type.element))
    return _SPARK_TYPES[json_type.kind]


def spark_schema(file: schema.HistoryFile, names: Sequence[str] | None = None) -> T.StructType:
    """The Spark schema of `file`'s fields named in `names` (all when None), in the file's
    order. Every field is nullable to Spark: a missing field the analysis needs is a check of
    its own (`FileSpec.required`), with its own reason."""
    wanted = file.names if names is None else tuple(names)
    return T.StructType([T.StructField(f.name, spark_type(f.type)) for f in file.fields
                         if f.name in wanted])


@dataclass(frozen=True)
class FileSpec:
    """How the analysis reads a history file: which of its fields (`read`: the JSON reader
    parses those only, which is most of the job's cost) and what makes a parsed line unusable.

    Types and allowed values come from the history schema; what the analysis needs is its own.
    """

    file: schema.HistoryFile
    read: tuple[str, ...]
    required: tuple[str, ...]
    required_if_ok: tuple[str, ...] = ()  # sends: an acknowledgement carries its partition
    # Inclusive bounds: positions are packed into one long (checks.packed_position).
    ranges: tuple[tuple[str, int, int], ...] = (("partition", 0, MAX_PARTITION),
                                                ("offset", 0, MAX_OFFSET))

    def __post_init__(self) -> None:
        """A field the schema does not know, or one required but not read, fails at import."""
        unknown = set(self.read) - set(self.file.names)
        unread = set(self.required + self.required_if_ok) - set(self.read)
        if unknown or unread:
            raise ValueError(f"{self.file.filename}: not in the schema: {sorted(unknown)}; "
                             f"required but not read: {sorted(unread)}")

    @cached_property
    def schema(self) -> T.StructType:
        return spark_schema(self.file, self.read)

    @cached_property
    def allowed(self) -> dict[str, tuple[str, ...]]:
        """The enumerated fields read, with their values."""
        return {n: self.file.field(n).values for n in self.read if self.file.field(n).values}

    def checks(self) -> list[tuple[Column, str]]:
        checks = [(F.col(CORRUPT).isNotNull(), "not valid JSON, or a field has the wrong type")]
        checks += [(F.col(n).isNull(), f"missing field {n}") for n in self.required]
        checks += [(~F.col(n).isin(*values), f"{n} must be one of {', '.join(values)}")
                   for n, values in self.allowed.items()]
        checks += [((F.col("status") == "ok") & F.col(n).isNull(), f"ok send without {n}")
                   for n in self.required_if_ok]
        checks += [((F.col(n) < lo) | (F.col(n) > hi), f"{n} must be {lo}..{hi}")
                   for n, lo, hi in self.ranges if n in self.schema.names]
        return checks

    def reason(self) -> Column:
        """Why a parsed line is unusable (the first failed check), or null when it is fine."""
        return F.coalesce(*[F.when(cond, F.lit(msg)) for cond, msg in self.checks()])

    def with_corrupt(self) -> T.StructType:
        return T.StructType([*self.schema.fields, T.StructField(CORRUPT, T.StringType())])


EVENT_FIELDS = ("t", "node", "type", "topic", "partition", "leader_epoch", "broker", "leader",
                "previous_leader", "kind", "reason", "from_offset", "to_offset",
                "log_end_offset", "isr", "group", "generation", "transactional_id",
                "producer_id", "producer_epoch", "decision", "txn_state", "txn_epoch",
                "transaction_version", "txn_partitions", "leader_recovery_state")
# What the analysis reads of each file: sends without producer and error, group lines without
# member_id and error, transactions without offsets, cluster samples
# without leader_epoch, log_end_offsets, last_known_elr and leader_recovery_state (`elr` and
# `last_stable_offset`,
# absent from older histories, are null there),
# events without detail, old_isr, the ELR lists (elr, old_elr, last_known_elr),
# broker_epoch, high_watermark, members and member. A query parses only the fields it uses
# (Spark prunes the others from the scan): the one pass over sends and reads never parses a
# read's consumer or generation, which only the consumer group checks use.
FILES = {
    "sends": FileSpec(schema.SENDS, ("value", "topic", "partition", "status", "offset",
                                     "t_invoke", "t_complete", "txn"),
                      ("value", "topic", "status", "t_invoke", "t_complete"), ("partition",)),
    "reads": FileSpec(schema.READS, ("consumer", "phase", "topic", "partition", "offset",
                                     "value", "t", "generation", "isolation"),
                      ("phase", "topic", "partition", "offset", "value", "t")),
    "groups": FileSpec(schema.GROUPS, ("member", "generation", "type", "topic", "partition",
                                       "offset", "status", "t_invoke", "t"),
                       ("member", "type", "topic", "partition", "t")),
    "txns": FileSpec(schema.TXNS, ("producer", "txn", "transactional_id", "intent", "status",
                                   "error", "values", "t_begin", "t_end_invoke", "t_complete"),
                     ("txn", "status", "values", "t_complete"), ranges=()),
    "faults": FileSpec(schema.FAULTS, ("fault", "target", "role", "action", "t"),
                       ("fault", "target", "action", "t")),
    "cluster": FileSpec(schema.CLUSTER, ("t", "topic", "partition", "leader", "isr", "elr",
                                         "high_watermark", "last_stable_offset"),
                        ("t", "topic", "partition", "leader", "isr")),
    "events": FileSpec(schema.EVENTS, EVENT_FIELDS, ("t", "node", "type"),
                       ranges=(("partition", 0, MAX_PARTITION), ("from_offset", 0, MAX_OFFSET),
                               ("to_offset", 0, MAX_OFFSET),
                               ("log_end_offset", 0, MAX_OFFSET))),
}
META_READ = ("experiment", "spec", "start", "end", "idempotent", "expect", "incomplete",
             "incomplete_reason", "consumer_group", "transactions", "faults_skipped")


@dataclass
class History:
    """A history directory: meta.json, and each JSONL file parsed lazily with `_reason`.

    Nothing is cached: parsing is the job's largest cost, and building Spark's columnar cache
    costs several times a scan, so each file is scanned by as few queries as possible.
    """

    spark: SparkSession
    uri: str
    meta: dict[str, Any]
    parsed: dict[str, DataFrame | None]
    observations: dict[str, Observation] = field(default_factory=dict)
    counted: dict[str, int] = field(default_factory=dict)  # malformed lines counted elsewhere

    def file(self, name: str) -> str:
        return child(self.uri, f"{name}.jsonl")

    def valid(self, name: str) -> DataFrame:
        """The usable lines of a file. The first query that runs on the result counts the
        malformed ones (see `malformed`); use it in one query only."""
        if self.parsed[name] is None:  # an optional file that is not there: no lines
            return self.spark.createDataFrame([], FILES[name].schema)
        if name in self.observations:
            raise RuntimeError(f"{name}.jsonl is already observed")
        obs = self.observations[name] = Observation(f"undertow-malformed-{name}")
        bad = F.col("_reason").isNotNull()
        observed = self.parsed[name].observe(obs, F.count(F.when(bad, 1)).alias("malformed"))
        return observed.filter(~bad).drop("_reason")

    def usable(self, name: str) -> DataFrame:
        """The usable lines of a small optional file, for any number of queries; none counts
        the malformed ones (`valid` does, in one)."""
        if self.parsed[name] is None:
            return self.spark.createDataFrame([], FILES[name].schema)
        return self.parsed[name].filter(F.col("_reason").isNull()).drop("_reason")

    def has_lines(self, name: str) -> bool:
        """The file is there and not empty (no Spark job: its size)."""
        if self.parsed[name] is None:
            return False
        fs, path = _hadoop_path(self.spark, self.file(name))
        return bool(fs.getFileStatus(path).getLen() > 0)

    def in_order(self, name: str) -> DataFrame:
        """The usable lines of a file with `line`, their order in it (a struct of the start of
        the file's split and the line's rank in the split), for a check that needs the order
        the runner wrote them in. A scan of its own: the file's other readers are not
        slowed by the numbering."""
        spec = FILES[name]
        parsed = _parse(self.spark, self.file(name), name).select(
            "*", F.struct(F.col("_metadata.file_block_start").alias("split"),
                          F.monotonically_increasing_id().alias("rank")).alias("line"))
        return parsed.filter(spec.reason().isNull()).select(*spec.schema.names, "line")

    def lines(self, name: str) -> DataFrame:
        """Every line of a (required) file, the malformed ones too, marked by a boolean column
        `malformed`. The query that uses it counts them and says so with `count_malformed`."""
        return self.parsed[name].select(
            *FILES[name].schema.names, F.col("_reason").isNotNull().alias("malformed"))

    def count_malformed(self, name: str, n: int) -> None:
        self.counted[name] = n

    def malformed(self) -> dict[str, Any]:
        """Skipped lines: the total, per file, and up to MAX_MALFORMED_EXAMPLES located by file
        and line number. Call after the queries on every `valid` and `lines` frame have run."""
        counts = {name: int(obs.get["malformed"]) for name, obs in self.observations.items()}
        by_file = {self.file(name): n for name, n in {**counts, **self.counted}.items() if n}
        lines: list[dict] = []
        for name in FILES:
            room = MAX_MALFORMED_EXAMPLES - len(lines)
            if by_file.get(self.file(name)) and room > 0:
                lines += locate_malformed(self.spark, self.file(name), name, room)
        return {"skipped": sum(by_file.values()), "by_file": by_file, "lines": lines}


def child(uri: str, name: str) -> str:
    return uri.rstrip("/") + "/" + name


def _hadoop_path(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def exists(spark: SparkSession, uri: str) -> bool:
    fs, path = _hadoop_path(spark, uri)
    return bool(fs.exists(path))


def delete(spark: SparkSession, uri: str) -> None:
    """Remove a file or directory tree, if there."""
    fs, path = _hadoop_path(spark, uri)
    fs.delete(path, True)


def write_bytes(spark: SparkSession, uri: str, data: bytes) -> None:
    """Write one file through Hadoop's FileSystem, so any URI scheme Spark knows works."""
    fs, path = _hadoop_path(spark, uri)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()


def read_bytes(spark: SparkSession, uri: str) -> bytes:
    """A small file's content through Hadoop's FileSystem: no Spark job for a few bytes."""
    fs, path = _hadoop_path(spark, uri)
    stream = fs.open(path)
    try:
        return bytes(stream.readAllBytes())
    finally:
        stream.close()


def read_meta(spark: SparkSession, history_uri: str) -> dict[str, Any]:
    uri = child(history_uri, "meta.json")
    if not exists(spark, uri):
        raise FileNotFoundError(f"history {history_uri} has no meta.json")
    try:
        meta = json.loads(read_bytes(spark, uri))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{uri}: not valid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{uri}: expected a JSON object")
    problems = schema.META.problems({k: meta[k] for k in META_READ if k in meta}, partial=True)
    if problems:
        raise ValueError(f"{uri}: {'; '.join(problems)}")
    return meta


def _read_jsonl(spark: SparkSession, uri: str, name: str) -> DataFrame | None:
    """The file's lines parsed with its schema, plus `_reason` (null for a usable line);
    None for a missing optional file."""
    if not exists(spark, uri):
        if name not in OPTIONAL_FILES:
            raise FileNotFoundError(f"history file {uri} does not exist")
        return None
    spec = FILES[name]
    # Every schema column is selected, so a wrong type in any of them marks the line corrupt.
    return _parse(spark, uri, name).select(*spec.schema.names, spec.reason().alias("_reason"))


def _parse(spark: SparkSession, uri: str, name: str) -> DataFrame:
    """The file's lines with its schema's columns and the corrupt record's."""
    return (spark.read.schema(FILES[name].with_corrupt()).option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT).json(uri))


def locate_malformed(spark: SparkSession, uri: str, name: str, limit: int) -> list[dict]:
    """File, line number, reason and text of up to `limit` malformed lines of one file.

    The JSON source drops line numbers, so this rereads the file as text. Each input split keeps
    its lines in order and in one Spark partition, where monotonically_increasing_id numbers
    them consecutively; a line's number is the lines in earlier splits of the file plus its
    rank in its split. Only runs when the main read found malformed lines.
    """
    spec = FILES[name]
    text = spark.read.text(uri).select(
        F.col("value").alias("_line"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_rid"),
    )
    splits = sorted(
        (r["_block"], r["n"], r["rid0"])
        for r in text.groupBy("_block").agg(F.count("*").alias("n"), F.min("_rid").alias("rid0"))
        .collect()
    )
    first_line, before = {}, 0
    for block, n, rid0 in splits:
        first_line[block] = (before + 1, rid0)
        before += n
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    bad = (
        text.filter(F.trim("_line") != "")  # the JSON source skips blank lines too
        .select("_block", "_rid", "_line", F.from_json("_line", spec.with_corrupt(), opts)
                .alias("_r"))
        .select("_block", "_rid", "_line", "_r.*")
        .select("_block", "_rid", F.substring("_line", 1, 200).alias("text"),
                spec.reason().alias("reason"))
        .filter(F.col("reason").isNotNull())
        .orderBy("_block", "_rid")
        .limit(limit)
        .collect()
    )
    return [
        {"file": uri, "line": first_line[r["_block"]][0] + r["_rid"] - first_line[r["_block"]][1],
         "reason": r["reason"], "text": r["text"]}
        for r in bad
    ]


def read_history(spark: SparkSession, history_uri: str) -> History:
    """meta.json, and every JSONL file of the history parsed lazily with `_reason`."""
    meta = read_meta(spark, history_uri)
    parsed = {name: _read_jsonl(spark, child(history_uri, f"{name}.jsonl"), name)
              for name in FILES}
    return History(spark, history_uri, meta, parsed)
