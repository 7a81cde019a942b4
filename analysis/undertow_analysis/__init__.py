"""The loss analysis: a PySpark job that checks a history for lost acknowledged records.

`run_analysis(history_uri, out_uri, master)` writes report.json, report.html and anomalies/,
prints a one-screen summary and returns the report; `main(argv)` is its command line.
"""

from undertow_analysis.job import main, run_analysis
from undertow_analysis.report import summary_text

__all__ = ["main", "run_analysis", "summary_text"]
