"""Spark's classes for a local session's JVM from a class-data-sharing archive (AppCDS,
JEP 310 and JEP 350), made once per environment.

A new local session's JVM loads, parses and verifies the classes Spark needs (thousands, from
its 280 jars) at every start, and more while its first analysis runs. Mapped from
an archive, a session was ready in 2.9-3.2 s instead of 5.7-6.3 s, and its start with a
first analysis of a small history took 25-28 CPU-s instead of 34-37 and ended 6-8 s sooner
(benchmarks/RESULTS.md, "class_archive"). `undertow run` waits for its analysis process's
session and warm-up before the workload starts, and `make test` starts about fifteen.

The archive is made by `make install` (``python -m undertow_analysis.class_archive``): a JVM
started with ``-XX:ArchiveClassesAtExit`` analyses the warm-up's tiny history and writes the
classes it loaded as it exits. The file takes its name only once that JVM has exited cleanly,
so that no session maps a partial archive. A local session uses it when it is there
(`java_options`); the JVM checks that the archive was made by the same Java with the same
class path and, if not, starts without it (``-Xshare:auto``, its warnings off).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pyspark

ENV_DIRECTORY = "UNDERTOW_CLASS_ARCHIVE_DIR"
"""Where the archive is kept, if not in this Python environment's ``share/undertow``."""
QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
"""The JVM's own default (use the archive if it fits, else start without it), said, and its
warnings about an archive that does not fit (another Java, another class path) off."""
EXIT_TIMEOUT_S = 300.0
"""How long the making JVM may take to write the archive once its session stopped (about
190 MB: 10-20 s on a machine of the 2-core kind)."""


def archive_path() -> Path:
    """The archive of this environment's PySpark (a Java of another build is refused by the
    JVM itself)."""
    directory = os.environ.get(ENV_DIRECTORY) or Path(sys.prefix) / "share" / "undertow"
    return Path(directory) / f"spark-{pyspark.__version__}.jsa"


def java_options() -> str:
    """The driver's options that map the archive, or none without one."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""


def make(path: Path) -> None:
    """Write the archive to `path`: a session whose JVM records its classes analyses the
    warm-up's tiny history, stops, and its JVM writes them at its exit; the file is renamed
    into `path` only after that exit, a clean one."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from undertow_analysis import job, session, warmup

    if SparkContext._active_spark_context is not None:
        raise RuntimeError("a Spark session is already running in this process")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    os.close(fd)
    os.unlink(partial)  # the JVM creates the file itself
    conf = session.session_conf("local[2]", {"spark.ui.enabled": "false"},
                                planned_sends=session.SMALL_RUN_SENDS)
    # Not on top of an archive already there: the JVM refuses to record while mapping one.
    options = conf["spark.driver.extraJavaOptions"].replace(java_options(), "").strip()
    conf["spark.driver.extraJavaOptions"] = f"{options} -XX:ArchiveClassesAtExit={partial} {QUIET}"
    builder = SparkSession.builder.master("local[2]").appName("undertow-class-archive")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark.sparkContext._gateway.proc  # the spark-submit process, exec'd into the JVM
    try:
        warmup.warm_up(spark, None, job.analyze)
    finally:
        spark.stop()
        jvm.stdin.close()  # PySpark's gateway server exits when its input closes
        code = jvm.wait(timeout=EXIT_TIMEOUT_S)
    if code != 0 or not Path(partial).is_file():
        Path(partial).unlink(missing_ok=True)
        raise RuntimeError(f"the JVM exited with {code} without writing {partial}")
    os.replace(partial, path)


def main() -> int:
    """``python -m undertow_analysis.class_archive``: make this environment's archive (again)."""
    path = archive_path()
    try:
        make(path)
    except Exception as exc:  # an optimisation: the sessions start without it
        print(f"class archive: not made ({type(exc).__name__}: {exc}); Spark sessions start "
              f"without it", file=sys.stderr)
        return 1
    print(f"class archive: {path} ({path.stat().st_size // 2**20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
