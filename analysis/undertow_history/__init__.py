"""The history's contract: its files and their fields (``undertow_history.schema``).

A package of its own because two parts hold to it and neither should own it: the runner
writes the history (and ships without Spark), the analysis reads it (and ships without the
runner). Both import this, and it imports nothing of either.
"""
