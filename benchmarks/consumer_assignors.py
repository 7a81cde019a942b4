"""How long a server-side assignor takes to compute a consumer group's target assignment, on
the groups of Kafka 4.2's ``ServerSideAssignorBenchmark`` (jmh-benchmarks), racks off.

    .venv/bin/python benchmarks/consumer_assignors.py [--members 100 1000] [--rounds 5]

As Kafka's benchmark: TOPICS topics sharing ``members * ratio`` partitions; homogeneous
members all subscribe to every topic, heterogeneous ones fall in 5 buckets of members each
subscribed to its bucket's topics; FULL assigns from nothing, INCREMENTAL gives one new member
(subscribed like the last one) to the full assignment of the others. The figure is the median
of ROUNDS ``assign`` calls, in this process; every one is checked to assign each subscribed
partition once.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import uuid

from ledger import commit, machine_line

from minibroker.coordinator.consumer.assignors import (
    ASSIGNORS,
    ConsumerGroupPartitionAssignor,
    GroupSpec,
    MemberSubscription,
    SubscriptionType,
)

BUCKETS = 5  # ServerSideAssignorBenchmark.MAX_BUCKET_COUNT


class Topics:
    """The benchmark's topics: the same partition count each."""

    def __init__(self, topic_ids: list[str], partitions: int) -> None:
        self.counts = dict.fromkeys(topic_ids, partitions)

    def num_partitions(self, topic_id: str) -> int:
        return self.counts.get(topic_id, -1)

    def racks_for_partition(self, topic_id: str, partition: int) -> frozenset[str]:
        return frozenset()


def subscriptions(kind: SubscriptionType, members: int,
                  topic_ids: list[str]) -> dict[str, frozenset[str]]:
    """``AssignorBenchmarkUtils.createHomogeneousMembers``, or
    ``createHeterogeneousBucketedMembers``."""
    if kind == SubscriptionType.HOMOGENEOUS:
        return {f"member{i}": frozenset(topic_ids) for i in range(members)}
    buckets = min(BUCKETS, members)
    topics_each = math.ceil(len(topic_ids) / buckets)
    members_each = math.ceil(members / buckets)
    return {f"member{i}": frozenset(topic_ids[b * topics_each:(b + 1) * topics_each])
            for b in range(buckets)
            for i in range(b * members_each, min((b + 1) * members_each, members))}


def group(assignor: ConsumerGroupPartitionAssignor, kind: SubscriptionType, members: int,
          incremental: bool, topic_ids: list[str], topics: Topics) -> GroupSpec:
    subs = subscriptions(kind, members - 1 if incremental else members, topic_ids)
    spec = GroupSpec({m: MemberSubscription(None, s, {}) for m, s in subs.items()}, kind)
    if not incremental:
        return spec
    # simulateIncrementalRebalance: the others keep their assignment, one member joins.
    done = assignor.assign(spec, topics)
    joined = {m: MemberSubscription(None, s, done.get(m, {})) for m, s in subs.items()}
    joined["newMember"] = MemberSubscription(None, subs[f"member{members - 2}"], {})
    return GroupSpec(joined, kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--ratio", type=int, default=10, help="partitions per member")
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"commit {commit()}; {machine_line()}; {args.rounds} rounds each")
    print(f"{'members':>7s} {'partitions':>10s} {'subscription':13s} {'assignor':8s} "
          f"{'type':11s} {'median ms':>9s} {'min ms':>7s}")
    topic_ids = [str(uuid.UUID(int=i + 1)) for i in range(args.topics)]
    for members in args.members:
        partitions = members * args.ratio // args.topics
        topics = Topics(topic_ids, partitions)
        for kind in SubscriptionType:
            for name, assignor in ASSIGNORS.items():
                for incremental in (False, True):
                    spec = group(assignor, kind, members, incremental, topic_ids, topics)
                    times = []
                    for _ in range(args.rounds):
                        started = time.perf_counter()
                        answer = assignor.assign(spec, topics)
                        times.append(time.perf_counter() - started)
                    assigned = sum(len(ps) for a in answer.values() for ps in a.values())
                    assert assigned == partitions * args.topics, (assigned, kind, name)
                    print(f"{members:7d} {partitions * args.topics:10d} {kind:13s} {name:8s} "
                          f"{'INCREMENTAL' if incremental else 'FULL':11s} "
                          f"{statistics.median(times) * 1000:9.1f} {min(times) * 1000:7.1f}",
                          flush=True)


if __name__ == "__main__":
    main()
