"""Schema-aware fuzzing (``schema_fuzz``): its frames against the codec, then 20,000 of them
against a real broker, which must stay up, unfenced and small, answer what it owes, and
serve a stock client afterwards.

This is the CI-sized run of ``benchmarks/protocol_fuzz.py`` (a million frames, three
brokers). One broker here: the frames reach the same handlers, and a one-broker cluster
starts in a second. A failure names the frame index, which ``FrameGenerator(SEED, pools)``
rebuilds.
"""

from __future__ import annotations

import io
import struct
from collections import Counter
from pathlib import Path
from uuid import UUID

import pytest
from fuzz_campaign import run_campaign
from kio.serial import entity_writer
from schema_fuzz import (
    MAX_REQUEST_ELEMENTS,
    Expect,
    FrameGenerator,
    Pools,
    advertised_versions,
)

from minibroker.network.codec import ApiKey, KafkaProtocolError, parse_request

pytestmark = pytest.mark.long  # run first (tests/conftest.py)

SEED = 20_000
FRAMES = 20_000
RSS_BOUND_MIB = 200  # an idle broker holds about 55 MiB
# A Fetch answers each partition once, so no answer holds more than the cluster's records:
# the pool's 900 KB and what the fuzzer's own produces added. When the broker answered
# every copy of a partition named many times, frame 3154 of this run got 26 MB.
FETCH_ANSWER_BOUND = 8 << 20
# Where kio writes a valid request otherwise by design: it leaves out a tagged field at its
# default (Fetch v15's replica_state), and rounds an int64 duration through a float
# (OffsetCommit v2-v4's retention_time).
_KIO_WRITES_OTHERWISE = {(ApiKey.FETCH, 15), (ApiKey.OFFSET_COMMIT, 2),
                         (ApiKey.OFFSET_COMMIT, 3), (ApiKey.OFFSET_COMMIT, 4)}


def _kio_encoding(frame: bytes, body: object) -> bytes:
    """``frame``'s header, then ``body`` as kio writes it."""
    (client_id_size,) = struct.unpack_from(">h", frame, 8)
    header_size = 10 + max(client_id_size, 0) + body.__flexible__  # type: ignore[attr-defined]
    buffer = io.BytesIO()
    entity_writer(type(body))(buffer, body)
    return frame[:header_size] + buffer.getvalue()


def test_valid_frames_of_every_advertised_version_parse_as_generated() -> None:
    """Every frame left valid is one kio reads back, and (but for ``_KIO_WRITES_OTHERWISE``)
    the very bytes kio writes for what it read: the generator lays requests out as Kafka
    does. One over max.request.elements is refused for that."""
    generator = FrameGenerator(SEED, corrupt=0.0)
    seen: set[tuple[int, int]] = set()
    for index in range(4000):
        frame = generator.frame(index)
        data = frame.data[4:]
        if frame.expect is Expect.CLOSE:
            with pytest.raises(KafkaProtocolError, match=r"max\.request\.elements"):
                parse_request(data, MAX_REQUEST_ELEMENTS)
            continue
        request = parse_request(data, MAX_REQUEST_ELEMENTS)
        assert (request.api_key, request.api_version, request.correlation_id) == (
            frame.api_key, frame.api_version, index)
        seen.add((request.api_key, request.api_version))
        if (request.api_key, request.api_version) not in _KIO_WRITES_OTHERWISE:
            assert _kio_encoding(data, request.body) == data, f"frame {index}"
    assert seen == set(advertised_versions())


def test_valid_frames_never_delete_nor_grow_the_clusters_own_topics() -> None:
    """DeleteTopics and CreatePartitions name only the pool's new topics (by name; an id is
    never one of the cluster's) and grow them to a few partitions or a count Kafka refuses:
    the topics the campaign reads and writes, and ``__consumer_offsets``, stay as they are."""
    own_ids = (UUID(int=7), UUID(int=8))
    pools = Pools(topic_ids=own_ids)
    generator = FrameGenerator(SEED + 2, pools, corrupt=0.0)
    generator.targets = [(api, version) for api, version in advertised_versions()
                         if api in (ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS)]
    named: set[str] = set()
    for index in range(2000):
        frame = generator.frame(index)
        if frame.expect is Expect.CLOSE:
            continue
        body = parse_request(frame.data[4:], MAX_REQUEST_ELEMENTS).body
        if frame.api_key == ApiKey.CREATE_PARTITIONS:
            named |= {t.name for t in body.topics}
            assert all(t.count <= 6 or t.count > 10_000 for t in body.topics), frame.index
        elif frame.api_version >= 6:
            named |= {t.name for t in body.topics if t.name is not None}
            assert not {t.topic_id for t in body.topics} & set(own_ids), frame.index
        else:
            named |= set(body.topic_names)
    assert not named & set(pools.topics)
    assert set(pools.new_topics) <= named  # the pool's new topics are drawn


def test_corrupted_frames_parse_or_are_protocol_errors() -> None:
    """The codec's contract, on frames corrupted where their layout says: a request, or a
    KafkaProtocolError (the connection closed), never anything else."""
    generator = FrameGenerator(SEED + 1, corrupt=1.0)
    outcomes: Counter[str] = Counter()
    for index in range(4000):
        frame = generator.frame(index)
        try:
            parse_request(frame.data[4:], MAX_REQUEST_ELEMENTS)
        except KafkaProtocolError:
            outcomes["refused"] += 1
        else:
            outcomes["parsed"] += 1
    assert outcomes["refused"] > 2 * outcomes["parsed"] > 0, outcomes


@pytest.mark.slow
def test_20000_schema_aware_frames_leave_the_broker_serving(tmp_path: Path) -> None:
    report = run_campaign(tmp_path, frames=FRAMES, seed=SEED, brokers=1,
                          connections_per_broker=16)
    summary = "\n".join(report.lines())
    assert report.frames == FRAMES, summary
    assert len(report.tally.versions) == report.versions_advertised, summary
    assert not report.crashed, summary
    assert report.fences == [], summary
    assert report.tally.violations == [], summary
    assert not report.log.handler_failures, summary
    assert not report.log.errors, summary
    assert max(report.watch.peak_rss_kib.values()) < RSS_BOUND_MIB * 1024, summary
    assert report.tally.largest["FETCH"][0] < FETCH_ANSWER_BOUND, summary
    assert report.round_trip is None, summary
