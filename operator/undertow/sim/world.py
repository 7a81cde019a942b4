"""An experiment in deterministic simulation: `run_experiment` on a `SimulatedPlatform`
(`undertow run --platform sim`, and every run of `undertow explore`: `run_simulated`).

The platform's nodes run minibroker's own servers on one virtual-time loop
(`undertow.platform.simulated`, `sim.cluster`), and its world (`sim.simulated_world`) runs
the run's phases in that loop's time, with the librdkafka-like client models as the
workload: the same seed gives the same history.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from undertow.platform.simulated import SimulatedPlatform
from undertow.runner.run import RunResult, run_experiment
from undertow.sim.timing import NOMINAL, Timing
from undertow.spec import LoadedExperiment, choose_seed


def simulated_platform(loaded: LoadedExperiment, root: Path, seed: int,
                       timing: Timing = NOMINAL) -> SimulatedPlatform:
    """The experiment's cluster in simulation, its nodes' data under ``root``."""
    cluster = loaded.cluster.spec
    shutil.rmtree(root, ignore_errors=True)  # the nodes' data start empty
    return SimulatedPlatform(root, cluster.brokers, cluster.config.as_overrides(),
                             ephemeral_storage=cluster.storage.type == "ephemeral", seed=seed,
                             clients=loaded.experiment.spec.own_link_clients(),
                             processes=loaded.experiment.spec.paused_clients(),
                             timing=timing)


def run_simulated(loaded: LoadedExperiment, out: Path, *, seed: int | None = None,
                  timing: Timing = NOMINAL) -> RunResult:
    """`run_experiment` of `loaded` on its simulated cluster (under `out`/cluster), without
    an analysis: the history in `out`/history."""
    seed = choose_seed(loaded.experiment.spec) if seed is None else seed
    platform = simulated_platform(loaded, out / "cluster", seed, timing)
    return run_experiment(loaded, platform, out, seed=seed)
