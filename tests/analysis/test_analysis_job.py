"""The whole job on planted histories: report.json, anomalies/, report.html and stdout."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from html.parser import HTMLParser

import pytest
from analysis_histories import (
    KILL,
    PARTITION,
    PLANTED_ANOMALIES,
    PLANTED_COUNTS,
    clean_history,
    planted_history,
)
from history_builder import HistoryBuilder
from scaled_history import write_scaled_history

from undertow_analysis import anomalies, checks, main, run_analysis
from undertow_analysis.anomalies import COUNTS as ANOMALY_COUNTS
from undertow_analysis.io import read_history
from undertow_analysis.report import COUNT_NAMES, latency_percentiles
from undertow_analysis.session import session_conf
from undertow_analysis.topics import topic_keys, topic_names


@pytest.fixture(scope="module")
def planted(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    history = planted_history().write(root / "history")
    return run_analysis(str(history), str(root / "out")), root / "out"


def test_planted_counts_are_exact_and_verdict_is_loss(planted):
    result, _ = planted
    assert result["counts"] == PLANTED_COUNTS
    assert (result["verdict"], result["expect"], result["as_expected"]) == ("loss", "loss", True)


def test_first_loss_is_the_earliest_sent_with_its_fault(planted):
    first = planted[0]["first_loss"]
    assert (first["value"], first["topic"], first["partition"], first["offset"]) == (
        "p0-3", "t", 0, 2)
    assert (first["t_rel_s"], first["fault"]) == (12.0, KILL)


def test_anomalies_output_lists_every_record_with_the_fault_active(spark, planted):
    rows = spark.read.parquet(str(planted[1] / "anomalies")).collect()
    assert {(r["kind"], r["value"], r["topic"], r["partition"], r["offset"]) for r in rows} == (
        PLANTED_ANOMALIES)
    assert len(rows) == len(PLANTED_ANOMALIES)
    lost = {r["value"]: r["fault"] for r in rows if r["kind"] == "lost"}
    assert lost == {"p0-3": KILL, "p2-3": f"{KILL} + {PARTITION}"}
    unexpected = next(r for r in rows if r["kind"] == "unexpected")
    assert (unexpected["t_invoke"], unexpected["fault"]) == (None, None)
    # The job's scratch output (anomalous values and series rows) is gone.
    assert sorted(p.name for p in planted[1].iterdir() if not p.name.startswith(".")) == [
        "anomalies", "report.html", "report.json"]


def test_faults_availability_and_latency(planted):
    result, _ = planted
    assert [(f["id"], f["fault"], f["start_s"], f["healed_s"], f["end_s"], f["recovered"])
            for f in result["faults"]] == [
        (1, "kill", 10.0, None, 20.0, True), (2, "partition", 15.0, None, 60.0, False)]
    # Every attempt completed within 10 ms of its invocation: no acknowledgement was missing
    # for a second while attempts were in flight. t-0 had no leader in the samples at 10 s
    # and 11 s, during the kill.
    assert [(w["kind"], w["start_s"], w["duration_s"], w.get("partition"), w["faults"])
            for w in result["unavailable_windows"]] == [("offline", 10.0, 2.0, 0, [1])]
    av = result["availability"]
    # 17 attempts, each in flight within one 0.1 s bucket of its own.
    assert (av["in_flight_s"], av["unavailable_s"], av["fraction"], av["no_ack_windows"]) == (
        1.7, 0.0, 1.0, 0)
    assert (av["attempts"], av["acked_attempts"], av["partition_offline_s"]) == (17, 10, 2.0)
    # The ten acknowledged attempts took 1, 2, ... 10 ms.
    assert result["latency_ms"] == pytest.approx({"p50": 5.0, "p99": 10.0, "p999": 10.0},
                                                 abs=0.01)
    assert result["run"]["last_read"] == max(r["t"] for r in planted_history().reads)


def outage_history() -> HistoryBuilder:
    """A send every 0.1 s for 10 s, acknowledged 10 ms later, except those invoked from 4 s
    to 7 s: the leader was killed at 4 s, and they are all acknowledged at once at 7.05 s,
    when the producer's retries reach the new leader."""
    h = HistoryBuilder(duration=11.0)
    for k in range(100):
        t = k / 10 + 0.03
        h.record(f"p0-{k}", 0, k, t=t, latency=7.05 - t if 4.0 <= t < 7.0 else 0.01)
    for action, t in (("inject", 4.0), ("heal", 6.0), ("recover", 6.8)):
        h.fault("kill", "broker-1", action, t=t, role="leader of t-0")
    return h


def test_an_outage_is_unavailable_until_acknowledgements_complete_again(spark, tmp_path):
    """Every second had sends invoked in it that were acknowledged in the end, so counted
    by invocation (the report's old definition) the run was 100 % available. Counted by
    completion, no acknowledgement came from 4 s to 7 s while sends were in flight."""
    history = outage_history().write(tmp_path / "history")
    result = run_analysis(str(history), str(tmp_path / "out"))
    assert [(w["kind"], w["start_s"], w["duration_s"], w["faults"])
            for w in result["unavailable_windows"]] == [("no_acks", 4.0, 3.0, [1])]
    av = result["availability"]
    assert (av["in_flight_s"], av["unavailable_s"], av["fraction"], av["longest_s"]) == (
        10.0, 3.0, 0.7, 3.0)
    assert (av["attempts"], av["acked_attempts"], av["ack_fraction"]) == (100, 100, 1.0)
    (fault,) = result["faults"]
    assert (fault["start_s"], fault["healed_s"], fault["end_s"]) == (4.0, 6.0, 6.8)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "#1 kill broker-1" in html and "healed (s)" in html


def test_a_job_that_fails_after_the_main_pass_started_leaves_no_scratch(
        spark, tmp_path, monkeypatch):
    """The main pass writes its scratch output while the truncations' query is built; when
    that fails, the job waits for the pass and removes what it wrote."""
    def broken(_events):
        raise RuntimeError("planted: the truncations' query failed")

    monkeypatch.setattr("undertow_analysis.job.attribution.truncations", broken)
    planted = planted_history()
    planted.events = []  # an events.jsonl, however empty: the truncations are queried
    history = planted.write(tmp_path / "history")
    with pytest.raises(RuntimeError, match="planted"):
        run_analysis(str(history), str(tmp_path / "out"))
    # The job returned only once nothing of it ran on: no thread of its pool is left.
    assert not [t.name for t in threading.enumerate() if t.name.startswith("undertow-job")]
    leftovers = [p.name for p in (tmp_path / "out").glob("*")] \
        if (tmp_path / "out").exists() else []
    assert not [name for name in leftovers if name.startswith("scratch")], leftovers


def test_report_json_on_disk_is_the_returned_report(planted):
    result, out = planted
    assert json.loads((out / "report.json").read_text()) == result


class _Page(HTMLParser):
    """The parts of report.html the tests look at."""

    def __init__(self) -> None:
        super().__init__()
        self.first_div: str | None = None
        self.images: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.verdict = ""
        self._table: str | None = None
        self._in_verdict = False
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and self.first_div is None:
            self.first_div = a.get("id")
        self._in_verdict = self._in_verdict or a.get("id") == "verdict"
        if tag == "img":
            self.images[a["id"]] = a["src"]
        elif tag == "table":
            self._table = a["class"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._row.append("")

    def handle_endtag(self, tag):
        if tag == "div":
            self._in_verdict = False
        elif tag == "tr" and self._row:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._in_verdict:
            self.verdict += data
        if self._row:
            self._row[-1] += data


def _page(out) -> _Page:
    page = _Page()
    page.feed((out / "report.html").read_text())
    return page


def _png(src: str) -> bytes:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    return base64.b64decode(src[len(prefix):])


def test_html_shows_verdict_first_the_timeline_and_the_lost_records(planted):
    page = _page(planted[1])
    assert page.first_div == "verdict"
    assert page.verdict == ("synthetic: LOSS \N{EM DASH} expected loss 2 of 10 acknowledged "
                            "records lost, 1 misplaced, 2 phantom reads, 1 inconsistent "
                            "offsets, 1 duplicates, 1 aborted reads, 1 unexpected")
    png = _png(page.images["timeline"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    lost = page.tables["lost"]
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in lost] == [
        ("lost", "p0-3", "t-0", "2", KILL), ("lost", "p2-3", "t-0", "7", f"{KILL} + {PARTITION}")]
    counts = {r[0]: r[1] for r in page.tables["counts"]}
    assert counts["lost"] == "2" and counts["attempted"] == "15"
    assert [r[:3] for r in page.tables["latency"]] == [["5.00", "10.00", "10.00"]]
    others = {(r[0], r[1]) for r in page.tables["anomalies"]}
    assert others == {(kind, value) for kind, value, *_ in PLANTED_ANOMALIES if kind != "lost"}


MALFORMED_SENDS = [
    '{"value": "p9-1", "topic": "t", "partition": "zero", "status": "ok", "offset": 1, '
    '"t_invoke": 1763830001.0, "t_complete": 1763830001.1}',
    '{"value": "p9-2", "topic": "t", "partition": 0, "status": "maybe", "offset": 1, '
    '"t_invoke": 1763830001.0, "t_complete": 1763830001.1}',
    '{"producer": "p9", "value": "p9-3", "topic": "t", "partit',  # torn by a crash
]
MALFORMED_READS = ["", "not json at all"]


def test_clean_history_with_malformed_lines(tmp_path, capsys):
    """Malformed lines are skipped and located by file and line; the rest is still counted,
    and a clean history stays clean."""
    history = clean_history().write(tmp_path / "history",
                                    {"sends": MALFORMED_SENDS, "reads": MALFORMED_READS})
    assert main([str(history), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "report.json").read_text())
    assert result["verdict"] == "clean" and result["as_expected"] is True
    assert result["counts"] == dict.fromkeys(COUNT_NAMES, 0) | {"attempted": 6, "acked": 6}
    assert result["first_loss"] is None
    sends, reads = str(history / "sends.jsonl"), str(history / "reads.jsonl")
    malformed = result["malformed"]
    assert (malformed["skipped"], malformed["by_file"]) == (4, {sends: 3, reads: 1})
    # 6 sends and 12 reads come first; the blank line 13 of reads.jsonl is not an error.
    assert [(m["file"], m["line"], m["reason"]) for m in malformed["lines"]] == [
        (sends, 7, "not valid JSON, or a field has the wrong type"),
        (sends, 8, "status must be one of ok, fail, info"),
        (sends, 9, "not valid JSON, or a field has the wrong type"),
        (reads, 14, "not valid JSON, or a field has the wrong type"),
    ]
    assert malformed["lines"][2]["text"] == MALFORMED_SENDS[2]
    stdout = capsys.readouterr().out
    assert "VERDICT: CLEAN" in stdout
    assert "malformed lines skipped: 4 (sends.jsonl:7, sends.jsonl:8, sends.jsonl:9, " \
           "reads.jsonl:14)" in stdout
    page = _page(tmp_path / "out")
    assert page.verdict.startswith("synthetic: CLEAN \N{EM DASH} expected clean 0 of 6 "
                                   "acknowledged records lost")
    assert _png(page.images["timeline"])[:4] == b"\x89PNG"
    # An empty table is one line.
    assert "lost" not in page.tables
    assert "0 of 6 acknowledged records lost" in (tmp_path / "out" / "report.html").read_text()
    assert [r[1] for r in page.tables["malformed"]] == ["7", "8", "9", "14"]


@pytest.mark.parametrize(("idempotent", "verdict"), [(True, "anomalies"), (False, "clean")])
def test_duplicates_are_anomalies_only_with_an_idempotent_producer(tmp_path, idempotent,
                                                                   verdict):
    h = HistoryBuilder(idempotent=idempotent)
    for i in range(3):
        h.record(f"p0-{i}", 0, i, t=1.0 + i)
    h.read("p0-1", 0, 3)  # drained a second time, at another offset: a producer retry
    result = run_analysis(str(h.write(tmp_path / "history")), str(tmp_path / "out"))
    assert result["counts"]["duplicates"] == 1
    assert sum(result["counts"][k] for k in ANOMALY_COUNTS) == 1
    assert result["verdict"] == verdict


def test_acks0_sends_have_no_offset_and_are_never_misplaced(tmp_path):
    """acks=0: the client reports success without an offset. Drained anywhere is fine; not
    drained is lost. Positions outside the packable range are malformed lines."""
    h = HistoryBuilder(expect="loss")
    h.send("p0-0", t=1.0, partition=0, offset=None)
    h.read("p0-0", 0, 0)
    h.send("p0-1", t=2.0, partition=0, offset=None)  # never drained
    h.record("p0-2", 0, 1, t=3.0)
    bad = ['{"value": "p9-1", "topic": "t", "partition": 0, "status": "ok", "offset": -1001, '
           '"t_invoke": 1763830001.0, "t_complete": 1763830001.1}',
           '{"value": "p9-2", "topic": "t", "partition": 8388608, "status": "ok", "offset": 1, '
           '"t_invoke": 1763830001.0, "t_complete": 1763830001.1}']
    history = h.write(tmp_path / "history", {"sends": bad})
    result = run_analysis(str(history), str(tmp_path / "out"))
    counts = result["counts"]
    assert (counts["attempted"], counts["acked"], counts["lost"], counts["misplaced"]) == (
        3, 3, 1, 0)
    assert result["first_loss"]["value"] == "p0-1"
    assert result["first_loss"]["offset"] is None
    assert [m["reason"] for m in result["malformed"]["lines"]] == [
        "offset must be 0..1099511627775", "partition must be 0..8388607"]


def test_latency_percentiles_are_nearest_rank_over_the_histogram():
    exact = [(i, 1, float(i)) for i in range(1, 11)]  # one latency per bucket: exact
    assert latency_percentiles(exact) == {"p50": 5.0, "p99": 10.0, "p999": 10.0}
    # 1000 latencies in 10 buckets of 100: the rank's bucket gives its largest latency.
    shared = [(b, 100, 10.0 * b) for b in range(10)]
    assert latency_percentiles(shared, {"p10": 0.1, "p101": 0.101}) == {"p10": 0.0,
                                                                          "p101": 10.0}
    assert latency_percentiles([]) == {"p50": None, "p99": None, "p999": None}


@pytest.mark.parametrize("group", [False, True], ids=["assign", "subscribe"])
def test_scaled_generator_plants_what_the_job_finds(tmp_path, group):
    expected = write_scaled_history(tmp_path / "history", 2_000, plant_every=101, group=group)
    result = run_analysis(str(tmp_path / "history"), str(tmp_path / "out"))
    assert result["counts"] == expected
    assert (expected["skipped"] > 0) is group
    # Every record kind planted many times (a consumer group's need a group: none here).
    assert min(expected[k.count] for k in anomalies.VALUE_KINDS if k.name != "skipped") >= 19


def test_interrupted_run_without_faults_or_cluster_samples(tmp_path):
    """meta.end null, no faults.jsonl, no cluster.jsonl: the run ends at the last send."""
    h = HistoryBuilder(expect="clean")
    h.record("p0-0", 0, 0, t=1.0)
    h.send("p0-1", t=2.0, partition=0, offset=1, latency=0.5)  # acknowledged, never drained
    history = h.write(tmp_path / "history")
    (history / "faults.jsonl").unlink()
    (history / "cluster.jsonl").unlink()
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(meta | {"end": None}))
    result = run_analysis(str(history), str(tmp_path / "out"))
    assert (result["verdict"], result["as_expected"], result["counts"]["lost"]) == (
        "loss", False, 1)
    assert result["run"]["duration_s"] == pytest.approx(2.5)
    assert (result["faults"], result["unavailable_windows"]) == ([], [])
    assert result["first_loss"]["fault"] is None


def test_missing_history_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    assert f"history {tmp_path / 'nowhere'} is not a directory" in capsys.readouterr().err


def test_bad_meta_field_is_named(tmp_path, capsys):
    history = clean_history().write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(meta | {"idempotent": "yes"}))
    assert main([str(history), "--out", str(tmp_path / "out")]) == 2
    assert "field 'idempotent' must be true or false" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b'{"experiment": "torn', b"", b'{"experiment": "\xff"}'])
def test_unreadable_meta_is_named(tmp_path, capsys, content):
    """A torn, empty or non-UTF-8 meta.json is bad input naming the file, not a crash."""
    history = clean_history().write(tmp_path / "history")
    (history / "meta.json").write_bytes(content)
    assert main([str(history), "--out", str(tmp_path / "out")]) == 2
    assert f"{history / 'meta.json'}: not valid JSON" in capsys.readouterr().err


def test_module_entry_point_parses_the_command_line():
    run = subprocess.run([sys.executable, "-m", "undertow_analysis", "--help"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert "--out" in run.stdout and "--master" in run.stdout


def test_a_local_session_gets_the_throughput_collector_unless_the_user_says_otherwise(
        no_class_archive):
    local = session_conf("local[*]")
    assert local["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    assert local["spark.sql.shuffle.partitions"] == "32"
    assert local["spark.shuffle.sort.bypassMergeThreshold"] == "0"
    assert "spark.sql.files.maxPartitionBytes" not in local  # Spark's 128 MB splits
    mine = session_conf("local[2]", {"spark.driver.extraJavaOptions": "-XX:+UseG1GC"})
    assert mine["spark.driver.extraJavaOptions"] == "-XX:+UseG1GC"
    # A cluster master (or spark-submit's own, None) keeps its JVM and partitioning settings.
    for master in ("spark://head:7077", None):
        conf = session_conf(master)
        assert "spark.driver.extraJavaOptions" not in conf
        assert "spark.sql.shuffle.partitions" not in conf
        assert "spark.shuffle.sort.bypassMergeThreshold" not in conf
        assert conf["spark.sql.session.timeZone"] == "UTC"


@pytest.fixture
def three_topics(tmp_path):
    """Anomalies on topic m (meta.json's experiment topic), c (sampled in cluster.jsonl) and r
    (only in reads.jsonl)."""
    h = HistoryBuilder()
    h.send("p0-1", t=1.0, partition=0, offset=0, topic="m")
    h.send("p0-2", t=1.0, partition=0, offset=0, topic="c")
    h.read("zz-1", 0, 0, topic="r")
    h.sample(t=1.0, partition=0, leader=1, isr=[1], topic="c")
    history = h.write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(meta | {"spec": {"topic": {"name": "m"}}}))
    return history


def _anomalous_at(spark, keys):
    """Anomalous (lost) values, one per topic key, positioned at offset 0 of partition 0."""
    struct = "struct<tk:bigint,pos:bigint>"
    schema = ", ".join([f"{c} {struct}" for c in checks.POSITIONS]
                       + [f"{k.name} boolean" for k in anomalies.VALUE_KINDS])
    rows = [tuple((tk, 0) if i == 0 else None for i in range(len(checks.POSITIONS)))
            + tuple(k.name == "lost" for k in anomalies.VALUE_KINDS) for tk in keys]
    return spark.createDataFrame(rows, schema)


def test_topic_names_come_from_meta_and_cluster_without_reading_sends_and_reads(
        spark, three_topics):
    history = read_history(spark, str(three_topics))
    for name in ("sends", "reads"):  # a scan of either would now fail
        (three_topics / f"{name}.jsonl").unlink()
    keys = topic_keys(spark, {"m", "c"})
    assert topic_names(history, _anomalous_at(spark, keys)) == keys


def test_a_topic_only_the_reads_mention_is_named_by_a_scan(spark, three_topics):
    history = read_history(spark, str(three_topics))
    keys = topic_keys(spark, {"m", "r"})
    assert topic_names(history, _anomalous_at(spark, keys)) == keys
    assert topic_names(history, _anomalous_at(spark, [])) == {}
