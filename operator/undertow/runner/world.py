"""What a run needs besides the platform's primitives, in the world it runs in: the clock and
its waits, the workload's clients, the drain, and where the nodes' events come from.

`run_experiment`'s phases (`undertow.runner.run`) are written once against `World`. On real
platforms (`RealWorld`) time is the wall clock, a wait blocks this thread, the workload is
stock Kafka clients on threads (a producer the schedule pauses on a process of its own:
`runner.producer_process`), and the events are pulled from each node's `/v1/events`. In
simulation (`undertow.sim.simulated_world.SimulatedWorld`) time is the virtual loop's, a wait
runs the loop until its condition holds, and the workload is the librdkafka-like client
models, each speaking the Kafka protocol to the brokers' own listeners. Nothing else differs:
the phases, their bounds, the nemesis, the sampler, the event collector and the history are
the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from undertow.cluster_view.kafka import KafkaAdminError, admin_client, create_topic
from undertow.platform.base import Platform, wait_for
from undertow.runner.abort import Abort
from undertow.runner.events import EventCollector
from undertow.runner.history import HistoryWriter
from undertow.runner.outcomes import LeaderEpochGate
from undertow.runner.scheduler import Scheduler, ThreadScheduler
from undertow.runner.workload import Workload, WorkloadConfig, drain
from undertow.spec import LoadedExperiment

READY_TIMEOUT_S = 60.0
"""How long the topic's creation, and then its first leaders and full ISRs, may take."""


class RunWorkload(Protocol):
    """The producers and the run's consumers, as the phases drive them. Definite failures
    pass through `epoch_gate`: the sampler feeds it, and it is closed when the sampler
    stops."""

    epoch_gate: LeaderEpochGate

    def start(self) -> None: ...

    def progress(self) -> dict[str, Any]:
        """`counts`, `errors` and `acks_per_second`, for the progress line."""

    def stop_producers(self) -> None: ...

    def await_outcomes(self) -> None:
        """Until every send's outcome is known (bounded: `outcomes_wait_s`)."""

    def stop_consumers(self) -> list[str]:
        """The run's consumers stop (a group's members commit and leave), within
        `MEMBERS_CLOSE_TIMEOUT_S`: the names of those still closing then."""

    def stop(self) -> None:
        """On every way out: no more sends, no more reads (idempotent)."""


class Collector(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


class World(Protocol):
    def now(self) -> float:
        """The history's clock: seconds since the epoch (virtual in simulation)."""

    def monotonic(self) -> float: ...

    def scheduler(self) -> Scheduler:
        """A new scheduler for one of the run's background parts (the nemesis, the
        sampler), shut down when that part stops."""

    def sleep(self, seconds: float, abort: Abort) -> bool:
        """Let `seconds` pass; True when the run was aborted meanwhile."""

    def until(self, condition: Callable[[], bool], timeout_s: float, what: str,
              abort: Abort) -> None:
        """Wait for `condition` (its errors count as not yet); PlatformError naming `what`
        after `timeout_s`, the run's failure as soon as it is aborted."""

    def create_topic(self, loaded: LoadedExperiment, abort: Abort) -> None:
        """The experiment's topic (and a pipeline's output topic, made the same way),
        created as a client creates it; returns once the platform serves it."""

    def workload(self, cfg: WorkloadConfig, history: HistoryWriter,
                 abort: Abort) -> RunWorkload: ...

    def drain(self, cfg: WorkloadConfig, history: HistoryWriter, abort: Abort,
              timeout_s: float) -> dict[int, tuple[int | None, int]]:
        """A fresh consumer reads every partition from its start to its end (`drain`)."""

    def events(self, history: HistoryWriter) -> Collector:
        """What brings the nodes' events into the history during the run."""

    def history_fields(self) -> dict[str, Any]:
        """What meta.json says of this world (the simulation's `platform`)."""


def topic_names(loaded: LoadedExperiment) -> list[str]:
    """The topics a run creates: the experiment's, and its pipeline's output topic (same
    partitions, replication factor and config)."""
    spec = loaded.experiment.spec
    pipeline = spec.workload.pipeline
    return [spec.topic.name, *([str(pipeline.output_topic)] if pipeline else [])]


class RealWorld:
    """Real processes, pods or a Kubernetes cluster: wall-clock time, threads, stock clients
    over `platform.bootstrap`."""

    def __init__(self, platform: Platform) -> None:
        self._platform = platform

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def scheduler(self) -> Scheduler:
        return ThreadScheduler()

    def sleep(self, seconds: float, abort: Abort) -> bool:
        return abort.wait(seconds)

    def until(self, condition: Callable[[], bool], timeout_s: float, what: str,
              abort: Abort) -> None:
        wait_for(lambda: abort.is_set() or condition(), timeout_s, what, ignore=(Exception,))
        abort.raise_if_set()

    def create_topic(self, loaded: LoadedExperiment, abort: Abort) -> None:
        """With a stock Kafka admin client, as on any Kafka; retried until the cluster
        serves."""
        topic = loaded.experiment.spec.topic
        admin = admin_client(self._platform.bootstrap)
        for name in topic_names(loaded):

            def created(name: str = name) -> bool:
                create_topic(admin, name, topic.partitions, topic.replication_factor,
                             topic.config.as_overrides())
                return True

            wait_for(created, READY_TIMEOUT_S, f"topic {name} to be created", interval=0.5,
                     ignore=(KafkaAdminError,))
            abort.raise_if_set()

    def workload(self, cfg: WorkloadConfig, history: HistoryWriter,
                 abort: Abort) -> RunWorkload:
        return Workload(self._platform.bootstrap, cfg, history, abort,
                        self._platform.bootstrap_for, self._platform.start_client)

    def drain(self, cfg: WorkloadConfig, history: HistoryWriter, abort: Abort,
              timeout_s: float) -> dict[int, tuple[int | None, int]]:
        return drain(self._platform.bootstrap, cfg.topic, cfg.partitions, history, abort,
                     timeout_s)

    def events(self, history: HistoryWriter) -> Collector:
        return EventCollector(self._platform, history)

    def history_fields(self) -> dict[str, Any]:
        return {}
