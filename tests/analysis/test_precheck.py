"""`undertow analyze` refuses a directory that is not a history before Spark starts: exit 2,
naming what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from undertow_analysis.precheck import check_history


def analyze(history: Path, out: Path) -> tuple[int, str]:
    """`undertow analyze` where no Java can be found: had it started Spark, it would fail
    there instead (the gateway's launch), not with the history's own error."""
    env = {**os.environ, "JAVA_HOME": "/nonexistent-java", "PATH": "/nonexistent-bin"}
    done = subprocess.run([sys.executable, "-m", "undertow", "analyze", str(history),
                           "--out", str(out)], capture_output=True, text=True, timeout=60,
                          env=env)
    return done.returncode, done.stderr


def test_an_empty_directory_exits_2_before_spark_naming_what_is_missing(
        tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, err = analyze(tmp_path / "empty", tmp_path / "out")
    assert code == 2, err
    assert "has no meta.json, sends.jsonl, reads.jsonl: not a history directory" in err
    assert "Java" not in err and "JAVA" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_run_directory_points_at_its_history(tmp_path: Path) -> None:
    history = tmp_path / "run" / "history"
    history.mkdir(parents=True)
    for name in ("meta.json", "sends.jsonl", "reads.jsonl"):
        (history / name).write_text("{}" if name == "meta.json" else "")
    with pytest.raises(FileNotFoundError, match=f"did you mean {history}"):
        check_history(str(tmp_path / "run"))
    check_history(str(history))
    check_history(f"file://{history}")


@pytest.mark.parametrize("meta, message", [("{", "meta.json: not valid JSON"),
                                           (json.dumps([1]), "expected a JSON object")])
def test_a_meta_json_that_is_not_an_object_is_refused(tmp_path: Path, meta: str,
                                                     message: str) -> None:
    for name in ("sends.jsonl", "reads.jsonl"):
        (tmp_path / name).write_text("")
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(ValueError, match=message):
        check_history(str(tmp_path))


def test_other_file_systems_are_left_to_the_job() -> None:
    check_history("s3a://bucket/run/history")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        check_history("/nonexistent/history")


def test_a_spark_that_cannot_start_is_said_with_the_end_of_its_console(tmp_path: Path) -> None:
    # A history that passes the check: Spark is started, and its JVM finds no Java.
    history = tmp_path / "history"
    history.mkdir()
    for name in ("meta.json", "sends.jsonl", "reads.jsonl"):
        (history / name).write_text("{}" if name == "meta.json" else "")
    done = subprocess.run([sys.executable, "-m", "undertow", "analyze", str(history), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "JAVA_HOME": "/nonexistent-java"})
    code, err = done.returncode, done.stderr
    assert code == 2, err
    assert err.startswith("undertow analyze: Spark did not start: "), err
    # spark-class's own words, from the console the JVM's launch wrote to OUT/spark.log.
    assert f"the end of its console ({tmp_path / 'out' / 'spark.log'}):" in err, err
    assert "/nonexistent-java/bin/java: No such file or directory" in err, err
    assert "Traceback" not in err, err
