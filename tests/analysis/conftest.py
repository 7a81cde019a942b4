"""One SparkSession for the whole folder, set as the job sets its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from undertow_analysis import class_archive
from undertow_analysis.session import SMALL_RUN_SENDS, session_conf

# The scaled-history generator lives with the benchmarks, its main user; a test here checks
# that the job finds exactly what it plants.
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))


@pytest.fixture(scope="session")
def spark():
    """The job's own settings (session_conf, for a small run), with two shuffle partitions
    and no UI: the tests' histories are tiny."""
    builder = SparkSession.builder.master("local[2]").appName("undertow-analysis-tests")
    conf = session_conf("local[2]", {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
    }, planned_sends=SMALL_RUN_SENDS)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def no_class_archive(tmp_path, monkeypatch):
    """An environment without Spark's class archive (`undertow_analysis.class_archive`): the
    JVM options a session gets otherwise, whatever `make install` made here."""
    monkeypatch.setenv(class_archive.ENV_DIRECTORY, str(tmp_path / "no-class-archive"))
