"""Loading experiment files: the library, name references, and one clear error per mistake.

Long (about 930 lines): a test per mistake a user can make in a file, each with the
message it must get, which the loader's one entry point gives."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from undertow.spec import SpecError, load_documents, load_experiment
from undertow.spec.experiment import ChaosExperiment

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
LIBRARY = {
    "acks1-leader-kill": "loss",
    "acksall-leader-kill": "clean",
    "unclean-election": "loss",
    "hw-truncation-double-crash": "loss",
    "epoch-truncation-double-crash": "clean",
    "isolate-leader-acksall": "clean",
    "follower-disk-stall": "clean",
    "leader-pause": "clean",
    "power-loss-no-fsync": "loss",
    "min-isr-rejects-writes": "clean",
    "idempotent-leader-kill": "clean",
    "hw-min-isr-strict": "clean",
    "hw-min-isr-legacy": "loss",
    "pod-delete-ephemeral": "loss",
    "pod-delete-persistent": "clean",
    "disk-full-leader-acksall": "clean",
    "disk-full-sole-isr-acks1": "clean",
    "group-coordinator-kill": "clean",
    "group-coordinator-kill-kip848": "clean",
    "offsets-rf1-coordinator-loss": "loss",
    "consumer-isolated": "clean",
    "consumer-isolated-kip848": "clean",
    "pod-delete-ephemeral-elr": "loss",
    "last-replica-standing-elr": "clean",
    "last-replica-standing-no-elr": "loss",
    "txn-coordinator-kill": "clean",
    "txn-partition-leader-kill": "clean",
    "txn-state-rf1-power-loss": "loss",
    "eos-pipeline-member-kill": "clean",
    "leader-delay-acksall": "clean",
    "producer-pause-txn": "clean",
    "txn-delayed-endtxn-tv1": "anomalies",
    "txn-delayed-endtxn-tv2": "clean",
}


def base_docs() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DATA / "spec-base.yaml").read_text()))


def write(tmp_path: Path, docs: list[Any], name: str = "x.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_library_experiment_loads(name: str) -> None:
    path = REPO / "experiments" / f"{name}.yaml"
    text = path.read_text()
    assert text.startswith("# "), "each file opens with a comment saying what it shows"
    kinds = sorted(d.resource.kind for d in load_documents([path]))
    assert kinds == ["BrokerCluster", "ChaosExperiment"]
    loaded = load_experiment(path)
    spec = loaded.experiment.spec
    assert loaded.experiment.metadata.name == name
    assert spec.expect == LIBRARY[name]
    assert spec.cluster.ref == loaded.cluster.metadata.name
    assert 20 <= spec.workload.duration <= 40
    config = loaded.cluster.spec.config
    # Kafka's order: a dead broker is fenced (and leaves every ISR) before it lags out.
    assert config.broker_session_timeout_ms == 3000
    assert config.replica_lag_time_max_ms > config.broker_session_timeout_ms


def test_library_is_complete() -> None:
    assert {p.stem for p in (REPO / "experiments").glob("*.yaml")} == set(LIBRARY)


def test_idempotent_pair_differs_only_in_idempotence() -> None:
    plain = load_experiment(REPO / "experiments" / "acksall-leader-kill.yaml").experiment.spec
    idem = load_experiment(REPO / "experiments" / "idempotent-leader-kill.yaml").experiment.spec
    assert idem.workload.idempotent and not plain.workload.idempotent
    assert idem.workload.model_copy(update={"idempotent": False}) == plain.workload
    assert idem.faults == plain.faults


@pytest.mark.parametrize("pair", [("pod-delete-ephemeral", "pod-delete-ephemeral-elr"),
                                  ("last-replica-standing-no-elr", "last-replica-standing-elr")])
def test_rule_set_twins_differ_only_in_the_rule_set(pair: tuple[str, str]) -> None:
    """A Kafka 3.7 file and its 4.x twin: the same cluster, workload and faults, only
    eligible.leader.replicas.version apart."""
    old, new = (load_experiment(REPO / "experiments" / f"{name}.yaml") for name in pair)
    assert old.cluster.spec.config.eligible_leader_replicas_version == 0
    assert new.cluster.spec.config.eligible_leader_replicas_version == 1
    assert old.experiment.spec.faults == new.experiment.spec.faults
    assert old.experiment.spec.workload == new.experiment.spec.workload
    assert old.experiment.spec.topic == new.experiment.spec.topic
    exclude = {"eligible_leader_replicas_version"}
    assert old.cluster.spec.config.model_dump(exclude=exclude) == \
        new.cluster.spec.config.model_dump(exclude=exclude)
    assert old.cluster.spec.storage == new.cluster.spec.storage


def test_truncation_pair_differs_only_in_truncation_mode() -> None:
    hw = load_experiment(REPO / "experiments" / "hw-truncation-double-crash.yaml")
    epoch = load_experiment(REPO / "experiments" / "epoch-truncation-double-crash.yaml")
    assert hw.cluster.spec.config.replication_truncation_mode == "high-watermark"
    assert epoch.cluster.spec.config.replication_truncation_mode == "leader-epoch"
    assert hw.experiment.spec.faults == epoch.experiment.spec.faults
    assert hw.experiment.spec.workload == epoch.experiment.spec.workload
    hw_config = hw.cluster.spec.config.model_dump(exclude={"replication_truncation_mode"})
    assert hw_config == epoch.cluster.spec.config.model_dump(
        exclude={"replication_truncation_mode"}
    )


def test_base_resolves_cluster_in_same_file() -> None:
    loaded = load_experiment(DATA / "spec-base.yaml")
    assert loaded.cluster.metadata.name == "three"
    assert loaded.cluster.spec.brokers == 3
    assert loaded.source == loaded.cluster_source == DATA / "spec-base.yaml"
    assert loaded.experiment.spec.faults[1].duration == 1.5


def test_ref_resolved_from_extra_file(tmp_path: Path) -> None:
    cluster, experiment = base_docs()
    exp_path = write(tmp_path, [experiment], "exp.yaml")
    cluster_path = write(tmp_path, [cluster], "cluster.yaml")
    loaded = load_experiment(exp_path, [cluster_path])
    assert loaded.cluster_source == cluster_path
    assert loaded.cluster.spec.config.min_insync_replicas == 2
    with pytest.raises(SpecError) as info:
        load_experiment(exp_path)
    assert str(info.value) == (
        f"{exp_path}: ChaosExperiment/base: spec.cluster.ref: "
        f"no BrokerCluster named 'three' in {exp_path}"
    )


def test_inline_cluster_named_after_experiment() -> None:
    loaded = load_experiment(DATA / "spec-random.yaml")
    assert loaded.cluster.metadata.name == "random"
    assert loaded.cluster.kind == "BrokerCluster"
    assert loaded.cluster.spec.brokers == 3


def test_file_with_two_experiments_needs_a_name(tmp_path: Path) -> None:
    cluster, experiment = base_docs()
    other = copy.deepcopy(experiment)
    other["metadata"]["name"] = "other"
    path = write(tmp_path, [cluster, experiment, other])
    with pytest.raises(SpecError) as info:
        load_experiment(path)
    assert str(info.value) == f"{path}: holds 2 ChaosExperiments (base, other); pick one by name"
    assert load_experiment(path, name="other").experiment.metadata.name == "other"


def test_duplicate_names_across_files(tmp_path: Path) -> None:
    cluster, experiment = base_docs()
    first = write(tmp_path, [cluster, experiment], "a.yaml")
    second = write(tmp_path, [cluster], "b.yaml")
    with pytest.raises(SpecError) as info:
        load_experiment(first, [second])
    assert str(info.value) == (
        f"{second}: BrokerCluster/three: metadata.name: duplicate name, also defined in {first}"
    )


def test_yaml_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    text = (
        (DATA / "spec-base.yaml")
        .read_text()
        .replace("      duration: 2s\n", "      duration: 2s\n      duration: 3s\n")
    )
    path.write_text(text)
    line = text.splitlines().index("      duration: 3s") + 1
    with pytest.raises(SpecError) as info:
        load_documents([path])
    assert str(info.value) == f"{path}: line {line}, column 7: duplicate key 'duration'"


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: ChaosExperiment\nspec: [unclosed\n")
    with pytest.raises(SpecError) as info:
        load_documents([path])
    assert str(info.value).startswith(f"{path}: line 3, column 1: ")


def test_missing_file() -> None:
    with pytest.raises(SpecError) as info:
        load_documents(["/nonexistent/x.yaml"])
    assert str(info.value) == "/nonexistent/x.yaml: No such file or directory"


def test_no_experiment_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, base_docs()[:1])
    with pytest.raises(SpecError) as info:
        load_experiment(path)
    assert str(info.value) == f"{path}: no ChaosExperiment document"


Mutation = Callable[[dict[str, Any], dict[str, Any]], object]


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split("/")
    for part in parents:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    if isinstance(doc, list):
        doc[int(last)] = value
    else:
        doc[last] = value


def exp(dotted: str, value: Any) -> Mutation:
    return lambda cluster, experiment: _set(experiment, dotted, value)


def clu(dotted: str, value: Any) -> Mutation:
    return lambda cluster, experiment: _set(cluster, dotted, value)


def both(*mutations: Mutation) -> Mutation:
    return lambda cluster, experiment: [m(cluster, experiment) for m in mutations]


def at_random(kinds: list[str], targets: list[dict[str, Any]]) -> Mutation:
    """The first fault replaced by a random schedule of `kinds` on `targets`."""
    return exp("spec/faults/0", {"random": {
        "kinds": kinds, "targets": targets, "interval": {"min": "1s", "max": "2s"},
        "duration": {"min": "1s", "max": "2s"}}})


EXP = "ChaosExperiment/base"
CASES: list[tuple[str, Mutation, str, str]] = [
    (
        "bad-duration",
        exp("spec/faults/1/duration", "5q"),
        EXP,
        "spec.faults[1].duration: invalid duration '5q': expected e.g. '500ms', '30s', '1m30s'",
    ),
    (
        "unknown-field",
        exp("spec/workload/producer", 2),
        EXP,
        "spec.workload.producer: unknown field 'producer'; expected one of: producers, consumers, "
        "acks, retries, requestTimeout, rate, recordSize, duration, idempotent, consumer, "
        "transactions, pipeline",
    ),
    (
        "wrong-type",
        exp("spec/topic/partitions", "two"),
        EXP,
        "spec.topic.partitions: expected a valid integer, got 'two'",
    ),
    (
        "bool-is-not-int",
        exp("spec/topic/partitions", True),
        EXP,
        "spec.topic.partitions: expected a valid integer, got True",
    ),
    (
        "broker-out-of-range",
        exp("spec/faults/0/target", {"broker": 5}),
        EXP,
        "spec.faults[0].target.broker: broker 5 does not exist: BrokerCluster/three has "
        "brokers 0..2",
    ),
    (
        "rf-above-brokers",
        exp("spec/topic/replicationFactor", 4),
        EXP,
        "spec.topic.replicationFactor: 4 exceeds the 3 brokers of BrokerCluster/three",
    ),
    (
        "min-isr-above-rf",
        exp("spec/topic/replicationFactor", 1),
        EXP,
        "spec.topic.replicationFactor: min.insync.replicas 2 (from the cluster config) exceeds "
        "replicationFactor 1: no acks=all write could ever succeed",
    ),
    (
        "topic-min-isr-above-rf",
        exp("spec/topic/config", {"min.insync.replicas": 4}),
        EXP,
        'spec.topic.config["min.insync.replicas"]: min.insync.replicas 4 (from the topic config) '
        "exceeds replicationFactor 3: no acks=all write could ever succeed",
    ),
    (
        "all-isr-but-one-rf1",
        both(
            clu("spec/config/min.insync.replicas", 1),
            exp("spec/topic/replicationFactor", 1),
            exp("spec/faults/0/target", {"role": "all-isr-but-one"}),
        ),
        EXP,
        "spec.faults[0].target.role: no all-isr-but-one can exist with replicationFactor 1",
    ),
    (
        "fault-after-workload",
        exp("spec/faults/1/at", "30s"),
        EXP,
        "spec.faults[1].at: starts at 30s, after the workload ends (workload.duration 30s)",
    ),
    (
        "repeat-after-workload",
        both(exp("spec/faults/0/every", "10s"), exp("spec/faults/0/count", 4)),
        EXP,
        "spec.faults[0].count: injection 4 would start at 35s, after the workload ends "
        "(workload.duration 30s)",
    ),
    (
        "every-not-above-duration",
        exp("spec/faults/0/every", "2s"),
        EXP,
        "spec.faults[0].every: 2s must exceed duration 2s: each injection recovers before the next",
    ),
    (
        "count-without-every",
        exp("spec/faults/0/count", 2),
        EXP,
        "spec.faults[0].count: count 2 needs 'every', the repeat period",
    ),
    (
        "fixed-without-value",
        exp("spec/faults/1/target/mode", "fixed"),
        EXP,
        "spec.faults[1].target.value: mode fixed needs a value",
    ),
    (
        "fixed-above-candidates",
        both(exp("spec/faults/1/target/mode", "fixed"), exp("spec/faults/1/target/value", 3)),
        EXP,
        "spec.faults[1].target.value: fixed 3: at most 2 follower candidate(s) with "
        "replicationFactor 3",
    ),
    (
        "percent-above-100",
        both(
            exp("spec/faults/1/target/mode", "fixed-percent"),
            exp("spec/faults/1/target/value", 150),
        ),
        EXP,
        "spec.faults[1].target.value: fixed-percent 150 is above 100",
    ),
    (
        "partition-out-of-range",
        exp("spec/faults/1/target/partition", 2),
        EXP,
        "spec.faults[1].target.partition: topic t has partitions 0..1",
    ),
    (
        "role-and-broker",
        exp("spec/faults/0/target", {"role": "leader", "broker": 1}),
        EXP,
        "spec.faults[0].target: set exactly one of 'role', 'broker', 'consumer' or 'producer'",
    ),
    (
        "mode-on-broker",
        exp("spec/faults/0/target", {"broker": 1, "mode": "all"}),
        EXP,
        "spec.faults[0].target.mode: does not apply to broker 1: it is a single process",
    ),
    (
        "offsets-topic-too-wide",
        both(clu("spec/config/offsets.topic.replication.factor", 4),
             exp("spec/workload/consumer", {"mode": "subscribe"})),
        EXP,
        "spec.workload.consumer.mode: a consumer group needs __consumer_offsets, whose "
        "offsets.topic.replication.factor 4 (in BrokerCluster/three's config) exceeds its 3 "
        "brokers: the topic could never be created",
    ),
    (
        "consumer-not-isolated",
        exp("spec/faults/0/target", {"consumer": 0}),
        EXP,
        "spec.faults[0].target.consumer: a consumer or producer can only be the target of a "
        "partition or delay of mode isolate (its links to every broker cut or slowed) or "
        "one-way (its packets to the `to` broker), and a producer also of a pause (SIGSTOP of "
        "its own process)",
    ),
    (
        "client-one-way-to-the-controller",
        exp("spec/faults/0", {"kind": "delay", "target": {"producer": 0}, "at": "5s",
                              "duration": "1s", "delay": {"latency": "1s"},
                              "network": {"mode": "one-way", "to": {"role": "controller"}}}),
        EXP,
        "spec.faults[0].network.to.role: a client has no link to the controller: only brokers",
    ),
    (
        "client-as-a-far-side",
        exp("spec/faults/0", {"kind": "delay", "target": {"role": "leader"}, "at": "5s",
                              "duration": "1s", "delay": {"latency": "1s"},
                              "network": {"mode": "one-way", "to": {"producer": 0}}}),
        EXP,
        "spec.faults[0].network.to.producer: a consumer or producer can only be the target of "
        "a partition or delay of mode isolate (its links to every broker cut or slowed) or "
        "one-way (its packets to the `to` broker), and a producer also of a pause (SIGSTOP of "
        "its own process)",
    ),
    (
        "producer-not-isolated",
        exp("spec/faults/0/target", {"producer": 0}),
        EXP,
        "spec.faults[0].target.producer: a consumer or producer can only be the target of a "
        "partition or delay of mode isolate (its links to every broker cut or slowed) or "
        "one-way (its packets to the `to` broker), and a producer also of a pause (SIGSTOP of "
        "its own process)",
    ),
    (
        "consumer-paused",
        exp("spec/faults/1/target", {"consumer": 0}),
        EXP,
        "spec.faults[1].target.consumer: a consumer or producer can only be the target of a "
        "partition or delay of mode isolate (its links to every broker cut or slowed) or "
        "one-way (its packets to the `to` broker), and a producer also of a pause (SIGSTOP of "
        "its own process)",
    ),
    (
        "paused-producer-out-of-range",
        exp("spec/faults/1/target", {"producer": 1}),
        EXP,
        "spec.faults[1].target.producer: producer p1 does not exist: the workload has 1 "
        "producer(s)",
    ),
    (
        "consumer-paused-at-random",
        at_random(["partition", "pause"], [{"producer": 0}, {"consumer": 0}]),
        EXP,
        "spec.faults[0].random.targets[1].consumer: a random schedule can only cut a consumer "
        "or producer off (`partition`, which isolates it) or pause a producer (`pause`): every "
        "kind in `kinds` must be one of those for every client among `targets`",
    ),
    (
        "producer-killed-at-random",
        at_random(["pause", "kill"], [{"producer": 0}]),
        EXP,
        "spec.faults[0].random.targets[0].producer: a random schedule can only cut a consumer "
        "or producer off (`partition`, which isolates it) or pause a producer (`pause`): every "
        "kind in `kinds` must be one of those for every client among `targets`",
    ),
    (
        "consumer-pause-explored",
        exp("spec/explore", {"kinds": ["pause"], "targets": [{"consumer": 0}]}),
        EXP,
        "spec.explore.kinds[0]: no target in 'targets' can take a pause: a consumer or "
        "producer can only be the target of a partition or delay of mode isolate (its links "
        "to every broker cut or slowed) or one-way (its packets to the `to` broker), and a "
        "producer also of a pause (SIGSTOP of its own process)",
    ),
    (
        "producer-out-of-range",
        both(exp("spec/faults/0/target", {"producer": 3}), exp("spec/faults/0/kind",
                                                               "partition")),
        EXP,
        "spec.faults[0].target.producer: producer p3 does not exist: the workload has 1 "
        "producer(s)",
    ),
    (
        "producer-with-mode",
        both(exp("spec/faults/0/target", {"producer": 0, "mode": "all"}),
             exp("spec/faults/0/kind", "partition")),
        EXP,
        "spec.faults[0].target.mode: does not apply to producer p0: it is a single process",
    ),
    (
        "consumer-out-of-range",
        both(exp("spec/faults/0/target", {"consumer": 5}), exp("spec/faults/0/kind",
                                                               "partition")),
        EXP,
        "spec.faults[0].target.consumer: consumer c5 does not exist: the workload has 1 "
        "consumer(s)",
    ),
    (
        "coordinator-without-group",
        exp("spec/faults/0/target", {"role": "group-coordinator"}),
        EXP,
        "spec.faults[0].target.role: group-coordinator needs a consumer group "
        "(workload.consumer.mode: subscribe)",
    ),
    (
        "txn-coordinator-without-transactions",
        exp("spec/faults/0/target", {"role": "txn-coordinator"}),
        EXP,
        "spec.faults[0].target.role: txn-coordinator needs transactional producers "
        "(workload.transactions)",
    ),
    (
        "transactions-with-acks-1",
        both(exp("spec/workload/acks", 1), exp("spec/workload/transactions", {})),
        EXP,
        "spec.workload.acks: a transactional producer is idempotent and needs acks all, not 1",
    ),
    (
        "transaction-version-3",
        exp("spec/workload/transactions", {"transactionVersion": 3}),
        EXP,
        "spec.workload.transactions.transactionVersion: expected 1 or 2, got 3",
    ),
    (
        "transaction-version-2-pipeline",
        both(exp("spec/workload/transactions", {"transactionVersion": 2}),
             exp("spec/workload/consumer", {"mode": "subscribe"}),
             exp("spec/workload/pipeline", {})),
        EXP,
        "spec.workload.transactions.transactionVersion: a pipeline's members speak "
        "transaction version 1 (librdkafka's send_offsets_to_transaction); version 2 is "
        "modelled for the transactional producers only",
    ),
    (
        "transaction-version-2-on-a-version-1-cluster",
        both(clu("spec/config/transaction.version", 1),
             exp("spec/workload/transactions", {"transactionVersion": 2})),
        EXP,
        "spec.workload.transactions.transactionVersion: 2 needs the cluster's "
        "transaction.version at 2, and BrokerCluster/three sets it to 1 (a Java 4.x client "
        "would fall back to version 1 there)",
    ),
    (
        "transactions-read-uncommitted",
        both(exp("spec/workload/transactions", {}),
             exp("spec/workload/consumer", {"mode": "subscribe",
                                            "isolationLevel": "read_uncommitted"})),
        EXP,
        "spec.workload.consumer.isolationLevel: with transactions the consumers read "
        "committed: a read_uncommitted one returns aborted records, which the checks would "
        "count as aborted reads",
    ),
    (
        "pipeline-without-transactions",
        exp("spec/workload/pipeline", {}),
        EXP,
        "spec.workload.pipeline: a pipeline's members are transactional: set "
        "workload.transactions (its timeout is theirs)",
    ),
    (
        "pipeline-in-assign-mode",
        both(exp("spec/workload/transactions", {}), exp("spec/workload/pipeline", {})),
        EXP,
        "spec.workload.consumer.mode: a pipeline's members are a consumer group: set it to "
        "subscribe",
    ),
    (
        "pipeline-with-manual-commits",
        both(exp("spec/workload/transactions", {}), exp("spec/workload/pipeline", {}),
             exp("spec/workload/consumer", {"mode": "subscribe", "commit": "manual"})),
        EXP,
        "spec.workload.consumer.commit: a pipeline's members commit their offsets in their "
        "transactions: transaction (the default)",
    ),
    (
        "pipeline-with-rebalances",
        both(exp("spec/workload/transactions", {}), exp("spec/workload/pipeline", {}),
             exp("spec/workload/consumers", 2),
             exp("spec/workload/consumer", {"mode": "subscribe", "rebalanceEvery": "5s"})),
        EXP,
        "spec.workload.consumer.rebalanceEvery: not with a pipeline: its members are replaced "
        "(killEvery)",
    ),
    (
        "consumer-protocol-with-a-member-session",
        exp("spec/workload/consumer", {"mode": "subscribe", "groupProtocol": "consumer",
                                       "sessionTimeout": "3s"}),
        EXP,
        "spec.workload.consumer.sessionTimeout: with groupProtocol consumer the coordinator "
        "keeps the session: set the cluster's group.consumer.session.timeout.ms instead",
    ),
    (
        "consumer-protocol-static-member",
        exp("spec/workload/consumer", {"mode": "subscribe", "groupProtocol": "consumer",
                                       "staticMembership": True}),
        EXP,
        "spec.workload.consumer.staticMembership: minibroker does not serve static members "
        "of the consumer protocol yet (KIP-848's InstanceId)",
    ),
    (
        "group-protocol-in-assign-mode",
        exp("spec/workload/consumer", {"groupProtocol": "consumer"}),
        EXP,
        "spec.workload.consumer.groupProtocol: only consumers of mode subscribe take it",
    ),
    (
        "transaction-commits-without-pipeline",
        exp("spec/workload/consumer", {"mode": "subscribe", "commit": "transaction"}),
        EXP,
        "spec.workload.consumer.commit: transaction commits belong to a pipeline's members: "
        "set workload.pipeline",
    ),
    (
        "pipeline-output-is-its-input",
        both(exp("spec/workload/transactions", {}),
             exp("spec/workload/pipeline", {"outputTopic": "t"}),
             exp("spec/workload/consumer", {"mode": "subscribe"})),
        EXP,
        "spec.workload.pipeline.outputTopic: must differ from topic.name: the pipeline reads "
        "that one",
    ),
    (
        "pipeline-kill-every-zero",
        both(exp("spec/workload/transactions", {}),
             exp("spec/workload/pipeline", {"killEvery": "0s"}),
             exp("spec/workload/consumer", {"mode": "subscribe"})),
        EXP,
        "spec.workload.pipeline.killEvery: must be positive",
    ),
    (
        "transaction-timeout-too-short",
        exp("spec/workload/transactions", {"timeout": "500ms"}),
        EXP,
        "spec.workload.transactions.timeout: must be at least 1s (transaction.timeout.ms)",
    ),
    (
        "abort-ratio-above-one",
        exp("spec/workload/transactions", {"abortRatio": 1.5}),
        EXP,
        "spec.workload.transactions.abortRatio: expected less than or equal to 1, got 1.5",
    ),
    (
        "group-field-in-assign-mode",
        exp("spec/workload/consumer", {"commit": "manual"}),
        EXP,
        "spec.workload.consumer.commit: only consumers of mode subscribe take it",
    ),
    (
        "group-without-members",
        exp("spec/workload", {"consumers": 0, "consumer": {"mode": "subscribe"}}),
        EXP,
        "spec.workload.consumers: a consumer group (consumer.mode subscribe) needs at least "
        "one member",
    ),
    (
        "unknown-role",
        exp("spec/faults/0/target", {"role": "boss"}),
        EXP,
        "spec.faults[0].target.role: expected 'leader', 'follower', 'isr-member', "
        "'all-isr-but-one', 'controller', 'group-coordinator' or 'txn-coordinator', got 'boss'",
    ),
    (
        "pod-delete-controller",
        both(
            exp("spec/faults/0/kind", "pod-delete"),
            exp("spec/faults/0/target", {"role": "controller"}),
        ),
        EXP,
        "spec.faults[0].target: pod-delete hits broker pods only (the controller's metadata "
        "is not a fault target)",
    ),
    (
        "grace-period-not-kill-or-pod-delete",
        both(exp("spec/faults/0/kind", "pause"), exp("spec/faults/0/gracePeriod", "5s")),
        EXP,
        "spec.faults[0].gracePeriod: only kill and pod-delete faults take 'gracePeriod', "
        "not pause",
    ),
    (
        "grace-period-on-a-sequence-step-not-kill-or-pod-delete",
        exp("spec/faults/0", {"sequence": {"steps": [
            {"kind": "kill", "target": {"role": "leader"}, "duration": "1s",
             "gracePeriod": "2s"},
            {"when": "recovered", "kind": "disk-stall", "target": {"role": "leader"},
             "duration": "1s", "gracePeriod": "2s"}]}}),
        EXP,
        "spec.faults[0].sequence.steps[1].gracePeriod: only kill and pod-delete faults take "
        "'gracePeriod', not disk-stall",
    ),
    (
        "kill-grace-period-above-the-agents-bound",
        exp("spec/faults/0/gracePeriod", "301s"),
        EXP,
        "spec.faults[0].gracePeriod: 5m1s is above 5m, the longest a kill waits for a clean "
        "shutdown",
    ),
    (
        "disk-stall-controller",
        both(
            exp("spec/faults/0/kind", "disk-stall"),
            exp("spec/faults/0/target", {"role": "controller"}),
        ),
        EXP,
        "spec.faults[0].target: disk-stall is a broker failpoint; the controller has none",
    ),
    (
        "network-on-kill",
        exp("spec/faults/0/network", {"mode": "isolate"}),
        EXP,
        "spec.faults[0].network: only partition and delay faults take 'network', not kill",
    ),
    (
        "delay-without-its-delay",
        exp("spec/faults/0/kind", "delay"),
        EXP,
        "spec.faults[0].delay: required: how late the packets arrive, e.g. {latency: 100ms, "
        "jitter: 20ms}",
    ),
    (
        "delay-on-kill",
        exp("spec/faults/0/delay", {"latency": "100ms"}),
        EXP,
        "spec.faults[0].delay: only delay faults take 'delay', not kill",
    ),
    (
        "delay-jitter-above-latency",
        both(exp("spec/faults/0/kind", "delay"),
             exp("spec/faults/0/delay", {"latency": "10ms", "jitter": "20ms"})),
        EXP,
        "spec.faults[0].delay.jitter: 20ms is above the latency 10ms: a packet would arrive "
        "before it was sent",
    ),
    (
        "delay-correlation-above-100",
        both(exp("spec/faults/0/kind", "delay"),
             exp("spec/faults/0/delay", {"latency": "10ms", "correlation": 150})),
        EXP,
        "spec.faults[0].delay.correlation: expected less than or equal to 100, got 150",
    ),
    (
        "random-delay",
        exp(
            "spec/faults/0",
            {
                "random": {
                    "kinds": ["kill", "delay"],
                    "targets": [{"role": "leader"}],
                    "interval": {"min": "1s", "max": "2s"},
                    "duration": {"min": "1s", "max": "2s"},
                },
            },
        ),
        EXP,
        "spec.faults[0].random.kinds[1]: delays are not drawn at random yet (their latency "
        "has no range to draw from): give each delay as a fault of its own, with its `delay` "
        "block",
    ),
    (
        "split-with-target",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp(
                "spec/faults/0/network",
                {"mode": "split", "groups": [[{"role": "leader"}], [{"role": "follower"}]]},
            ),
        ),
        EXP,
        "spec.faults[0].target: a split partition takes its groups, not a target",
    ),
    (
        "split-one-group",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp("spec/faults/0/network", {"mode": "one-way"}),
        ),
        EXP,
        "spec.faults[0].network.to: a one-way partition needs 'to', the far side",
    ),
    (
        "split-group-broker",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp("spec/faults/0/target", None),
            exp(
                "spec/faults/0/network",
                {"mode": "split", "groups": [[{"role": "leader"}], [{"broker": 0}, {"broker": 9}]]},
            ),
        ),
        EXP,
        "spec.faults[0].network.groups[1][1].broker: broker 9 does not exist: "
        "BrokerCluster/three has brokers 0..2",
    ),
    (
        "partition-mode-unknown",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp("spec/faults/0/network", {"mode": "sideways"}),
        ),
        EXP,
        "spec.faults[0].network.mode: expected 'isolate', 'split' or 'one-way', got 'sideways'",
    ),
    (
        "to-on-isolate",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp("spec/faults/0/network", {"mode": "isolate", "to": {"role": "follower"}}),
        ),
        EXP,
        "spec.faults[0].network.to: only one-way partitions take 'to', not isolate",
    ),
    (
        "groups-on-one-way",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp(
                "spec/faults/0/network",
                {"mode": "one-way", "to": {"role": "follower"},
                 "groups": [[{"role": "leader"}], [{"role": "follower"}]]},
            ),
        ),
        EXP,
        "spec.faults[0].network.groups: only split partitions take 'groups', not one-way",
    ),
    (
        "split-needs-two-groups",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp("spec/faults/0/target", None),
            exp("spec/faults/0/network", {"mode": "split", "groups": [[{"role": "leader"}]]}),
        ),
        EXP,
        "spec.faults[0].network.groups: a split needs at least two groups",
    ),
    (
        "split-empty-group",
        both(
            exp("spec/faults/0/kind", "partition"),
            exp("spec/faults/0/target", None),
            exp("spec/faults/0/network", {"mode": "split", "groups": [[{"role": "leader"}], []]}),
        ),
        EXP,
        "spec.faults[0].network.groups[1]: a group needs at least one selector",
    ),
    (
        "grace-period-negative",
        both(exp("spec/faults/0/kind", "pod-delete"), exp("spec/faults/0/gracePeriod", -1)),
        EXP,
        "spec.faults[0].gracePeriod: invalid duration -1: must not be negative",
    ),
    (
        "zero-duration",
        exp("spec/faults/0/duration", "0s"),
        EXP,
        "spec.faults[0].duration: must be positive: a kill that lasts no time is never injected",
    ),
    (
        "power-loss-on-the-controller",
        both(exp("spec/faults/0/kind", "power-loss"),
             exp("spec/faults/0/target", {"role": "controller"})),
        EXP,
        "spec.faults[0].target: power-loss is a broker failpoint; the controller has none",
    ),
    (
        "random-zero-duration",
        exp(
            "spec/faults/0",
            {
                "random": {
                    "kinds": ["kill"],
                    "targets": [{"role": "leader"}],
                    "interval": {"min": "1s", "max": "2s"},
                    "duration": {"min": "0s", "max": "2s"},
                },
            },
        ),
        EXP,
        "spec.faults[0].random.duration.min: must be positive: a fault that lasts no time is "
        "never injected",
    ),
    (
        "missing-duration",
        exp("spec/faults/0/duration", None),
        EXP,
        "spec.faults[0].duration: required: how long the kill lasts",
    ),
    (
        "two-shapes",
        exp(
            "spec/faults/0/random",
            {
                "kinds": ["kill"],
                "targets": [{"role": "leader"}],
                "interval": {"min": "1s", "max": "2s"},
                "duration": {"min": "1s", "max": "2s"},
            },
        ),
        EXP,
        "spec.faults[0]: set exactly one of 'kind', 'sequence' or 'random', found kind and random",
    ),
    (
        "key-next-to-sequence",
        exp(
            "spec/faults/0",
            {
                "at": "1s",
                "sequence": {
                    "steps": [{"kind": "kill", "target": {"role": "leader"}, "duration": "1s"}]
                },
            },
        ),
        EXP,
        "spec.faults[0].at: belongs inside 'sequence', not next to it",
    ),
    (
        "step-without-when",
        exp(
            "spec/faults/0",
            {
                "sequence": {
                    "steps": [
                        {"kind": "kill", "target": {"role": "follower"}, "duration": "1s"},
                        {"kind": "kill", "target": {"role": "leader"}, "duration": "1s"},
                    ]
                }
            },
        ),
        EXP,
        "spec.faults[0].sequence.steps[1].when: required: the event of the previous step to "
        "wait for",
    ),
    (
        "first-step-with-when",
        exp(
            "spec/faults/0",
            {
                "sequence": {
                    "steps": [
                        {
                            "when": "recovered",
                            "kind": "kill",
                            "target": {"role": "follower"},
                            "duration": "1s",
                        }
                    ]
                }
            },
        ),
        EXP,
        "spec.faults[0].sequence.steps[0].when: the first step starts at the sequence's 'at'",
    ),
    (
        "in-sync-after-controller",
        exp(
            "spec/faults/0",
            {
                "sequence": {
                    "steps": [
                        {"kind": "pause", "target": {"role": "controller"}, "duration": "1s"},
                        {
                            "when": "in-sync",
                            "kind": "kill",
                            "target": {"role": "leader"},
                            "duration": "1s",
                        },
                    ]
                }
            },
        ),
        EXP,
        "spec.faults[0].sequence.steps[1].when: in-sync needs ISR members, but step 0 "
        "target is the controller",
    ),
    (
        "sequence-step-broker",
        exp(
            "spec/faults/0",
            {
                "sequence": {
                    "steps": [
                        {"kind": "kill", "target": {"role": "follower"}, "duration": "1s"},
                        {
                            "when": "recovered",
                            "kind": "kill",
                            "target": {"broker": 3},
                            "duration": "1s",
                        },
                    ]
                }
            },
        ),
        EXP,
        "spec.faults[0].sequence.steps[1].target.broker: broker 3 does not exist: "
        "BrokerCluster/three has brokers 0..2",
    ),
    (
        "random-range",
        exp(
            "spec/faults/0",
            {
                "random": {
                    "kinds": ["kill"],
                    "targets": [{"role": "leader"}],
                    "interval": {"min": "3s", "max": "2s"},
                    "duration": {"min": "1s", "max": "2s"},
                }
            },
        ),
        EXP,
        "spec.faults[0].random.interval.max: 2s is below min 3s",
    ),
    (
        "mapping-expected",
        exp("spec/workload", list(range(30))),
        EXP,
        "spec.workload: expected a mapping, got [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
        "15, 16...",
    ),
    (
        "list-expected",
        exp("spec/faults", {"kind": "kill"}),
        EXP,
        "spec.faults: expected a list, got {'kind': 'kill'}",
    ),
    (
        "random-zero-interval",
        exp(
            "spec/faults/0",
            {
                "random": {
                    "kinds": ["kill"],
                    "targets": [{"role": "leader"}],
                    "interval": {"min": 0, "max": "2s"},
                    "duration": {"min": "1s", "max": "2s"},
                }
            },
        ),
        EXP,
        "spec.faults[0].random.interval.min: must be positive: faults need quiet time between",
    ),
    (
        "random-target-broker",
        exp(
            "spec/faults/0",
            {
                "random": {
                    "kinds": ["kill"],
                    "targets": [{"role": "leader"}, {"broker": 7}],
                    "interval": {"min": "1s", "max": "2s"},
                    "duration": {"min": "1s", "max": "2s"},
                }
            },
        ),
        EXP,
        "spec.faults[0].random.targets[1].broker: broker 7 does not exist: BrokerCluster/three "
        "has brokers 0..2",
    ),
    (
        "acks-bool",
        exp("spec/workload/acks", True),
        EXP,
        "spec.workload.acks: invalid acks True: expected 0, 1 or all",
    ),
    (
        "acks-string-1",
        exp("spec/workload/acks", "1"),
        EXP,
        "spec.workload.acks: invalid acks '1': expected 0, 1 or all",
    ),
    (
        "idempotent-acks1",
        both(exp("spec/workload/acks", 1), exp("spec/workload/idempotent", True)),
        EXP,
        "spec.workload.idempotent: an idempotent producer needs acks all, not 1",
    ),
    (
        "zero-workload",
        exp("spec/workload/duration", 0),
        EXP,
        "spec.workload.duration: must be positive",
    ),
    (
        "ref-and-inline",
        exp("spec/cluster/inline", {"brokers": 3}),
        EXP,
        "spec.cluster: set exactly one of 'ref' or 'inline'",
    ),
    (
        "inline-too-small",
        exp("spec/cluster", {"inline": {"brokers": 1}}),
        EXP,
        "spec.topic.replicationFactor: 3 exceeds the 1 brokers of the inline cluster",
    ),
    ("missing-expect", exp("spec/expect", None), EXP, "spec.expect: required"),
    (
        "bad-expect",
        exp("spec/expect", "fine"),
        EXP,
        "spec.expect: expected 'clean', 'anomalies' or 'loss', got 'fine'",
    ),
    (
        "bad-topic-name",
        exp("spec/topic/name", "a b"),
        EXP,
        "spec.topic.name: string should match pattern '^[a-zA-Z0-9._-]+$', got 'a b'",
    ),
    (
        "bad-name",
        exp("metadata/name", "Base_1"),
        "ChaosExperiment/Base_1",
        "metadata.name: invalid name 'Base_1': a DNS-1123 label is at most 63 lowercase "
        "letters, digits and '-', starting and ending with a letter or digit",
    ),
    (
        "missing-name",
        exp("metadata", {}),
        "ChaosExperiment (document 2)",
        "metadata.name: required",
    ),
    (
        "wrong-api-version",
        exp("apiVersion", "undertow.dev/v1"),
        EXP,
        "apiVersion: unsupported apiVersion 'undertow.dev/v1'; expected undertow.dev/v1alpha1",
    ),
    (
        "unknown-kind",
        exp("kind", "Deployment"),
        "document 2",
        "kind: unsupported kind 'Deployment'; expected one of: BrokerCluster, ChaosExperiment",
    ),
    (
        "config-unknown-key",
        clu("spec/config/min.isr", 2),
        "BrokerCluster/three",
        "spec.config[\"min.isr\"]: unknown broker config key 'min.isr'; known keys: "
        "min.insync.replicas, unclean.leader.election.enable, replication.truncation.mode, "
        "high.watermark.min.isr.rule, log.flush.interval.messages, log.flush.interval.ms, "
        "eligible.leader.replicas.version, transaction.version, replica.lag.time.max.ms, "
        "broker.session.timeout.ms, "
        "broker.heartbeat.interval.ms, "
        "leader.imbalance.check.interval.ms, replica.fetch.wait.max.ms, "
        "replica.fetch.min.bytes, replica.high.watermark.checkpoint.interval.ms, segment.bytes, "
        "offsets.topic.replication.factor, offsets.topic.num.partitions, "
        "offsets.commit.required.acks, group.initial.rebalance.delay.ms, "
        "group.min.session.timeout.ms, group.max.session.timeout.ms, "
        "group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms, "
        "group.consumer.min.session.timeout.ms, group.consumer.max.session.timeout.ms, "
        "group.consumer.min.heartbeat.interval.ms, group.consumer.max.heartbeat.interval.ms, "
        "transaction.state.log.replication.factor, transaction.state.log.min.isr, "
        "transaction.state.log.num.partitions, "
        "transaction.abort.timed.out.transaction.cleanup.interval.ms, "
        "transaction.partition.verification.enable",
    ),
    (
        "config-bool-string",
        clu("spec/config/unclean.leader.election.enable", "yes"),
        "BrokerCluster/three",
        "spec.config[\"unclean.leader.election.enable\"]: expected a valid boolean, got 'yes'",
    ),
    (
        "config-truncation-mode",
        clu("spec/config/replication.truncation.mode", "epoch"),
        "BrokerCluster/three",
        "spec.config[\"replication.truncation.mode\"]: expected 'leader-epoch' or "
        "'high-watermark', got 'epoch'",
    ),
    (
        "config-zero",
        clu("spec/config/replica.lag.time.max.ms", 0),
        "BrokerCluster/three",
        'spec.config["replica.lag.time.max.ms"]: expected greater than or equal to 1, got 0',
    ),
    (
        "broker-key-in-topic",
        exp("spec/topic/config", {"broker.session.timeout.ms": 3000}),
        EXP,
        "spec.topic.config[\"broker.session.timeout.ms\"]: 'broker.session.timeout.ms' is a "
        "broker config, not a topic config; set it in the BrokerCluster",
    ),
    (
        "bad-quantity",
        clu("spec/resources", {"limits": {"memory": "lots"}}),
        "BrokerCluster/three",
        "spec.resources.limits.memory: invalid quantity 'lots': expected e.g. '500m', '1Gi', '2'",
    ),
    (
        "zero-brokers",
        clu("spec/brokers", 0),
        "BrokerCluster/three",
        "spec.brokers: expected greater than or equal to 1, got 0",
    ),
    (
        "two-errors",
        both(exp("spec/topic/partitions", "x"), exp("spec/workload/rate", "y")),
        EXP,
        "spec.topic.partitions: expected a valid integer, got 'x' (and 1 more error)",
    ),
]


@pytest.mark.parametrize(
    ("mutation", "document", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_one_clear_error(tmp_path: Path, mutation: Mutation, document: str, message: str) -> None:
    cluster, experiment = base_docs()
    mutation(cluster, experiment)
    for doc in (cluster, experiment):
        _drop_none(doc)
    path = write(tmp_path, [cluster, experiment])
    with pytest.raises(SpecError) as info:
        load_experiment(path)
    assert str(info.value) == f"{path}: {document}: {message}"
    assert info.value.source == str(path)
    assert info.value.document == document


def _drop_none(node: Any) -> None:
    """A mutation to None deletes the key, so cases can test a missing field."""
    if isinstance(node, dict):
        for key in [k for k, v in node.items() if v is None]:
            del node[key]
        for value in node.values():
            _drop_none(value)
    elif isinstance(node, list):
        for value in node:
            _drop_none(value)


def test_a_pipeline_s_defaults(tmp_path: Path) -> None:
    """Its output topic is the topic's name with `-out`; its members commit in their
    transactions."""
    docs = base_docs()
    workload = docs[1]["spec"]["workload"]
    workload.update(transactions={}, pipeline={}, consumer={"mode": "subscribe"})
    loaded = load_experiment(write(tmp_path, docs))
    spec = loaded.experiment.spec
    assert (spec.workload.pipeline.output_topic, spec.workload.consumer.commit) == (
        "t-out", "transaction")


def test_plan_says_when_the_workload_kills_pipeline_members(tmp_path: Path, capsys) -> None:
    from undertow.cli import main

    docs = base_docs()
    docs[1]["spec"]["workload"].update(transactions={}, pipeline={"killEvery": "4s"},
                                       consumer={"mode": "subscribe"})
    assert main(["plan", str(write(tmp_path, docs)), "--seed", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["pipeline_kills"] == (
        "every 4s from the workload's start, a pipeline member in turn, SIGKILLed "
        "mid-transaction")


def test_a_producer_may_be_paused_and_runs_as_a_process_of_its_own(tmp_path: Path) -> None:
    """`pause` takes `{producer: N}` as its target (in a sequence too): the producer is one
    the runner starts as a process of its own, and it needs no links of its own (a client
    a partition or delay isolates does)."""
    docs = base_docs()
    spec = docs[1]["spec"]
    spec["workload"]["producers"] = 2
    spec["faults"][1]["target"] = {"producer": 1}
    spec["faults"].append({"sequence": {"at": "12s", "steps": [
        {"kind": "partition", "target": {"producer": 0}, "duration": "1s"},
        {"kind": "pause", "target": {"producer": 0}, "when": "recovered", "duration": "1s"}]}})
    loaded = load_experiment(write(tmp_path, docs)).experiment.spec
    assert loaded.paused_clients() == ("p0", "p1")
    assert loaded.own_link_clients() == ("p0",)


def test_a_producer_may_be_paused_at_random_and_explored(tmp_path: Path) -> None:
    """Random schedules and `undertow explore` are drawn in simulation, which holds a paused
    producer's client model as a paused node's code: a random schedule may pause a producer
    (and cut it off), and an exploration may draw a producer's pause."""
    docs = base_docs()
    spec = docs[1]["spec"]
    at_random(["partition", "pause"], [{"producer": 0}, {"role": "leader"}])(*docs)
    spec["explore"] = {"kinds": ["pause"], "targets": [{"producer": 0}]}
    loaded = load_experiment(write(tmp_path, docs)).experiment.spec
    assert loaded.paused_clients() == ("p0",)
    assert loaded.own_link_clients() == ("p0",)


def test_a_client_s_packets_to_one_broker_may_be_delayed(tmp_path: Path) -> None:
    """A delay (or a partition) of mode one-way from `{producer: N}` to a broker selector
    slows that client's packets to that broker alone, on links of its own."""
    docs = base_docs()
    docs[1]["spec"]["faults"][0] = {
        "kind": "delay", "target": {"producer": 0}, "at": "5s", "duration": "1s",
        "network": {"mode": "one-way", "to": {"role": "leader"}},
        "delay": {"latency": "3s"}}
    spec = load_experiment(write(tmp_path, docs)).experiment.spec
    assert spec.own_link_clients() == ("p0",)


def test_parse_of_api_object_uses_model_defaults() -> None:
    _, experiment = base_docs()
    resource = ChaosExperiment.model_validate(experiment)
    assert resource.spec.workload.request_timeout == 5.0
    assert resource.spec.workload.retries == 3
    assert resource.spec.faults[0].target is not None
    assert resource.spec.faults[0].target.mode == "one"
