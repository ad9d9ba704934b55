"""The row -> (topic partition, sequence) rules and the resume rule, without Spark.

The central property: whatever prefix of a Spark partition's records an earlier attempt
made durable (any per-topic-partition prefix, since in-flight batches may be lost), a new
attempt that resumes from the durable highwaters sends exactly the records that are not
yet written: together every row once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease.client.partitioner import partition_for_key
from pipeline.sequencing import (
    STREAM_POSITIONS_MAX,
    BatchSequencer,
    Resume,
    Routing,
    StreamSequencer,
    plan,
    producer_name,
    route,
    stream_sequence,
)


def test_producer_name_is_job_and_spark_partition() -> None:
    assert producer_name("nightly-orders", 7) == "nightly-orders:7"


@pytest.mark.parametrize("routing", [Routing.SPARK, Routing.AUTO])
def test_rows_without_key_follow_their_spark_partition(routing: Routing) -> None:
    assert [route(routing, k, None, 3) for k in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_keyed_rows_use_the_sdk_hash_unless_routing_is_spark() -> None:
    key = b"customer-42"
    assert route(Routing.AUTO, 5, key, 4) == partition_for_key(key, 4)
    assert route(Routing.KEY, 5, key, 4) == partition_for_key(key, 4)
    assert route(Routing.SPARK, 5, key, 4) == 1


def test_key_routing_refuses_a_row_without_key() -> None:
    with pytest.raises(ValueError, match="needs a key"):
        route(Routing.KEY, 0, None, 4)


def test_batch_sequences_are_contiguous_per_topic_partition() -> None:
    s = BatchSequencer(3)
    got = [(tp, s.assign(tp)) for tp in [0, 2, 0, 0, 1, 2]]
    assert got == [(0, 0), (2, 0), (0, 1), (0, 2), (1, 0), (2, 1)]


def test_stream_sequence_is_batch_id_and_position() -> None:
    assert stream_sequence(0, 0) == 0
    assert stream_sequence(3, 17) == 3 * 2**32 + 17
    assert stream_sequence(1, 0) > stream_sequence(0, STREAM_POSITIONS_MAX - 1)
    with pytest.raises(ValueError, match=r"at most 2\*\*32 rows"):
        stream_sequence(0, STREAM_POSITIONS_MAX)
    with pytest.raises(ValueError, match="batch id -1 is outside"):
        stream_sequence(-1, 0)
    with pytest.raises(ValueError, match=f"batch id {2**31} is outside"):
        StreamSequencer(2**31)  # would overflow a 63-bit sequence


def test_stream_sequencer_counts_positions_per_topic_partition() -> None:
    s = StreamSequencer(5)
    got = [s.assign(tp) for tp in [1, 0, 1, 1, 0]]
    assert got == [5 << 32, 5 << 32, (5 << 32) + 1, (5 << 32) + 2, (5 << 32) + 1]


def test_stream_ids_of_a_keyed_micro_batch_are_consecutive_per_topic_partition() -> None:
    # Keyed rows spread over every topic partition (the default routing): each topic
    # partition's ids must still follow one another, or the SDK cuts a batch per record.
    keys = [b"customer-%d" % (i * 7919 % 1000) for i in range(5000)]
    planned = list(
        plan(
            [(k, b"v") for k in keys],
            routing=Routing.AUTO,
            spark_partition=3,
            partitions=4,
            sequencer=StreamSequencer(9),
            resume=Resume({}),
        )
    )
    for tp in range(4):
        seqs = [r.sequence for r in planned if r.topic_partition == tp]
        assert len(seqs) > 500  # the keys really spread
        assert seqs == list(range(9 << 32, (9 << 32) + len(seqs)))


def test_stream_ids_are_the_same_on_a_replay_and_grow_with_the_batch_id() -> None:
    rows = [(b"k%d" % (i % 13), b"v%d" % i) for i in range(300)]

    def ids(batch_id: int) -> list[tuple[int, int]]:
        return [
            (r.topic_partition, r.sequence)
            for r in plan(
                rows,
                routing=Routing.AUTO,
                spark_partition=0,
                partitions=3,
                sequencer=StreamSequencer(batch_id),
                resume=Resume({}),
            )
        ]

    assert ids(4) == ids(4)  # a replay from the checkpoint: same rows, same ids
    later = dict(ids(5))
    for tp, seq in ids(4):  # every id of batch 5 is above every id of batch 4
        assert later[tp] > seq


def _rows(keys: list[int | None]) -> list[tuple[bytes | None, bytes]]:
    return [(None if k is None else b"k%d" % k, b"v%d" % i) for i, k in enumerate(keys)]


rows_strategy = st.lists(st.one_of(st.none(), st.integers(0, 20)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(
    keys=rows_strategy,
    partitions=st.integers(1, 5),
    spark_partition=st.integers(0, 9),
    routing=st.sampled_from([Routing.AUTO, Routing.SPARK]),
    batch_id=st.one_of(st.none(), st.integers(0, 99)),
    data=st.data(),
)
def test_resume_sends_exactly_what_is_not_durable(
    keys: list[int | None],
    partitions: int,
    spark_partition: int,
    routing: Routing,
    batch_id: int | None,
    data: st.DataObject,
) -> None:
    rows = _rows(keys)

    def attempt(resume: Resume) -> list:
        seq = BatchSequencer(partitions) if batch_id is None else StreamSequencer(batch_id)
        return list(
            plan(
                rows,
                routing=routing,
                spark_partition=spark_partition,
                partitions=partitions,
                sequencer=seq,
                resume=resume,
            )
        )

    first = attempt(Resume({}))
    assert not any(r.written for r in first)
    # Sequences never repeat within a topic partition, and grow in row order.
    for tp in range(partitions):
        seqs = [r.sequence for r in first if r.topic_partition == tp]
        assert seqs == sorted(set(seqs))
        # Consecutive: strict topics need no holes, and a stream's whole micro-batch
        # then fits in few SDK batches.
        base = 0 if batch_id is None else batch_id << 32
        assert seqs == list(range(base, base + len(seqs)))
    # The first attempt made some prefix of each topic partition durable.
    durable: dict[int, int] = {}
    for tp in range(partitions):
        mine = [r for r in first if r.topic_partition == tp]
        n = data.draw(st.integers(0, len(mine)))
        if n:
            durable[tp] = mine[n - 1].sequence
    written_before = {r.position for r in first if r.sequence <= durable.get(r.topic_partition, -1)}
    second = attempt(Resume(durable))
    # The retry plans the very same records (a replayable source) ...
    assert [(r.topic_partition, r.sequence, r.value) for r in second] == [
        (r.topic_partition, r.sequence, r.value) for r in first
    ]
    # ... and skips exactly the durable ones: together every row once.
    sent_now = {r.position for r in second if not r.written}
    assert sent_now.isdisjoint(written_before)
    assert sent_now | written_before == set(range(len(rows)))
