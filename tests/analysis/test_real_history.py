"""A real run's history through the real analysis: `undertow run` on the local platform (real
brokers, a real Kafka client, a leader killed), then the Spark job on what it wrote. The runner
and the analysis agree on the history schema only if no line is skipped and every field of every
line has the schema's type, to Python and to Spark's JSON reader alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyspark.sql import functions as F
from pyspark.sql import types as T
from small_experiment import small_experiment

from undertow_analysis import io
from undertow_analysis.job import analyze
from undertow_history import schema

REPO = Path(__file__).resolve().parents[2]

def records(file: schema.HistoryFile, history: Path) -> list:
    text = (history / file.filename).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()] if file.json_lines else [
        json.loads(text)]


def test_a_real_history_is_analysed_without_a_skipped_line_and_typed_as_documented(
        spark, tmp_path: Path) -> None:
    experiment, out = tmp_path / "experiment.yaml", tmp_path / "out"
    # The shortest run that writes every file: one leader kill, so faults.jsonl and
    # events.jsonl have lines and the cluster samples see a partition change leaders.
    experiment.write_text(small_experiment("schema-end-to-end"))
    run = subprocess.run([sys.executable, "-m", "undertow", "run", str(experiment), "--out",
                          str(out), "--no-analysis", "--seed", "7"],
                         cwd=REPO, capture_output=True, text=True, timeout=180,
                         start_new_session=True)
    assert run.returncode == 0, run.stdout + run.stderr
    history = out / "history"

    written = {f.name: records(f, history) for f in schema.FILES}
    for file in schema.FILES:
        # Its consumers are not a consumer group (assign mode) and its producers are not
        # transactional: groups.jsonl and txns.jsonl stay empty.
        assert written[file.name] or file in (schema.GROUPS, schema.TXNS), \
            f"{file.filename} is empty"
        problems = [(n, p) for n, r in enumerate(written[file.name], 1) for p in file.problems(r)]
        assert problems == [], f"{file.filename}: (line, problem) {problems[:10]}"
        if file.json_lines:  # Spark's reader with every field of the schema: no corrupt line
            full = T.StructType([*io.spark_schema(file).fields,
                                 T.StructField(io.CORRUPT, T.StringType())])
            lines = (spark.read.schema(full).option("mode", "PERMISSIVE")
                     .option("columnNameOfCorruptRecord", io.CORRUPT)
                     .json(str(history / file.filename)))
            assert lines.filter(F.col(io.CORRUPT).isNotNull()).collect() == [], file.filename

    result = analyze(spark, str(history), str(tmp_path / "report"))
    assert result["malformed"] == {"skipped": 0, "by_file": {}, "lines": []}
    sends = written["sends"]
    assert result["counts"]["attempted"] == len({s["value"] for s in sends})
    assert result["counts"]["acked"] == len({s["value"] for s in sends if s["status"] == "ok"})
    injects = [f for f in written["faults"] if f["action"] == "inject"]
    assert [(f["fault"], f["target"]) for f in result["faults"]] == [
        (f["fault"], f["target"]) for f in injects]
    assert (result["verdict"], result["experiment"]) == ("clean", "schema-end-to-end")
