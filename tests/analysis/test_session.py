"""spark_session hands back the process's session, whichever thread made it, so that the job
never stops a session it did not create; the JVM of a session it starts writes its console to
a log (`jvm_console`), not between the command's own lines."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from undertow_analysis.session import jvm_console, spark_session


def test_a_session_made_on_another_thread_is_not_the_caller_s_to_stop(spark):
    # The fixture made the session on pytest's main thread; a JVM thread of its own does not
    # see it as active, but it is the one session of the process.
    with ThreadPoolExecutor(1) as pool:
        session, created = pool.submit(spark_session, "local[2]").result()
    assert session is spark or session.sparkContext is spark.sparkContext
    assert created is False
    assert not spark.sparkContext._jsc.sc().isStopped()


def test_the_jvm_s_console_goes_to_its_log_for_the_whole_life_of_the_process(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # A child started inside the block, as PySpark starts the JVM, writes to the log from
    # then on, also after the block; this process's own output is back on its terminal.
    log = tmp_path / "out" / "spark.log"
    print("before", flush=True)
    with jvm_console(log):
        child = subprocess.Popen(["sh", "-c", "echo started; read _; echo later >&2"],
                                 stdin=subprocess.PIPE)
    print("after", flush=True)
    child.communicate(b"\n", timeout=10)
    assert child.returncode == 0
    out, err = capfd.readouterr()
    assert (out, err) == ("before\nafter\n", "")
    assert log.read_text() == "started\nlater\n"


def test_a_session_that_already_runs_starts_no_jvm_and_writes_no_log(spark, tmp_path: Path
                                                                    ) -> None:
    session, created = spark_session("local[2]", jvm_log=tmp_path / "spark.log")
    assert session.sparkContext is spark.sparkContext and created is False
    assert not (tmp_path / "spark.log").exists()
