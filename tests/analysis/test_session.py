"""spark_session hands back the process's session, whichever thread made it, so that the job
never stops a session it did not create."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from undertow_analysis.session import spark_session


def test_a_session_made_on_another_thread_is_not_the_caller_s_to_stop(spark):
    # The fixture made the session on pytest's main thread; a JVM thread of its own does not
    # see it as active, but it is the one session of the process.
    with ThreadPoolExecutor(1) as pool:
        session, created = pool.submit(spark_session, "local[2]").result()
    assert session is spark or session.sparkContext is spark.sparkContext
    assert created is False
    assert not spark.sparkContext._jsc.sc().isStopped()
