"""Spark's classes mapped from this environment's class-data-sharing archive
(`undertow_analysis.class_archive`, made by `make install`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from undertow_analysis import class_archive
from undertow_analysis.session import session_conf


def test_a_local_session_maps_the_archive_when_the_environment_has_one(spark) -> None:
    path = class_archive.archive_path()
    if not path.is_file():
        pytest.skip(f"no class archive at {path}: `make install` makes it")
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    assert str(path) in Path(f"/proc/{pid}/maps").read_text()


def test_only_a_local_session_is_given_an_archive_that_exists(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(class_archive.ENV_DIRECTORY, str(tmp_path))
    assert class_archive.java_options() == ""
    assert "SharedArchiveFile" not in session_conf("local[2]")["spark.driver.extraJavaOptions"]
    class_archive.archive_path().write_bytes(b"")
    options = session_conf("local[2]")["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={class_archive.archive_path()}" in options
    assert "spark.driver.extraJavaOptions" not in session_conf("spark://head:7077")


@pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM")
def test_a_jvm_the_archive_does_not_fit_starts_without_it_and_without_a_word() -> None:
    """A JVM whose class path is not Spark's (as after an upgrade of Spark or Java) refuses
    the archive: it starts all the same, and says nothing on a session's output."""
    path = class_archive.archive_path()
    if not path.is_file():
        pytest.skip(f"no class archive at {path}: `make install` makes it")
    proc = subprocess.run(["java", f"-XX:SharedArchiveFile={path}",
                           *class_archive.QUIET.split(), "-version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "archive" not in proc.stdout + proc.stderr
