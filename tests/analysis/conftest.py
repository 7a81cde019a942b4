"""One SparkSession for the whole folder (local[2], no UI, two shuffle partitions)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

# The scaled-history generator lives with the benchmarks, its main user; a test here checks
# that the job finds exactly what it plants.
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))


@pytest.fixture(scope="session")
def spark():
    session = (
        SparkSession.builder.master("local[2]")
        .appName("undertow-analysis-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
