"""What a sequence step waits for: the events of the previous step, read from the cluster
view (a fake platform answers it here; the real platforms are exercised by the experiment
tests)."""

from __future__ import annotations

from types import SimpleNamespace

from undertow.cluster_view import ClusterView, view_from_states
from undertow.runner.nemesis import FaultRun, Nemesis


class ControllerState:
    """The only platform call the ISR events make: the cluster view, from the controller's
    state."""

    def __init__(self) -> None:
        self.isr = [0, 1, 2]

    def cluster_view(self) -> ClusterView:
        return view_from_states({"topics": {"t": {"partitions": {"0": {
            "leader": 0, "leader_epoch": 0, "isr": list(self.isr), "replicas": [0, 1, 2]}}}}})


def test_in_sync_means_back_in_the_isr_after_the_fault_was_recovered() -> None:
    """A stalled follower stays in the ISR until the lag time has passed: `in-sync` must not
    fire then, only once the fault is over and the follower has rejoined."""
    platform = ControllerState()
    nemesis = Nemesis(platform, [], "t", None, 1)  # type: ignore[arg-type]
    run = FaultRun(SimpleNamespace(target=None))  # type: ignore[arg-type]
    run.targets.append("broker-2")
    in_sync = nemesis.event_check("in-sync", run)
    out_of_sync = nemesis.event_check("out-of-sync", run)

    run.injected.set()  # stalled, still in the ISR
    assert not in_sync() and not out_of_sync()
    platform.isr = [0, 1]  # lagged out
    assert out_of_sync() and not in_sync()
    run.recovered.set()  # the stall is over; it has not caught up yet
    assert not in_sync()
    platform.isr = [0, 1, 2]
    assert in_sync() and not out_of_sync()
