"""The time grid of the send series (`checks.send_series`), in plain Python: the job, the
report and the plots share it, and the report must not need PySpark."""

from __future__ import annotations

import math
from dataclasses import dataclass

CELL_RATIO = 1.05
"""Latency width of a cell of the series' 2-D histogram: 5 %, about 47 cells a decade."""
SERIES_WIDTH_S = 0.1
"""The finest width of the completion and invocation buckets: availability is measured to it."""
MAX_SERIES_BUCKETS = 100_000
"""A run yields at most about this many buckets: longer runs get wider ones."""
MAX_CELL_COLUMNS = 1_000
"""The latency cells' columns over a run: about one per pixel of the timeline's width."""
UNKNOWN_SPAN_S = 86_400.0
"""The span the grid assumes when nothing tells the run's length (no end, no fault, no
cluster sample): one day, which gives 1 s buckets."""


@dataclass(frozen=True)
class Grid:
    """The time buckets of the send series, counted from `t_ref`: `width` seconds for
    invocations and completions, `column` seconds (a multiple of `width`) for the latency
    cells."""

    t_ref: float
    width: float
    column: float


def series_grid(t_ref: float, span_s: float | None) -> Grid:
    """The grid for a run of `span_s` seconds from `t_ref` (None: unknown): buckets
    SERIES_WIDTH_S wide, or wider (1-2-5 steps) so that there are at most MAX_SERIES_BUCKETS;
    cell columns at most MAX_CELL_COLUMNS."""
    span = UNKNOWN_SPAN_S if span_s is None or not span_s > 0 else span_s
    width = SERIES_WIDTH_S
    steps = (2.0, 2.5, 2.0)  # 0.1, 0.2, 0.5, 1, 2, 5, ...
    n = 0
    while span / width > MAX_SERIES_BUCKETS:
        width = round(width * steps[n % 3], 6)
        n += 1
    return Grid(t_ref, width, width * max(1, math.ceil(span / MAX_CELL_COLUMNS / width)))
