"""Metadata deltas: a broker that applies the controller's deltas holds the same image as
one that fetches the whole image each time, whatever the controller did in between; a delta
names only what changed; a broker the controller cannot serve a delta gets the whole image."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from test_controller import Clock, controller, join

from minibroker.cluster.types import (
    ErrorCode,
    MetadataDelta,
    MetadataImage,
    NewPartitions,
    TopicPartition,
)
from minibroker.controller import metadata_deltas
from minibroker.controller.quorum_controller import QuorumController


def _through_json(answer: MetadataImage | MetadataDelta, base: MetadataImage) -> MetadataImage:
    """What a broker makes of the answer, after the wire (``controller.server``)."""
    if isinstance(answer, MetadataDelta):
        return MetadataDelta.from_json(answer.to_json()).apply(base)
    return MetadataImage.from_json(answer.to_json())


def _shrink_isr(c: QuorumController, topic: str, index: int) -> None:
    # "t" may be deleted (and not yet back: too few live brokers), or back with fewer
    # partitions.
    reg = c.topics[topic].partitions.get(index) if topic in c.topics else None
    if reg is not None and len(reg.isr) > 1 and reg.leader >= 0:
        c.alter_partition(reg.leader, TopicPartition(topic, index), reg.leader_epoch,
                          reg.partition_epoch, (reg.leader,))


def _expand_isr(c: QuorumController, topic: str, index: int) -> None:
    reg = c.topics[topic].partitions.get(index) if topic in c.topics else None
    if reg is not None and reg.leader >= 0:
        c.alter_partition(reg.leader, TopicPartition(topic, index), reg.leader_epoch,
                          reg.partition_epoch, tuple(r for r in reg.replicas if c.is_live(r)))


OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("shrink"), st.integers(0, 5)),
    st.tuples(st.just("expand"), st.integers(0, 5)),
    st.tuples(st.just("fence"), st.integers(1, 3)),
    st.tuples(st.just("rejoin"), st.integers(1, 3)),
    st.tuples(st.just("create"), st.integers(1, 4)),
    st.tuples(st.just("config"), st.integers(1, 3)),
    st.tuples(st.just("delete"), st.integers(0, 4)),
    st.tuples(st.just("grow"), st.integers(0, 4)),
    st.tuples(st.just("poll"), st.just(0)),
), max_size=25)


@settings(max_examples=60, deadline=None)
@given(OPERATIONS)
def test_a_broker_applying_deltas_holds_the_controllers_image(
        tmp_path_factory, operations: list[tuple[str, int]]) -> None:
    c = controller(tmp_path_factory.mktemp("events"), Clock())
    assert c.create_topic("t", 6, 3, {})[0] == ErrorCode.none
    image = _through_json(c.metadata_since(-1, ""), MetadataImage())
    created = 0
    for kind, arg in operations:
        if kind == "shrink":
            _shrink_isr(c, "t", arg)
        elif kind == "expand":
            _expand_isr(c, "t", arg)
        elif kind == "fence":
            c.fence_broker(arg, "a test")
        elif kind == "rejoin" and not c.is_live(arg):
            join(c, arg, f"inc-{arg}-{c.metadata_offset}")
        elif kind == "create":
            created += 1
            c.create_topic(f"u{created}", arg, 1, {})
        elif kind == "delete":  # "t" deleted is created again, under another id
            name = "t" if arg == 0 else f"u{arg}"
            if c.delete_topics([name], [])[0].error == ErrorCode.none and arg == 0:
                c.create_topic("t", 2, 3, {})
        elif kind == "grow" and (topic := c.topics.get("t" if arg == 0 else f"u{arg}")):
            c.create_partitions([NewPartitions(topic.name, len(topic.partitions) + 1)])
        elif kind == "config":
            c.alter_topic_config("t", {"min.insync.replicas": str(arg)})
        elif kind == "poll":
            image = _through_json(c.metadata_since(image.metadata_offset, image.cluster_id),
                                  image)
    image = _through_json(c.metadata_since(image.metadata_offset, image.cluster_id), image)
    assert image == c.image()


def test_a_delta_names_only_the_partitions_that_changed(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    c.create_topic("t", 3000, 3, {})
    since = c.metadata_offset
    _shrink_isr(c, "t", 7)
    _shrink_isr(c, "t", 2999)
    answer = c.metadata_since(since, c.cluster_id)
    assert isinstance(answer, MetadataDelta)
    assert set(answer.changes.topics["t"].partitions) == {7, 2999}
    assert set(answer.changes.brokers) == {1, 2, 3}
    # Nothing new: an empty delta at the same offset.
    nothing = c.metadata_since(c.metadata_offset, c.cluster_id)
    assert isinstance(nothing, MetadataDelta) and nothing.changes.topics == {}


def test_the_whole_image_when_the_delta_is_not_known(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(metadata_deltas, "RETAINED_OFFSETS", 4)
    (tmp_path / "state").mkdir()
    c = controller(tmp_path, Clock(), data_dir=tmp_path / "state")
    c.create_topic("t", 3, 3, {})
    old = c.metadata_offset
    for index in range(3):
        _shrink_isr(c, "t", index)
    assert isinstance(c.metadata_since(old, c.cluster_id), MetadataDelta)
    for index in range(3):
        _expand_isr(c, "t", index)
    # Older than the retained offsets, of another cluster, or ahead of the controller.
    for since, cluster_id in ((old, c.cluster_id), (c.metadata_offset, "another"),
                              (c.metadata_offset + 1, c.cluster_id)):
        assert isinstance(c.metadata_since(since, cluster_id), MetadataImage)
    # A restarted controller knows no change before its restart's offset.
    restarted = QuorumController(clock_ms=Clock(), events=c._events,
                                 data_dir=tmp_path / "state")
    assert isinstance(restarted.metadata_since(c.metadata_offset - 1, c.cluster_id),
                      MetadataImage)
    current = restarted.metadata_since(c.metadata_offset, c.cluster_id)
    assert isinstance(current, MetadataDelta) and current.changes.topics == {}


def test_a_delta_names_the_deleted_topics(tmp_path: Path) -> None:
    """A RemoveTopicRecord reaches a broker as the topic's name in ``deleted_topics``; a
    topic created and deleted between two polls is named too (the broker may have none)."""
    c = controller(tmp_path, Clock())
    c.create_topic("gone", 2, 3, {})
    c.create_topic("kept", 1, 3, {})
    base = _through_json(c.metadata_since(-1, ""), MetadataImage())
    c.create_topic("brief", 1, 3, {})
    [result] = c.delete_topics(["gone"], [])
    assert (result.error, result.topic_id) == (ErrorCode.none, base.topics["gone"].topic_id)
    c.delete_topics(["brief"], [])
    answer = c.metadata_since(base.metadata_offset, c.cluster_id)
    assert isinstance(answer, MetadataDelta)
    assert answer.deleted_topics == {"gone", "brief"} and answer.changes.topics == {}
    image = _through_json(answer, base)
    assert set(image.topics) == {"kept"} and image == c.image()
