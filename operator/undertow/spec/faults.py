"""Faults and their schedule, as `ChaosExperiment.spec.faults` lists them.

Each item of `spec.faults` is exactly one of three shapes::

    # 1. one fault, possibly repeated
    - kind: kill                       # kill | pause | partition | disk-stall | disk-full
                                       # | power-loss | pod-delete
      target: {role: leader}           # leader of partition 0 of the experiment topic
      at: 5s                           # offset from the workload's start
      duration: 3s                     # restart / resume / heal after this long
      every: 10s                       # optional: repeat ...
      count: 3                         # ... this many times (default: until the workload ends)

    # 2. a sequence: each step waits for an event of the step before it
    - sequence:
        at: 10s
        steps:
          - kind: kill
            target: {role: follower}
            duration: 1s
          - when: recovered            # the follower killed above is back ...
            after: 0s                  # ... and at once:
            kind: kill
            target: {role: leader}
            duration: 8s

    # 3. a random schedule, drawn from the experiment's seed (same seed, same schedule)
    - random:
        kinds: [kill, pause]
        targets: [{role: leader}, {role: follower}]
        interval: {min: 3s, max: 8s}   # quiet time before each fault (after the last recovery)
        duration: {min: 1s, max: 4s}
        count: 4                       # default: until the workload ends

Targets are selectors, never broker ids picked at load time: the runner resolves
`{role: leader}` from live metadata at the moment of injection (who leads *now*), with
Chaos Mesh's modes choosing among the candidates (`one`, `all`, `fixed` N,
`fixed-percent` P).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .durations import Duration, format_duration
from .meta import FieldError, SpecModel, one_of

__all__ = [
    "DurationRange",
    "Event",
    "FaultKind",
    "Mode",
    "NetworkDelay",
    "NetworkFault",
    "PartitionMode",
    "RandomSchedule",
    "Role",
    "ScheduleEntry",
    "SequenceSchedule",
    "Step",
    "TargetSelector",
]

FaultKind = Literal["kill", "pause", "partition", "delay", "disk-stall", "disk-full",
                    "power-loss", "pod-delete"]
"""kill: SIGKILL (with a `gracePeriod`: SIGTERM first, a clean shutdown), then restart.
pause: SIGSTOP/SIGCONT (a GC pause). partition: network cut. delay: network latency.
disk-stall: the broker's appends and fsyncs block. disk-full: its log writes fail with
ENOSPC, its log directory goes offline and it halts, as Kafka's does; restarted when the
disk is freed. power-loss: the process dies and every
file loses what was not fsynced, then it restarts. pod-delete: the pod is deleted and
replaced at once (new address; an ephemeral disk comes back empty)."""

BROKER_ONLY_KINDS = {
    "disk-stall": "disk-stall is a broker failpoint; the controller has none",
    "disk-full": "disk-full is a broker failpoint; the controller has none",
    "power-loss": "power-loss is a broker failpoint; the controller has none",
    "pod-delete": "pod-delete hits broker pods only (the controller's metadata is not a "
                  "fault target)",
}
"""Kinds a controller target cannot take, with the reason."""

GRACE_PERIOD_KINDS = ("kill", "pod-delete")
"""Kinds that take a `gracePeriod`: SIGTERM, then SIGKILL after it."""
MAX_KILL_GRACE_S = 300.0
"""The longest `gracePeriod` of a kill: the most the fault agent waits for the broker to
exit on SIGTERM (``kube.agent.server.MAX_GRACE_S``)."""

PartitionMode = Literal["isolate", "split", "one-way"]
"""How a partition cuts, or which links a delay slows: see `NetworkFault`."""
NETWORK_KINDS = ("partition", "delay")
"""Kinds that act on links, shaped by `network`."""

Role = Literal["leader", "follower", "isr-member", "all-isr-but-one", "controller",
               "group-coordinator", "txn-coordinator"]
Mode = Literal["one", "all", "fixed", "fixed-percent"]
Event = Literal["injected", "recovered", "in-sync", "out-of-sync"]
"""What a sequence step waits for, about the previous step's fault and targets:
injected: the fault is in effect. recovered: it was recovered and the target serves again
(process restarted and registered with the controller, or the link healed). in-sync: it was
recovered and the targets are back in the ISR of their partition. out-of-sync: while it is
in effect, they have left it."""

STEP_TIMEOUT = 30
"""Default seconds a sequence step waits for its event."""
PARTITION_ROLES = ("leader", "follower", "isr-member", "all-isr-but-one")
CLIENT_TARGETS = ("a consumer or producer can only be the target of a partition or delay "
                  "of mode isolate (its links to every broker cut or slowed) or one-way (its "
                  "packets to the `to` broker), and a producer also of a pause (SIGSTOP of "
                  "its own process)")
RANDOM_CLIENT_TARGETS = (
    "a random schedule can only cut a consumer or producer off (`partition`, which isolates "
    "it) or pause a producer (`pause`): every kind in `kinds` must be one of those for every "
    "client among `targets`")
SINGLE_ROLES = {"controller": "the controller", "group-coordinator": "the group coordinator",
                "txn-coordinator": "the transaction coordinator"}
"""Roles that name one process: they take no partition, mode or value."""

UNDRAWN_DELAY = ("delays are not drawn at random yet (their latency has no range to draw "
                 "from): give each delay as a fault of its own, with its `delay` block")

NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]


class TargetSelector(SpecModel):
    """Which process a fault hits, resolved by the runner when the fault is injected.

    Exactly one of `role` or `broker`. `{role: leader}` is the leader of `partition`
    (default 0) of the experiment topic; `follower` a replica of it outside the leader;
    `isr-member` any ISR member; `all-isr-but-one` the ISR without one member (the
    classic way to leave a single replica holding the data); `controller` the controller;
    `group-coordinator` the broker coordinating the workload's consumer group (the leader of
    its `__consumer_offsets` partition; `workload.consumer.mode: subscribe` only);
    `txn-coordinator` the broker coordinating the first producer's transactions (the leader
    of the `__transaction_state` partition of transactional id `undertow-p0`;
    `workload.transactions` only).
    `{broker: 2}` is broker id 2, whatever its role. `{consumer: 1}` is the workload's
    consumer `c1` (a group member in subscribe mode) and `{producer: 0}` its producer `p0`,
    for a partition or delay that isolates it (or, `one-way`, acts on its packets to one
    broker), or (a producer) a pause of its process.
    `mode` picks among the candidates:
    `one` (default; `all` for all-isr-but-one), `all`, `fixed` (`value` of them) or
    `fixed-percent` (`value` percent of them, rounded down, at least one).
    """

    model_config = one_of("role", "broker", "consumer", "producer")

    role: Role | None = None
    """leader, follower, isr-member or all-isr-but-one (of `partition`), controller,
    group-coordinator or txn-coordinator."""
    broker: NonNegativeInt | None = None
    """A broker id, 0 .. brokers-1."""
    consumer: NonNegativeInt | None = None
    """A consumer of the workload, by index (0 is `c0`): the target of an `isolate`
    partition or delay on its links to every broker (the local platform and the simulator
    give each such client links of its own)."""
    producer: NonNegativeInt | None = None
    """A producer of the workload, by index (0 is `p0`): the target of an `isolate`
    partition or delay on its links to every broker, as a consumer's, or of a `pause`
    (SIGSTOP of the producer's own process; in simulation its client model's code held)."""
    partition: NonNegativeInt | None = None
    """The experiment topic's partition whose leader/followers/ISR is meant (default 0)."""
    mode: Mode | None = None
    """one, all, fixed or fixed-percent of the candidates (default one; all for
    all-isr-but-one)."""
    value: PositiveInt | None = None
    """N for mode fixed, P (1-100) for mode fixed-percent."""

    @model_validator(mode="after")
    def _normalise(self) -> TargetSelector:
        if sum(x is not None for x in (self.role, self.broker, self.consumer,
                                       self.producer)) != 1:
            raise FieldError((), "set exactly one of 'role', 'broker', 'consumer' or "
                                 "'producer'")
        if self.broker is not None or self.client is not None or self.role in SINGLE_ROLES:
            what = (f"broker {self.broker}" if self.broker is not None
                    else self.describe() if self.client is not None
                    else SINGLE_ROLES[self.role])
            for name in ("partition", "mode", "value"):
                if getattr(self, name) is not None:
                    raise FieldError((name,), f"does not apply to {what}: it is a single process")
            return self
        if self.partition is None:
            self.partition = 0
        if self.mode is None:
            self.mode = "all" if self.role == "all-isr-but-one" else "one"
        if self.mode in ("fixed", "fixed-percent"):
            if self.value is None:
                raise FieldError(("value",), f"mode {self.mode} needs a value")
            if self.mode == "fixed-percent" and self.value > 100:
                raise FieldError(("value",), f"fixed-percent {self.value} is above 100")
        elif self.value is not None:
            raise FieldError(
                ("value",), f"only modes fixed and fixed-percent take a value, not {self.mode}"
            )
        return self

    @property
    def client(self) -> str | None:
        """The workload client this selector names (`c1`, `p0`), else None."""
        if self.consumer is not None:
            return f"c{self.consumer}"
        return None if self.producer is None else f"p{self.producer}"

    @property
    def client_field(self) -> str:
        """The field that names the client (`consumer` or `producer`), for errors."""
        return "consumer" if self.consumer is not None else "producer"

    def describe(self) -> str:
        """How the history's `role` column names this selector, e.g. `leader of p0`."""
        if self.broker is not None:
            return f"broker {self.broker}"
        if self.consumer is not None:
            return f"consumer c{self.consumer}"
        if self.producer is not None:
            return f"producer p{self.producer}"
        if self.role in SINGLE_ROLES:
            return self.role
        where = f"of p{self.partition}"
        if self.mode == "one" or self.role in ("leader", "all-isr-but-one"):
            return f"{self.role} {where}"
        plural = f"{self.role}s"
        if self.mode == "all":
            return f"all {plural} {where}"
        if self.mode == "fixed":
            return f"{self.value} {plural} {where}"
        return f"{self.value}% of {plural} {where}"


class NetworkFault(SpecModel):
    """The links a `partition` cuts (or a `delay` slows).

    `isolate`: the target loses its links to every other broker and the controller;
    clients still reach it (the interesting case: a leader that still takes writes).
    `split`: `groups` of selectors; links between groups are cut, links within a group
    and of processes named in no group stay up; the fault has no `target`.
    `one-way`: packets from the target to `to` are dropped, the reverse direction flows.
    """

    mode: PartitionMode = "isolate"
    to: TargetSelector | None = None
    """one-way only: the far side."""
    groups: list[list[TargetSelector]] | None = None
    """split only: at least two non-empty groups."""

    @model_validator(mode="after")
    def _check_mode(self) -> NetworkFault:
        if self.mode == "one-way" and self.to is None:
            raise FieldError(("to",), "a one-way partition needs 'to', the far side")
        if self.mode != "one-way" and self.to is not None:
            raise FieldError(("to",), f"only one-way partitions take 'to', not {self.mode}")
        if self.mode == "split":
            if not self.groups or len(self.groups) < 2:
                raise FieldError(("groups",), "a split needs at least two groups")
            for index, group in enumerate(self.groups):
                if not group:
                    raise FieldError(("groups", index), "a group needs at least one selector")
        elif self.groups is not None:
            raise FieldError(("groups",), f"only split partitions take 'groups', not {self.mode}")
        return self

    def selectors(self) -> Iterator[tuple[tuple[str | int, ...], TargetSelector]]:
        if self.to is not None:
            yield ("to",), self.to
        for g, group in enumerate(self.groups or ()):
            for s, selector in enumerate(group):
                yield ("groups", g, s), selector


class NetworkDelay(SpecModel):
    """How late a `delay` fault makes each packet of its links arrive, with Chaos Mesh's
    NetworkChaos `delay` fields (tc netem's): `latency`, give or take up to `jitter`, each
    packet's jitter tied by `correlation` percent to the one before. A connection's bytes
    still arrive in order (TCP's), so what a delay reorders is messages on different
    connections: a request to one broker overtaken by a later one to another."""

    latency: Duration
    """Added to every packet of the links, e.g. `100ms`."""
    jitter: Duration = Field("0s", validate_default=True)
    """Up to this much more or less, drawn per packet (at most `latency`)."""
    correlation: float = Field(0.0, ge=0, le=100)
    """Percent: how much of each packet's jitter is the previous packet's (0: independent)."""

    @model_validator(mode="after")
    def _check_delay(self) -> NetworkDelay:
        if self.latency <= 0:
            raise FieldError(("latency",), "must be positive: a delay of no time slows nothing")
        if self.jitter > self.latency:
            raise FieldError(("jitter",), f"{format_duration(self.jitter)} is above the "
                                          f"latency {format_duration(self.latency)}: a packet "
                                          "would arrive before it was sent")
        return self


class FaultAction(SpecModel):
    """What one fault does: the part shared by a scheduled fault and a sequence step."""

    kind: FaultKind | None = None
    """kill (SIGKILL, restart after duration; with a `gracePeriod`, SIGTERM first: a clean
    shutdown in place, as in a rolling restart), pause (SIGSTOP/SIGCONT), partition (network
    cut), disk-stall (appends and fsyncs block), disk-full (log writes fail with ENOSPC:
    the broker halts on its failed log directory, restarted when the disk is freed),
    power-loss (die, lose every write that was not fsynced, restart), delay (the links'
    packets arrive late) or pod-delete (Chaos Mesh's pod-kill: the broker's pod is deleted
    and replaced at once, with a new address and, with ephemeral storage, an empty
    disk)."""
    target: TargetSelector | None = None
    """Required, except for split partitions whose groups say who is cut off."""
    network: NetworkFault | None = None
    """partition and delay only: the links they act on (default: every link of the target,
    both ways)."""
    delay: NetworkDelay | None = None
    """delay only, required: how late the links' packets arrive."""
    duration: Duration | None = None
    """How long the fault lasts: restart, resume, heal or unstall after this long. For
    pod-delete, how long the replacement may take to serve, registered and unfenced."""
    grace_period: Duration | None = None
    """kill and pod-delete only: SIGTERM, then SIGKILL if the process has not exited after
    this long (default 0s: SIGKILL at once, as Chaos Mesh's pod-kill). For pod-delete, the
    deletion's grace period; for kill (at most 300s), a clean shutdown in place, as in a
    rolling restart (the broker flushes its logs), then held down for `duration`,
    as after any kill."""

    def _check_action(self) -> None:
        if self.kind is None:
            raise FieldError(("kind",), "required")
        if self.duration is None:
            raise FieldError(("duration",), f"required: how long the {self.kind} lasts")
        if self.duration <= 0:
            raise FieldError(("duration",), f"must be positive: a {self.kind} that lasts no "
                                            "time is never injected")
        if self.kind in NETWORK_KINDS:
            if self.network is None:
                self.network = NetworkFault()
        elif self.network is not None:
            raise FieldError(("network",), "only partition and delay faults take 'network', "
                                           f"not {self.kind}")
        if self.kind == "delay" and self.delay is None:
            raise FieldError(("delay",), "required: how late the packets arrive, e.g. "
                                         "{latency: 100ms, jitter: 20ms}")
        if self.kind != "delay" and self.delay is not None:
            raise FieldError(("delay",), f"only delay faults take 'delay', not {self.kind}")
        if self.grace_period is not None and self.kind not in GRACE_PERIOD_KINDS:
            raise FieldError(("gracePeriod",), "only kill and pod-delete faults take "
                                               f"'gracePeriod', not {self.kind}")
        if self.kind == "kill" and (self.grace_period or 0) > MAX_KILL_GRACE_S:
            raise FieldError(("gracePeriod",),
                             f"{format_duration(self.grace_period or 0)} is above "
                             f"{format_duration(MAX_KILL_GRACE_S)}, the longest a kill "
                             "waits for a clean shutdown")
        split = self.network is not None and self.network.mode == "split"
        if split and self.target is not None:
            raise FieldError(("target",), "a split partition takes its groups, not a target")
        if not split and self.target is None:
            raise FieldError(("target",), f"required: who the {self.kind} hits")
        if self.kind in BROKER_ONLY_KINDS:
            for loc, selector in self.selectors():
                if selector.role == "controller":
                    raise FieldError(loc, BROKER_ONLY_KINDS[self.kind])
        # A client's own links go to every broker: it can be cut off or slowed from all of
        # them (isolate), or from one (one-way: its requests to the coordinator alone, say).
        shaped = self.kind in NETWORK_KINDS and self.network is not None \
            and self.network.mode in ("isolate", "one-way")
        # A producer a schedule pauses runs as a process of its own, which SIGSTOP freezes;
        # the consumers stay threads of the runner.
        paused = self.kind == "pause" and self.target is not None \
            and self.target.producer is not None
        for loc, selector in self.selectors():
            if selector.client is not None and not ((shaped or paused) and loc == ("target",)):
                raise FieldError((*loc, selector.client_field), CLIENT_TARGETS)
        if self.target is not None and self.target.client is not None \
                and self.network is not None and self.network.to is not None \
                and self.network.to.role == "controller":
            raise FieldError(("network", "to", "role"),
                             "a client has no link to the controller: only brokers")

    def selectors(self) -> Iterator[tuple[tuple[str | int, ...], TargetSelector]]:
        """Every selector of this fault with its path, for checks against the cluster."""
        if self.target is not None:
            yield ("target",), self.target
        if self.network is not None:
            for loc, selector in self.network.selectors():
                yield ("network", *loc), selector


class Step(FaultAction):
    """One step of a sequence. Every step but the first waits on the previous step:
    `when` the event happens, `after` a delay (default 0: at once), or the rest of the
    sequence is skipped when the event has not happened within `timeout`."""

    when: Event | None = None
    """injected, recovered (process back and registered, or link healed), in-sync (recovered,
    and the targets back in the ISR) or out-of-sync (targets left the ISR), about the
    previous step."""
    after: Duration = Field("0s", validate_default=True)
    """Delay between the event and this step's injection."""
    timeout: Duration = Field(f"{STEP_TIMEOUT}s", validate_default=True)
    """Skip the rest of the sequence if the event has not come within this long."""

    def _check_step(self, first: bool) -> None:
        self._check_action()
        if first:
            # Compared with the defaults rather than "was it written", so that a dumped spec
            # (the run's meta.json) validates again.
            for name, default in (("when", None), ("after", 0), ("timeout", STEP_TIMEOUT)):
                if getattr(self, name) != default:
                    raise FieldError((name,), "the first step starts at the sequence's 'at'")
        elif self.when is None:
            raise FieldError(("when",), "required: the event of the previous step to wait for")


class SequenceSchedule(SpecModel):
    """Steps run one after the other; the whole sequence may repeat (`every`, `count`)."""

    at: Duration = Field("0s", validate_default=True)
    """Offset of the first step from the workload's start."""
    every: Duration | None = None
    """Restart the sequence this often (from its first step's start)."""
    count: PositiveInt | None = None
    """How many times to run it (default 1, or until the workload ends with `every`)."""
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_steps(self) -> SequenceSchedule:
        for index, step in enumerate(self.steps):
            try:
                step._check_step(first=index == 0)
            except FieldError as exc:
                raise FieldError(("steps", index, *exc.loc), exc.message) from None
            if step.when in ("in-sync", "out-of-sync"):
                previous = self.steps[index - 1]
                for loc, selector in previous.selectors():
                    if selector.role == "controller":
                        raise FieldError(
                            ("steps", index, "when"),
                            f"{step.when} needs ISR members, but step {index - 1} "
                            f"{'.'.join(map(str, loc))} is the controller",
                        )
        _check_repeat(self.every, self.count, None)
        return self


class DurationRange(SpecModel):
    """A duration drawn uniformly (in milliseconds) from `min` to `max`."""

    min: Duration
    max: Duration

    @model_validator(mode="after")
    def _ordered(self) -> DurationRange:
        if self.min > self.max:
            raise FieldError(
                ("max",), f"{format_duration(self.max)} is below min {format_duration(self.min)}"
            )
        return self


class RandomSchedule(SpecModel):
    """Faults drawn from the experiment's seed, one at a time: wait a random `interval`,
    inject a random kind on a random target for a random `duration`, recover, repeat.
    partition faults isolate their target."""

    at: Duration = Field("0s", validate_default=True)
    """When the first interval starts."""
    kinds: list[FaultKind] = Field(min_length=1)
    targets: list[TargetSelector] = Field(min_length=1)
    interval: DurationRange
    duration: DurationRange
    count: PositiveInt | None = None
    """How many faults; default: as many as fit before the workload ends."""

    @model_validator(mode="after")
    def _check_pairs(self) -> RandomSchedule:
        if self.interval.min <= 0:
            raise FieldError(
                ("interval", "min"), "must be positive: faults need quiet time between"
            )
        if self.duration.min <= 0:
            raise FieldError(("duration", "min"), "must be positive: a fault that lasts no "
                                                  "time is never injected")
        if "delay" in self.kinds:
            raise FieldError(("kinds", self.kinds.index("delay")), UNDRAWN_DELAY)
        for kind in BROKER_ONLY_KINDS:
            if kind not in self.kinds:
                continue
            for index, selector in enumerate(self.targets):
                if selector.role == "controller":
                    raise FieldError(("targets", index), BROKER_ONLY_KINDS[kind])
        # Each fault draws its kind and its target apart, so every kind must fit every client.
        for index, selector in enumerate(self.targets):
            if selector.client is None:
                continue
            takes = {"partition", "pause"} if selector.producer is not None else {"partition"}
            if not set(self.kinds) <= takes:
                raise FieldError(("targets", index, selector.client_field),
                                 RANDOM_CLIENT_TARGETS)
        return self


class ScheduleEntry(FaultAction):
    """One item of spec.faults, exactly one of three shapes: a fault (`kind`, `target`,
    `duration`, `at`, optionally repeated with `every` and `count`); a `sequence` of steps,
    each waiting for an event of the one before; or a `random` schedule drawn from the
    experiment's seed."""

    model_config = one_of("kind", "sequence", "random")

    at: Duration = Field("0s", validate_default=True)
    """Offset of the first injection from the workload's start."""
    every: Duration | None = None
    """Repeat period; must exceed `duration` so one injection recovers before the next."""
    count: PositiveInt | None = None
    """Number of injections (default 1, or until the workload ends when `every` is set)."""
    sequence: SequenceSchedule | None = None
    random: RandomSchedule | None = None

    @model_validator(mode="after")
    def _check_shape(self) -> ScheduleEntry:
        shapes = [
            name for name in ("kind", "sequence", "random") if getattr(self, name) is not None
        ]
        if len(shapes) != 1:
            found = " and ".join(shapes) if shapes else "none of them"
            raise FieldError(
                (), f"set exactly one of 'kind', 'sequence' or 'random', found {found}"
            )
        if self.kind is None:
            stray = ["at"] if self.at != 0 else []
            stray += [
                n
                for n in ("target", "network", "delay", "duration", "every", "count")
                if getattr(self, n) is not None
            ]
            if stray:
                raise FieldError((stray[0],), f"belongs inside '{shapes[0]}', not next to it")
            return self
        self._check_action()
        _check_repeat(self.every, self.count, self.duration)
        return self


def _check_repeat(every: float | None, count: int | None, duration: float | None) -> None:
    if count is not None and count > 1 and every is None:
        raise FieldError(("count",), f"count {count} needs 'every', the repeat period")
    if every is not None and every <= 0:
        raise FieldError(("every",), "must be positive")
    if every is not None and duration is not None and every <= duration:
        raise FieldError(
            ("every",),
            f"{format_duration(every)} must exceed duration {format_duration(duration)}: "
            "each injection recovers before the next",
        )
