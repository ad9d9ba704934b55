"""The row -> (producer, topic partition, sequence) rules and the resume rule, without
Spark.

The central properties: a row's (bucket, topic partition, sequence) depends on the rows
only, never on the order they are delivered in or on how they are split (issue 30: a
replay in another order lost rows and doubled others); identical rows get consecutive
ids and are all written; and whatever prefix an earlier attempt made durable (any
per-(bucket, topic partition) prefix, since in-flight batches may be lost), a new attempt
that resumes from the durable highwaters sends exactly the records not yet written."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease.client.partitioner import partition_for_key
from pidlease.spark.sequencing import (
    STREAM_POSITIONS_MAX,
    Resume,
    Routing,
    Row,
    canonical,
    canonical_columns,
    content_order_columns,
    group_positions,
    plain_producer_name,
    plan,
    producer_name,
    route,
    stream_sequence,
)

pa = pytest.importorskip("pyarrow")


def test_producer_name_is_job_bucket_and_bucket_count() -> None:
    assert producer_name("nightly-orders", 7, 32) == "nightly-orders:7/32"
    with pytest.raises(ValueError, match="outside"):
        producer_name("j", 32, 32)


def test_a_plain_and_a_bucketed_producer_never_share_a_name() -> None:
    """A plain DataFrame's producer is the contract's ``<job>:<partition>``; a bucketed
    one always has ``/<buckets>`` after its last colon, a plain one never does, so the
    two never continue each other's numbering (under one job name or any two)."""
    assert plain_producer_name("nightly-orders", 3) == "nightly-orders:3"
    plain = {plain_producer_name(j, p) for j in ("j", "j:1", "j:1/2") for p in range(40)}
    bucketed = {
        producer_name(j, b, n) for j in ("j", "j:1", "j:1/2") for n in (1, 2, 32) for b in range(n)
    }
    assert not plain & bucketed
    with pytest.raises(ValueError, match="negative"):
        plain_producer_name("j", -1)


@pytest.mark.parametrize("routing", [Routing.SPARK, Routing.AUTO])
def test_rows_without_key_follow_their_bucket(routing: Routing) -> None:
    assert [route(routing, b, None, 3) for b in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_keyed_rows_use_the_sdk_hash_unless_routing_is_spark() -> None:
    key = b"customer-42"
    assert route(Routing.AUTO, 5, key, 4) == partition_for_key(key, 4)
    assert route(Routing.KEY, 5, key, 4) == partition_for_key(key, 4)
    assert route(Routing.SPARK, 5, key, 4) == 1


def test_key_routing_refuses_a_row_without_key() -> None:
    with pytest.raises(ValueError, match="needs a key"):
        route(Routing.KEY, 0, None, 4)


def test_stream_sequence_is_batch_id_and_position() -> None:
    assert stream_sequence(0, 0) == 0
    assert stream_sequence(3, 17) == 3 * 2**32 + 17
    assert stream_sequence(1, 0) > stream_sequence(0, STREAM_POSITIONS_MAX - 1)
    with pytest.raises(ValueError, match=r"at most 2\*\*32 rows"):
        stream_sequence(0, STREAM_POSITIONS_MAX)
    with pytest.raises(ValueError, match="batch id -1 is outside"):
        stream_sequence(-1, 0)
    with pytest.raises(ValueError, match=f"batch id {2**31} is outside"):
        stream_sequence(2**31, 0)  # would overflow a 63-bit sequence


def _row(i: int, key: int | None, buckets: int = 4, value: bytes | None = None) -> Row:
    v = value if value is not None else b"v%d" % i
    h = hash((key, v)) & 0x7FFF  # small: ties on the hash happen, bytes must decide
    return Row(h % buckets, h, None if key is None else b"k%d" % key, v)


def _identity(planned: list) -> Counter[tuple]:
    """Each row's (bucket, topic partition, sequence), as a multiset keyed by the row."""
    return Counter((r.key, r.value, r.bucket, r.topic_partition, r.sequence) for r in planned)


def test_stream_ids_of_a_keyed_micro_batch_are_consecutive_per_bucket_and_partition() -> None:
    rows = [_row(i, i * 7919 % 1000) for i in range(5000)]
    planned = plan(rows, routing=Routing.AUTO, partitions=4, batch_id=9, resume={})
    for b in range(4):
        for tp in range(4):
            seqs = [r.sequence for r in planned if r.topic_partition == tp and r.bucket == b]
            assert len(seqs) > 100  # the keys really spread
            assert seqs == list(range(9 << 32, (9 << 32) + len(seqs)))


def test_a_replay_in_another_order_gives_every_row_the_same_id() -> None:
    """Issue 30: ids were positions in delivery order; a replayed micro-batch whose rows
    came in another order gave rows the ids of others (5 of 20 lost, 5 doubled)."""
    rows = [_row(i, i % 3) for i in range(20)]
    shuffled = rows[:]
    random.Random(30).shuffle(shuffled)
    first = plan(rows, routing=Routing.AUTO, partitions=2, batch_id=5, resume={})
    again = plan(shuffled, routing=Routing.AUTO, partitions=2, batch_id=5, resume={})
    assert _identity(first) == _identity(again)


def test_identical_rows_get_consecutive_ids_and_are_all_written() -> None:
    rows = [_row(0, 1, value=b"same")] * 3 + [_row(i, 1) for i in range(1, 6)]
    planned = plan(rows, routing=Routing.AUTO, partitions=2, batch_id=None, resume={})
    same = sorted(r.sequence for r in planned if r.value == b"same")
    assert len(same) == 3 and same == list(range(same[0], same[0] + 3))
    assert len({(r.bucket, r.topic_partition, r.sequence) for r in planned}) == len(rows)


_rows_st = st.lists(
    st.tuples(st.one_of(st.none(), st.integers(0, 6)), st.integers(0, 8)), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(
    spec=_rows_st,
    partitions=st.integers(1, 5),
    keyless=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_the_plain_order_is_the_reference_order_and_ignores_delivery(
    spec: list[tuple[int | None, int]], partitions: int, keyless: bool, seed: int
) -> None:
    """A plain partition (one bucket, row hash 0): ``content_order_columns`` orders rows
    as ``canonical`` does, and two deliveries of the same rows in different orders get
    the same ids (topic partition, position) for every row."""
    rows = [Row(4, 0, None if k is None or keyless else b"k%d" % k, b"v%d" % v) for k, v in spec]

    def ids(delivery: list[Row]) -> Counter[tuple[Row, int, int]]:
        parts = [route(Routing.AUTO, r.bucket, r.key, partitions) for r in delivery]
        keys = None if keyless else pa.array([r.key for r in delivery], pa.binary())
        order = content_order_columns(
            np.array(parts, dtype=np.int64),
            keys,
            pa.array([r.value for r in delivery], pa.binary()),
        )
        ref = canonical(
            [4] * len(delivery),
            parts,
            [0] * len(delivery),
            [r.key for r in delivery],
            [r.value for r in delivery],
        )
        assert [delivery[i] for i in order.tolist()] == [delivery[i] for i in ref]
        p = np.array(parts, dtype=np.int64)[order]
        pos = group_positions(np.full(len(delivery), 4, dtype=np.int64), p).tolist()
        return Counter(
            (delivery[i], int(tp), n)
            for i, tp, n in zip(order.tolist(), p.tolist(), pos, strict=True)
        )

    other = list(rows)
    random.Random(seed).shuffle(other)
    assert ids(rows) == ids(other)


@settings(max_examples=200, deadline=None)
@given(
    spec=_rows_st,
    partitions=st.integers(1, 5),
    routing=st.sampled_from([Routing.AUTO, Routing.SPARK]),
    batch_id=st.one_of(st.none(), st.integers(0, 99)),
    seed=st.integers(0, 2**32),
)
def test_ids_depend_on_the_rows_only_not_on_order_or_split(
    spec: list[tuple[int | None, int]],
    partitions: int,
    routing: Routing,
    batch_id: int | None,
    seed: int,
) -> None:
    # values repeat (duplicate rows), hashes collide (15 bits over few rows is rare, so
    # half the rows share one hash on purpose)
    rows = [
        Row(v % 3, 7 if v % 2 else v, None if k is None else b"k%d" % k, b"v%d" % v)
        for k, v in spec
    ]
    rng = random.Random(seed)
    shuffled = rows[:]
    rng.shuffle(shuffled)
    whole = plan(rows, routing=routing, partitions=partitions, batch_id=batch_id, resume={})
    again = plan(shuffled, routing=routing, partitions=partitions, batch_id=batch_id, resume={})
    assert _identity(whole) == _identity(again)
    # split by bucket into tasks any way (what the shuffle by bucket does): the same ids
    tasks: dict[int, list[Row]] = {}
    spread = rng.randint(1, 3)  # tasks; a bucket is in exactly one
    for r in shuffled:
        tasks.setdefault(r.bucket % spread, []).append(r)
    split = Counter[tuple]()
    for task_rows in tasks.values():
        split += _identity(
            plan(task_rows, routing=routing, partitions=partitions, batch_id=batch_id, resume={})
        )
    assert split == _identity(whole)
    # ids are unique per (bucket, topic partition) and consecutive from the base
    base = 0 if batch_id is None else batch_id << 32
    groups: dict[tuple[int, int], list[int]] = {}
    for r in whole:
        groups.setdefault((r.bucket, r.topic_partition), []).append(r.sequence)
    for seqs in groups.values():
        assert seqs == list(range(base, base + len(seqs)))


@settings(max_examples=200, deadline=None)
@given(spec=_rows_st, partitions=st.integers(1, 5), seed=st.integers(0, 2**32))
def test_the_column_order_is_the_reference_order(
    spec: list[tuple[int | None, int]], partitions: int, seed: int
) -> None:
    rows = [
        Row(v % 3, 7 if v % 2 else v, None if k is None else b"k%d" % k, b"v%d" % v)
        for k, v in spec
    ]
    random.Random(seed).shuffle(rows)
    parts = [route(Routing.AUTO, r.bucket, r.key, partitions) for r in rows]
    ref = canonical(
        [r.bucket for r in rows],
        parts,
        [r.row_hash for r in rows],
        [r.key for r in rows],
        [r.value for r in rows],
    )
    b = np.array([r.bucket for r in rows], dtype=np.int64)
    p = np.array(parts, dtype=np.int64)
    order = canonical_columns(
        b,
        p,
        np.array([r.row_hash for r in rows], dtype=np.int64),
        pa.array([r.key for r in rows], pa.binary()),
        pa.array([r.value for r in rows], pa.binary()),
    )
    # the same rows in the same order (identical rows may swap: they are one row)
    assert [rows[i] for i in order.tolist()] == [rows[i] for i in ref]
    pos = group_positions(b[order], p[order]).tolist()
    expected: list[int] = []
    seen: Counter[tuple[int, int]] = Counter()
    for i in ref:
        expected.append(seen[(rows[i].bucket, parts[i])])
        seen[(rows[i].bucket, parts[i])] += 1
    assert pos == expected


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 4095),  # bucket (BUCKETS_MAX)
            st.integers(0, 9999),  # topic partition
            st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([-1, 0, 2**63 - 1])),
            st.binary(max_size=3),
        ),
        max_size=60,
    ),
)
def test_the_column_order_is_the_reference_order_for_wide_buckets_partitions_and_hashes(
    rows: list[tuple[int, int, int, bytes]],
) -> None:
    """Any bucket count, partition count and 64-bit hash (the column order's sort narrows
    (bucket, partition) to 16, 32 or 64 bits)."""
    b = [r[0] for r in rows]
    p = [r[1] for r in rows]
    h = [r[2] for r in rows]
    v = [r[3] for r in rows]
    order = canonical_columns(
        np.array(b, dtype=np.int64),
        np.array(p, dtype=np.int64),
        np.array(h, dtype=np.int64),
        None,
        pa.array(v, pa.binary()),
    )
    ref = canonical(b, p, h, [None] * len(rows), v)
    assert [rows[i] for i in order.tolist()] == [rows[i] for i in ref]


@settings(max_examples=200, deadline=None)
@given(
    spec=_rows_st,
    partitions=st.integers(1, 5),
    routing=st.sampled_from([Routing.AUTO, Routing.SPARK]),
    batch_id=st.one_of(st.none(), st.integers(0, 99)),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_resume_sends_exactly_what_is_not_durable(
    spec: list[tuple[int | None, int]],
    partitions: int,
    routing: Routing,
    batch_id: int | None,
    seed: int,
    data: st.DataObject,
) -> None:
    rows = [Row(v % 3, v, None if k is None else b"k%d" % k, b"v%d" % v) for k, v in spec]
    first = plan(rows, routing=routing, partitions=partitions, batch_id=batch_id, resume={})
    assert not any(r.written for r in first)
    # The first attempt made some prefix of each (bucket, topic partition) durable.
    durable: dict[int, dict[int, int]] = {}
    for b in range(3):
        for tp in range(partitions):
            mine = [r for r in first if r.topic_partition == tp and r.bucket == b]
            n = data.draw(st.integers(0, len(mine)))
            if n:
                durable.setdefault(b, {})[tp] = mine[n - 1].sequence
    # The retry sees the same rows in another order.
    shuffled = rows[:]
    random.Random(seed).shuffle(shuffled)
    second = plan(
        shuffled,
        routing=routing,
        partitions=partitions,
        batch_id=batch_id,
        resume={b: Resume(d) for b, d in durable.items()},
    )
    written = Counter(
        (r.key, r.value)
        for r in first
        if r.sequence <= durable.get(r.bucket, {}).get(r.topic_partition, -1)
    )
    sent = Counter((r.key, r.value) for r in second if not r.written)
    # together every row exactly once (as a multiset: identical rows count each)
    assert written + sent == Counter((r.key, r.value) for r in rows)
