"""The loss analysis: a PySpark job that checks a history for lost acknowledged records.

`run_analysis(history_uri, out_uri, master)` writes report.json, report.html and anomalies/,
prints a one-screen summary and returns the report; `main(argv)` is its command line.

They are imported on first use: the runner imports `undertow_analysis.report` for the
summary it prints, which must not pull in PySpark (the operator image has none).
"""

from typing import Any

__all__ = ["main", "run_analysis", "summary_text"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from undertow_analysis.__main__ import main
        return main
    if name == "run_analysis":
        from undertow_analysis.job import run_analysis
        return run_analysis
    if name == "summary_text":
        from undertow_analysis.report import summary_text
        return summary_text
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
