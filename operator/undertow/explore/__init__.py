"""``undertow explore``: many fault schedules in deterministic simulation, on Spark.

A fault space (``space``) gives seeded schedules (``draw``); each runs in the simulator and
is checked in its own Spark task (``runs``, ``spark``); every schedule that lost
acknowledged records is shrunk while it still loses by the same mechanism (``shrink``) and
written out as a minimal experiment (``write``), which ``--confirm`` runs on real processes.
"""
