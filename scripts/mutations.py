"""The mutation check: each named mutation breaks one rule the project depends on, and the
tests of that rule's area must fail on it (the mutation is *killed*); one that survives
means a rule no fast test holds.

Each mutation replaces one exact piece of a file (found once, or the check fails: the code
moved and the mutation must follow it). It is applied to a copy of the committed tree
(``git archive HEAD``), never to the working tree, and the copy's packages come first on
the path of the tests run there. First the tests of every area run once on the copy
unmutated (they must pass, or nothing is learned), then each mutation's tests run on it.

    .venv/bin/python scripts/mutations.py            # every mutation
    .venv/bin/python scripts/mutations.py NAME ...   # some of them
    .venv/bin/python scripts/mutations.py --list

Named mutations written by hand rather than a generator from PyPI (mutmut, cosmic-ray): a
generator mutates every operator of a module, thousands of mutants for the files above, each
needing its area's tests (2-4 s, a Spark one 15-17 s), so hours a run and no place in CI, and
most survivors would be equivalent mutants to sort by hand. Each mutation here breaks a rule
a Kafka reviewer names (the election order, the high watermark, fencing, what counts as
lost), and all of them run in about 3 minutes, in `.ci/run`.

Exit status 0 when every mutation chosen is killed. A mutation no input can tell apart
is not listed: forgetting the fetch session's high watermark on an error answer
(``CachedPartition``) changes nothing, since an error answer carries a high watermark of -1
in Kafka and here alike, which the comparison already remembers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("broker-image", "operator", "analysis")
TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    """pytest arguments: files, node ids or ``-k`` expressions, relative to the root."""


PARTITION_CHANGE = "broker-image/minibroker/controller/partition_change.py"
PARTITION = "broker-image/minibroker/cluster/partition.py"
QUORUM_CONTROLLER = "broker-image/minibroker/controller/quorum_controller.py"
GROUP_LOAD = "broker-image/minibroker/coordinator/group_metadata_manager.py"
CURRENT_ASSIGNMENT = "broker-image/minibroker/coordinator/consumer/current_assignment_builder.py"
CONSUMER_GROUP_MANAGER = "broker-image/minibroker/coordinator/consumer/group_manager.py"
CONSUMER_GROUP_TESTS = ("tests/minibroker/test_consumer_group_heartbeat.py",
                        "tests/minibroker/test_consumer_reconciliation.py")
FETCH_SESSION = "broker-image/minibroker/network/fetch_session.py"
ANOMALIES = "analysis/undertow_analysis/anomalies.py"
CHECKER = "analysis/undertow_history/checker.py"
UNIFORM = "broker-image/minibroker/coordinator/consumer/uniform_assignor.py"
UNIFORM_HETEROGENEOUS = "broker-image/minibroker/coordinator/consumer/uniform_heterogeneous.py"
RANGE = "broker-image/minibroker/coordinator/consumer/range_assignor.py"
ASSIGNOR_TESTS = ("tests/minibroker/test_consumer_assignors.py",)
STREAMS = "operator/undertow/sim/virtual_streams.py"
VIRTUAL_LOOP = "operator/undertow/sim/virtual_loop.py"
TXN_COORDINATOR = "broker-image/minibroker/coordinator/transaction_coordinator.py"
TXN_METADATA = "broker-image/minibroker/coordinator/transaction_metadata.py"
PRODUCER_STATE = "broker-image/minibroker/storage/producer_state.py"
LATE_REQUESTS = "analysis/undertow_analysis/late_requests.py"
REPLICA_MANAGER = "broker-image/minibroker/cluster/replica_manager.py"
LOG_MANAGER = "broker-image/minibroker/storage/log_manager.py"
CONFIG_APIS = "broker-image/minibroker/network/config_apis.py"
DELETION_TESTS = ("tests/minibroker/test_topic_and_group_deletion.py",)
LATE_TESTS = ("tests/analysis/test_late_requests.py", "-k", "not report")
ELR_TESTS = ("tests/minibroker/test_elr.py",)
CHECKER_TESTS = ("tests/analysis/test_checker.py", "-k", "alone or still_lost or clean_history")
SPARK_CHECKS = ("tests/analysis/test_analysis_checks.py",)
CONSUMPTION = "analysis/undertow_analysis/consumption.py"
CONSUMER_MEMBER = "operator/undertow/sim/consumer_member.py"
CONSUMER_MEMBER_TESTS = ("tests/sim/test_consumer_member.py", "-k", "not new_leader")
GROUP_MEMBER = "operator/undertow/sim/group_member.py"
GROUP_MEMBER_TESTS = ("tests/sim/test_group_member.py", "-k", "cut_off or rejoining")

MUTATIONS = (
    # The election order (Kafka's PartitionChangeBuilder).
    Mutation("unclean-before-last-known-leader", PARTITION_CHANGE,
             """        elif (elr_enabled and not isr and not elr and len(reg.last_known_elr) == 1
              and is_acceptable_leader(reg.last_known_elr[0])):
            leader, election = reg.last_known_elr[0], Election.LAST_KNOWN_LEADER
        elif unclean_enabled:
            leader = next((r for r in reg.replicas if is_acceptable_leader(r)), NO_LEADER)
            election = Election.UNCLEAN if leader != NO_LEADER else None
""", """        elif unclean_enabled:
            leader = next((r for r in reg.replicas if is_acceptable_leader(r)), NO_LEADER)
            election = Election.UNCLEAN if leader != NO_LEADER else None
        elif (elr_enabled and not isr and not elr and len(reg.last_known_elr) == 1
              and is_acceptable_leader(reg.last_known_elr[0])):
            leader, election = reg.last_known_elr[0], Election.LAST_KNOWN_LEADER
""", ELR_TESTS),
    Mutation("elr-member-while-isr-non-empty", PARTITION_CHANGE,
             "(replica in isr or (not isr and replica in elr))",
             "(replica in isr or replica in elr)", ELR_TESTS),
    Mutation("elr-never-elected", PARTITION_CHANGE,
             "(replica in isr or (not isr and replica in elr))", "(replica in isr)", ELR_TESTS),
    Mutation("unclean-without-the-config", PARTITION_CHANGE,
             "        elif unclean_enabled:\n", "        elif True:\n", ELR_TESTS),
    Mutation("last-known-leader-while-fenced", PARTITION_CHANGE,
             "              and is_acceptable_leader(reg.last_known_elr[0])):",
             "              ):", ELR_TESTS),
    # KIP-704: an unclean election marks the partition RECOVERING; the controller keeps a
    # recovering ISR to its leader.
    Mutation("an-unclean-election-leaves-the-partition-recovered", PARTITION_CHANGE,
             "        recovery = LeaderRecoveryState.RECOVERING\n", "        pass\n",
             ("tests/minibroker/test_leader_recovery.py",)),
    Mutation("a-recovering-isr-may-grow", QUORUM_CONTROLLER,
             "        if recovering and len(new_isr) > 1:", "        if False:",
             ("tests/minibroker/test_leader_recovery.py",)),
    Mutation("elr-kept-after-unclean-election", PARTITION_CHANGE,
             "if not elr_enabled or election in (Election.UNCLEAN, Election.LAST_KNOWN_LEADER):",
             "if not elr_enabled:", ELR_TESTS),
    Mutation("a-no-op-min-isr-change-clears-the-elr", QUORUM_CONTROLLER,
             'config.get("min.insync.replicas") != topic_min_isr',
             '"min.insync.replicas" in changes', ELR_TESTS),
    Mutation("elr-at-min-isr", PARTITION_CHANGE,
             "        if len(isr) >= min_isr:\n", "        if len(isr) > min_isr:\n", ELR_TESTS),
    Mutation("unclean-shutdown-stays-eligible", PARTITION_CHANGE,
             "\n                           - set(unclean_shutdown))", ")", ELR_TESTS),
    # The leader's high watermark (Kafka's Partition.maybeIncrementLeaderHW).
    Mutation("hw-past-a-lagging-isr-member", PARTITION,
             "            if replica.log_end_offset < new_hw and (replica.broker_id in maximal_isr"
             " or joining):",
             "            if replica.log_end_offset < new_hw and joining:",
             ("tests/minibroker/test_replication_rules.py",)),
    Mutation("hw-under-min-isr", PARTITION,
             ' == "strict" and self.is_under_min_isr:\n',
             ' == "strict" and False:\n', ("tests/minibroker/test_replication_rules.py",)),
    # The group coordinator's load (Kafka's GroupMetadataManager.doLoadGroupsAndOffsets).
    Mutation("first-committed-offset-wins-on-load", GROUP_LOAD,
             "                    offsets[where] = cached\n                elif",
             "                    offsets.setdefault(where, cached)\n                elif",
             ("tests/minibroker/test_group_failover.py", "-k", "restarted")),
    Mutation("aborted-transaction-offsets-loaded", GROUP_LOAD,
             "            if marker.is_abort:\n                return\n",
             "", ("tests/minibroker/test_txn_offsets.py",)),
    # Incremental fetch sessions (KIP-227, Kafka's CachedPartition).
    Mutation("incremental-answer-drops-records", FETCH_SESSION,
             "        respond = bool(result.records)", "        respond = False",
             ("tests/minibroker/test_fetch_sessions.py",)),
    Mutation("a-young-session-evicted", FETCH_SESSION,
             "        if now_ms - oldest.last_used_ms > self.eviction_ms:",
             "        if True:", ("tests/minibroker/test_fetch_sessions.py",)),
    Mutation("a-wrong-session-epoch-served", FETCH_SESSION,
             "        if session.epoch != epoch:", "        if False:",
             ("tests/minibroker/test_fetch_sessions.py",)),
    Mutation("log-start-change-not-answered", FETCH_SESSION,
             "        if result.log_start_offset != self.log_start_offset:",
             "        if False:", ("tests/minibroker/test_fetch_sessions.py",)),
    # The anomaly definitions: the Spark job's and the plain checker's.
    Mutation("spark-read-during-run-not-lost", ANOMALIES,
             "    return _acked(v) & ~_drained(v)\n",
             "    return _acked(v) & ~_drained(v) & ~_known(v.run_read_at)\n", SPARK_CHECKS),
    Mutation("spark-duplicate-needs-three", ANOMALIES,
             "    return v.n_drained > 1\n", "    return v.n_drained > 2\n", SPARK_CHECKS),
    Mutation("spark-phantom-read-of-acked-ignored", ANOMALIES,
             "    return _known(v.run_read_at) & ~_drained(v)\n",
             "    return _known(v.run_read_at) & ~_drained(v) & ~_acked(v)\n", SPARK_CHECKS),
    Mutation("checker-read-during-run-not-lost", CHECKER,
             '        if outcome == "acked" and not n_drained:',
             '        if outcome == "acked" and not n_drained and not run_read:', CHECKER_TESTS),
    Mutation("checker-misplaced-never", CHECKER,
             "and not (s.acked_at & drained):", "and False:", CHECKER_TESTS),
    Mutation("checker-duplicate-needs-three", CHECKER,
             "        if n_drained > 1:\n", "        if n_drained > 2:\n", CHECKER_TESTS),
    Mutation("checker-aborted-read-drain-only", CHECKER,
             'if outcome == "failed" and (run_read or n_drained):',
             'if outcome == "failed" and n_drained and False:', CHECKER_TESTS),
    # The transaction coordinator (Kafka's TransactionCoordinator).
    Mutation("a-fenced-epoch-adds-partitions", TXN_COORDINATOR,
             "        if metadata.producer_epoch != producer_epoch:\n"
             "            return ErrorCode.producer_fenced\n", "",
             ("tests/minibroker/test_txn_coordinator.py",)),
    # The late EndTxn requests (Jepsen 2024; KIP-890): which transaction a request landed
    # in, and which sent it.
    Mutation("an-own-end-txn-is-late", LATE_REQUESTS,
             'landed["t_end_invoke"] is not None and landed["t_end_invoke"] <= end["t"]',
             'landed["t_end_invoke"] is None', LATE_TESTS),
    Mutation("the-epoch-does-not-name-the-sender", LATE_REQUESTS,
             'end["transaction_version"] is not None and end["transaction_version"] >= 2',
             "False", LATE_TESTS),
    # Kafka 4.3's fixes at the end of a producer id's epochs (KAFKA-20310, KAFKA-20090).
    Mutation("the-log-forgets-the-next-producer-id", TXN_METADATA,
             "                                   next_producer_id=self.next_producer_id,\n",
             "", ("tests/minibroker/test_txn_version_2.py", "-k", "keeps_the_next_producer_id")),
    Mutation("a-fenced-abort-keeps-an-exhausted-id", TXN_COORDINATOR,
             "        if metadata.is_producer_epoch_exhausted:\n",
             "        if not epoch_fence and metadata.is_producer_epoch_exhausted:\n",
             ("tests/minibroker/test_txn_version_2.py", "-k", "timed_out_at_an_exhausted")),
    Mutation("a-marker-at-the-largest-epoch-is-refused", PRODUCER_STATE,
             "\n                               or producer_epoch == _MAX_PRODUCER_EPOCH)", ")",
             ("tests/minibroker/test_transactional_log.py", "-k", "largest_epoch")),
    Mutation("a-late-end-txn-leaves-no-event", TXN_COORDINATOR,
             "            if outcome is not None:\n"
             "                self._emit_end_txn(arrived, outcome)\n",
             "", ("tests/minibroker/test_txn_version_2.py",)),
    # The admin APIs (Kafka's ControllerApis, ReplicationControlManager, ConfigHelper,
    # GroupCoordinatorService.deleteGroups).
    Mutation("a-deleted-topic-keeps-its-replicas", REPLICA_MANAGER,
             "                    self._delete_partition(TopicPartition(name, index))",
             "                    pass", DELETION_TESTS),
    Mutation("a-stray-log-serves-the-new-topic", LOG_MANAGER,
             "        if topic_id is not None and stored is not None and stored != topic_id:",
             "        if False:", DELETION_TESTS),
    Mutation("a-deleted-group-keeps-its-offsets", GROUP_LOAD,
             "                  for tp in dict.fromkeys(held)), encode_group_key(group_id),",
             "                  for tp in dict.fromkeys(held) if False), "
             "encode_group_key(group_id),", DELETION_TESTS),
    Mutation("create-partitions-past-the-batch-bound", QUORUM_CONTROLLER,
             "if sum(a for a in additions if isinstance(a, int)) > MAX_PARTITIONS_PER_BATCH:",
             "if sum(a for a in additions if isinstance(a, int)) > 2 * MAX_PARTITIONS_PER_BATCH:",
             ("tests/minibroker/test_controller_admin.py",)),
    Mutation("describe-configs-broker-before-topic", CONFIG_APIS,
             "layers = ((TOPIC_CONFIG, topic.config), (STATIC_BROKER_CONFIG, broker_config))",
             "layers = ((STATIC_BROKER_CONFIG, broker_config), (TOPIC_CONFIG, topic.config))",
             ("tests/minibroker/test_admin_apis.py",)),
    # The simulator's clock and nodes.
    Mutation("the-clock-overshoots-its-timer", VIRTUAL_LOOP,
             "            self._now = max(self._now, timers[0][0])",
             "            self._now = max(self._now, timers[0][0]) + 0.001",
             ("tests/sim/test_virtual_loop.py",)),
    Mutation("a-resumed-node-loses-what-it-held", VIRTUAL_LOOP,
             "        self._ready.extend(handle for handle in held if not handle._cancelled)",
             "        self._ready.extend(())", ("tests/sim/test_virtual_loop.py",)),
    # The simulator's network.
    Mutation("delay-fault-ignored", STREAMS,
             "        return base_s if self.delay is None else base_s + self.delay.draw()",
             "        return base_s", ("tests/sim/test_virtual_delay.py",)),
    # The consumer group protocol's assignors (Kafka 4.2's UniformAssignor, RangeAssignor).
    Mutation("uniform-keeps-every-extra-partition", UNIFORM,
             "if quota > 0 and has_extra and len(member_ids) - index > extra_left:",
             "if False:", ASSIGNOR_TESTS),
    Mutation("uniform-heterogeneous-never-balances", UNIFORM_HETEROGENEOUS,
             "    builder.balance()\n", "", ASSIGNOR_TESTS),
    Mutation("range-static-members-not-first", RANGE,
             "return 0, member_order(instance_id), member_order(member_id)",
             "return 1, member_order(member_id), b\"\"", ASSIGNOR_TESTS),
    # KIP-848's reconciliation: a partition another member holds is not given; only the
    # previous epoch with a subset of the assignment is accepted; every reconciliation
    # step is a record a new coordinator replays.
    Mutation("a-held-partition-is-given", CURRENT_ASSIGNMENT,
             "            if current_partition_epoch(topic_id, p) != -1 and p not in revoked_here:",
             "            if False:", CONSUMER_GROUP_TESTS),
    Mutation("any-older-member-epoch-is-accepted", CONSUMER_GROUP_MANAGER,
             "            received != member.previous_member_epoch\n", "            False\n",
             CONSUMER_GROUP_TESTS),
    Mutation("a-reconciliation-step-leaves-no-record", CONSUMER_GROUP_MANAGER,
             "            records.append(current_assignment_record(group.group_id, updated))",
             "            pass", CONSUMER_GROUP_TESTS),
    # The simulated consumer protocol member (librdkafka's rdkafka_cgrp.c).
    Mutation("a-fenced-member-keeps-its-partitions", CONSUMER_MEMBER,
             "            elif answer.error in FENCED:\n",
             "            elif answer.error in FENCED and False:\n", CONSUMER_MEMBER_TESTS),
    Mutation("reconciliation-is-eager", CONSUMER_MEMBER,
             "        revoked = [p for p in self._assignment if p not in target]\n",
             "        revoked = list(self._assignment)\n", CONSUMER_MEMBER_TESTS),
    # The simulated classic member's timing (librdkafka's rdkafka_cgrp.c).
    Mutation("a-join-skips-the-metadata-wait", "operator/undertow/sim/clients.py",
             "        if (self._answered_ms is not None",
             "        if (True or self._answered_ms is not None", GROUP_MEMBER_TESTS),
    Mutation("the-session-is-checked-at-the-next-heartbeat", GROUP_MEMBER,
             "        self._later(self._session_ms, check)\n",
             "        self._later(self._session_ms + self._heartbeat_ms, check)\n",
             GROUP_MEMBER_TESTS),
    Mutation("a-new-consumer-finds-its-coordinator-at-once", GROUP_MEMBER,
             "        connect_at = self._started_ms + SPARSE_CONNECT_INTERVAL_MS\n",
             "        connect_at = self._started_ms\n", GROUP_MEMBER_TESTS),
    # The report's consumption measure.
    Mutation("a-record-read-again-is-progress", CONSUMPTION,
             '.filter(F.col("_n") == 1)', '.filter(F.col("_n") >= 1)',
             ("tests/analysis/test_groups.py", "-k", "consumption")),
)


def _copy_tree(into: Path) -> None:
    """The committed tree (HEAD), as ``git archive`` writes it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def _pytest(copy: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(copy / s) for s in SOURCES)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the copy's bytecode serves the next runs
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-p", "no:randomly", *tests], cwd=copy, env=env, capture_output=True, text=True,
        timeout=TIMEOUT_S)
    return proc.returncode, proc.stdout[-2000:] + proc.stderr[-2000:]


def _imports_the_copy(copy: Path) -> None:
    """The copy's packages, not the editable install's, are what the tests import."""
    out = subprocess.run(
        [sys.executable, "-c", "import minibroker, undertow, undertow_analysis, "
         "undertow_history; print(minibroker.__file__, undertow.__file__, "
         "undertow_analysis.__file__, undertow_history.__file__)"],
        cwd=copy, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            str(copy / s) for s in SOURCES)}, capture_output=True, text=True, check=True)
    files = out.stdout.split()
    if not all(Path(f).is_relative_to(copy) for f in files):
        raise SystemExit(f"the tests would import the installed packages: {files}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="the mutations to check (default: all)")
    parser.add_argument("--list", action="store_true", help="name the mutations and stop")
    args = parser.parse_args()
    by_name = {m.name: m for m in MUTATIONS}
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:40} {m.path}")
        return 0
    unknown = set(args.names) - set(by_name)
    if unknown:
        parser.error(f"no such mutation: {', '.join(sorted(unknown))}")
    chosen = [by_name[n] for n in args.names] or list(MUTATIONS)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="undertow-mutations-") as tmp:
        copy = Path(tmp)
        _copy_tree(copy)
        _imports_the_copy(copy)
        originals = {m.path: (copy / m.path).read_text() for m in chosen}
        for m in chosen:
            count = originals[m.path].count(m.old)
            if count != 1:
                print(f"{m.name}: its piece of {m.path} is found {count} times, not once")
                return 2
        for tests in dict.fromkeys(m.tests for m in chosen):
            code, out = _pytest(copy, tests)
            if code != 0:
                print(f"{' '.join(tests)} fails without a mutation (exit {code}):\n{out}")
                return 2
        print(f"unmutated: the tests pass ({time.monotonic() - started:.0f} s)")
        survived = []
        for m in chosen:
            target = copy / m.path
            target.write_text(originals[m.path].replace(m.old, m.new))
            try:
                t0 = time.monotonic()
                code, out = _pytest(copy, m.tests)
            finally:
                target.write_text(originals[m.path])
            verdict = "killed" if code == 1 else ("SURVIVED" if code == 0 else f"error {code}")
            print(f"{verdict:9} {m.name} ({time.monotonic() - t0:.0f} s)", flush=True)
            if code != 1:
                survived.append(m.name)
                if code != 0:
                    print(out)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations killed in "
          f"{time.monotonic() - started:.0f} s" + (
              f"; not killed: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
