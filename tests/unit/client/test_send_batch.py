"""``send_batch``: many records in one call (lists or Arrow arrays), one future per call,
with ``send``'s guarantees: order with interleaved sends, the same key routing, explicit
ids (replays, holes, the strict rule), batches cut at the limits, bad input refused before
anything is queued, and a fenced producer's per-batch outcomes."""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidlease import errors
from pidlease.client.partitioner import partition_for_key
from pidlease.client.producer import AsyncProducer, Producer
from pidlease.client.record_columns import crc32_keys
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer, fake_cluster
from pidlease.wire import protocol as P

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"t": (3, "strict"), "mono": (2, "monotonic"), "one": (1, "strict")}


def make(coord: FakeCoordinator, topic: str = "t", **kw: Any) -> Producer:
    return Producer("http://fake", topic=topic, http_transport=coord.transport(), **kw)


def log(srv: FakePartitionServer, topic: str, partition: int) -> list[tuple[Any, ...]]:
    return [(r.key, r.value, r.sequence_id) for r in srv.records(topic, partition)]


def batches(srv: FakePartitionServer, topic: str, partition: int) -> list[tuple[int, int]]:
    """(base sequence, record count) of each stored batch."""
    out = []
    for b in srv.parts[(topic, partition)].batches:
        h = P.decode_batch_header(b)
        out.append((h.base_sequence, h.count))
    return out


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def test_interleaved_sends_keep_call_order_in_each_partition(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, batch_records_max=4, linger_ms=50) as p:
        futs: list[Any] = [p.send(b"a0", partition=1)]
        bf = p.send_batch([b"b%d" % i for i in range(10)], partition=1)
        futs.append(p.send(b"a1", partition=1))
        bf2 = p.send_batch(pa.array([b"c%d" % i for i in range(3)]), partition=1)
        futs.append(p.send(b"a2", partition=1))
        metas = bf.result(10)
        assert [m.sequence_id for m in metas] == list(range(1, 11))
        assert [m.offset for m in metas] == list(range(1, 11))
        assert [m.sequence_id for m in bf2.result(10)] == [12, 13, 14]
        assert [f.result(10).sequence_id for f in futs] == [0, 11, 15]
    values = [v for _, v, _ in log(srv, "t", 1)]
    assert values == [b"a0", *(b"b%d" % i for i in range(10)), b"a1", b"c0", b"c1", b"c2", b"a2"]
    assert [s for _, _, s in log(srv, "t", 1)] == list(range(16))


def test_async_producer_interleaves_too(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake

    async def main() -> None:
        async with AsyncProducer(
            "http://fake", topic="t", http_transport=coord.transport(), batch_records_max=3
        ) as p:
            f0 = await p.send(b"x0", partition=2)
            bf = await p.send_batch(pa.array([f"s{i}" for i in range(7)]), partition=2)
            f1 = await p.send(b"x1", partition=2)
            metas = await bf
            assert [m.sequence_id for m in metas] == list(range(1, 8))
            assert (await f0).sequence_id == 0 and (await f1).sequence_id == 8

    asyncio.run(main())
    assert [v for _, v, _ in log(srv, "t", 2)] == [
        b"x0",
        *(b"s%d" % i for i in range(7)),
        b"x1",
    ]
    # cut at batch_records_max=3: a0's open run, then the call's 3+3+1, then x1
    assert [c for _, c in batches(srv, "t", 2)] == [1, 3, 3, 1, 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=80)), max_size=40))
def test_vectorised_key_hash_is_zlib_crc32(keys: list[bytes | None]) -> None:
    got = crc32_keys(pa.array(keys, pa.binary())).tolist()
    assert got == [0 if k is None else zlib.crc32(k) for k in keys]


@pytest.mark.parametrize("arrow", [False, True])
def test_keys_land_where_send_puts_them(fake, arrow: bool) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    keys = [b"k%d" % i for i in range(60)] + [b"", b"x" * 100, "text-key"]
    values = [b"v%d" % i for i in range(len(keys))]
    with make(coord) as p:
        if arrow:
            bf = p.send_batch(
                pa.array(values),
                keys=pa.array([k if isinstance(k, bytes) else k.encode() for k in keys]),
            )
        else:
            bf = p.send_batch(values, keys=keys)
        metas = bf.result(10)
        singles = [p.send(b"single", key=k).result(10) for k in keys]
    for k, m, s in zip(keys, metas, singles, strict=True):
        kb = k if isinstance(k, bytes) else k.encode()
        assert m.partition == s.partition == partition_for_key(kb, 3)
    for part in range(3):
        got = [(k, v) for k, v, _ in log(srv, "t", part) if v != b"single"]
        want = [
            (k if isinstance(k, bytes) else k.encode(), v)
            for k, v in zip(keys, values, strict=True)
            if partition_for_key(k if isinstance(k, bytes) else k.encode(), 3) == part
        ]
        assert got == want


def test_null_keys_go_to_one_partition_without_a_key(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord) as p:
        metas = p.send_batch([b"a", b"b", b"c"], keys=[None, b"k", None]).result(10)
    assert metas[0].partition == metas[2].partition
    assert metas[1].partition == partition_for_key(b"k", 3)
    rec = log(srv, "t", metas[0].partition)
    assert (None, b"a", metas[0].sequence_id) in rec and (None, b"c", metas[2].sequence_id) in rec


def test_lists_and_arrow_give_the_same_log(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    keys = [b"k%d" % (i % 7) if i % 5 else None for i in range(200)]
    values = [b"value-%d" % i * (i % 4) for i in range(200)]
    # the same round robin start: null keys go to the same partition in both runs
    with make(coord, topic="mono", rng=random.Random(5)) as p:
        p.send_batch(values, keys=keys, sequence_ids=list(range(200))).result(10)
    first = [log(srv, "mono", q) for q in range(2)]
    with (
        fake_cluster(TOPICS) as (srv2, coord2),
        make(coord2, topic="mono", rng=random.Random(5)) as p2,
    ):
        chunked = pa.chunked_array([pa.array(values[:50]), pa.array(values[50:])])
        p2.send_batch(
            chunked, keys=pa.array(keys, pa.binary()), sequence_ids=pa.array(range(200))
        ).result(10)
        assert [log(srv2, "mono", q) for q in range(2)] == first


def test_batches_are_cut_at_the_limits(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(
        coord, topic="one", batch_records_max=10, batch_bytes_max=P.BATCH_HEADER_SIZE + 500
    ) as p:
        # 100-byte values: 108 bytes a record, 4 fit in 500 bytes
        p.send_batch(pa.array([bytes([i]) * 100 for i in range(9)])).result(10)
        p.send_batch([b"s"] * 25).result(10)
    assert batches(srv, "one", 0) == [(0, 4), (4, 4), (8, 1), (9, 10), (19, 10), (29, 5)]


def test_explicit_ids_replays_and_holes(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="mono") as p:
        p.send_batch([b"a", b"b", b"c"], partition=0, sequence_ids=[0, 1, 2]).result(10)
        bf = p.send_batch(
            pa.array([b"a", b"b", b"d", b"e", b"f"]),
            partition=0,
            sequence_ids=pa.array([1, 2, 10, 11, 20]),
        )
        metas = bf.result(10)
        assert [(m.sequence_id, m.duplicate, m.offset) for m in metas] == [
            (1, True, -1),
            (2, True, -1),
            (10, False, 3),
            (11, False, 4),
            (20, False, 5),
        ]
        assert metas.duplicates == 2
        assert p.last_sequence_id(0) == 20
        # an id given but not acknowledged: refused, and nothing of the call is queued
        with pytest.raises(errors.ConfigError):
            p.send_batch([b"x", b"y"], partition=1, sequence_ids=[5, 3])
        with pytest.raises(errors.ConfigError, match="explicit"):
            p.send_batch([b"x"], partition=0)  # own numbering on an explicit producer
    assert batches(srv, "mono", 0) == [(0, 3), (10, 2), (20, 1)]
    assert log(srv, "mono", 1) == []


def test_strict_topic_needs_the_next_id(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord) as p:
        with pytest.raises(errors.ConfigError, match="needs sequence_id 0"):
            p.send_batch([b"a", b"b"], partition=0, sequence_ids=[1, 2])
        # a mistake in partition 2's ids refuses the whole call: partition 0's are not sent
        with pytest.raises(errors.ConfigError):
            p.send_batch([b"a", b"b"], keys=[b"k1", b"k0"], sequence_ids=[0, 7])
        p.send_batch([b"a", b"b"], partition=0, sequence_ids=[0, 1]).result(10)
    assert log(srv, "t", 0) == [(None, b"a", 0), (None, b"b", 1)]
    assert log(srv, "t", 1) == log(srv, "t", 2) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"values": [b"a", b"b"], "keys": [b"k"]}, errors.ConfigError, "1 keys for 2 values"),
        ({"values": [b"a"], "sequence_ids": [0, 1]}, errors.ConfigError, "2 sequence ids"),
        ({"values": [b"a", b"x" * 5000]}, errors.RecordTooLarge, "does not fit"),
        ({"values": pa.array([b"a", None])}, errors.ConfigError, "nulls"),
        ({"values": pa.array([1, 2])}, errors.ConfigError, "binary or string"),
        ({"values": [b"a", 7]}, errors.ConfigError, "bytes or str"),
        ({"values": b"abc"}, errors.ConfigError, "list"),
        ({"values": [b"a"], "partition": 3}, errors.ConfigError, "not in 0..2"),
        ({"values": [b"a"], "sequence_ids": [-1]}, errors.ConfigError, "0..2"),
    ],
)
def test_bad_input_is_refused_before_anything_is_queued(fake, kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, batch_bytes_max=4096) as p:
        with pytest.raises(error, match=match):
            p.send_batch(**kwargs)
        p.flush()
        assert srv.produce_requests == 0
        p.send_batch([b"fine"], partition=0).result(10)  # still usable
    assert log(srv, "t", 0) == [(None, b"fine", 0)]


def test_empty_call_resolves_at_once(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake
    with make(coord) as p:
        assert list(p.send_batch([]).result(5)) == []


def test_fenced_mid_batch_says_per_batch_what_was_written(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    a = make(
        coord,
        producer_name="X",
        batch_records_max=10,
        max_in_flight=1,
        request_timeout_ms=1500,
    )
    try:
        before = srv.produce_requests
        srv.silent_from = before + 2  # the call's 2nd batch is never answered (nor written)
        bf = a.send_batch([b"r%d" % i for i in range(30)], partition=0)
        wait_for(lambda: srv.produce_requests >= before + 2)
        srv.silent_from = 0
        b = make(coord, producer_name="X")  # takes the name over: fences a
        try:
            exc = bf.exception(10)
            assert isinstance(exc, errors.ProducerFenced)
            out = bf.outcomes()
            assert [m.sequence_id for m in out[:10]] == list(range(10))  # acknowledged
            second, third = out[10], out[20]
            assert isinstance(second, errors.ProducerFenced)
            assert isinstance(third, errors.ProducerFenced)
            assert exc is second  # the first failure in input order
            assert (second.first_sequence, second.last_sequence, second.indeterminate) == (
                10,
                19,
                True,
            )
            assert third.indeterminate is False  # never left the producer
            assert all(out[i] is second for i in range(10, 20))
            assert b.last_sequence_id(0) == 9
            with pytest.raises(errors.ProducerFenced):
                a.send_batch([b"late"], partition=0)
        finally:
            b.close()
    finally:
        a.close()
    assert [v for _, v, _ in log(srv, "t", 0)] == [b"r%d" % i for i in range(10)]


_records = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(min_size=1, max_size=6)), st.binary(max_size=40)),
    max_size=80,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=_records, arrow=st.booleans(), records_max=st.sampled_from([1, 3, 1000]))
def test_send_batch_and_send_write_the_same_log(
    records: list[tuple[bytes | None, bytes]], arrow: bool, records_max: int
) -> None:
    """Per partition, the same records in the same order with the same sequences, whether
    sent in one send_batch call or one send() each (records without a key go where the
    call put them: one partition)."""
    keys = [k for k, _ in records]
    values = [v for _, v in records]
    with fake_cluster(TOPICS) as (srv, coord), make(coord, batch_records_max=records_max) as p:
        if arrow:
            bf = p.send_batch(pa.array(values, pa.binary()), keys=pa.array(keys, pa.binary()))
        else:
            bf = p.send_batch(values, keys=keys)
        metas = list(bf.result(10))
        p.flush()
        by_batch = [log(srv, "t", q) for q in range(3)]
    assert [m.partition for m, k in zip(metas, keys, strict=True) if k is not None] == [
        partition_for_key(k, 3) for k in keys if k is not None
    ]
    sticky = {m.partition for m, k in zip(metas, keys, strict=True) if k is None}
    assert len(sticky) <= 1
    with fake_cluster(TOPICS) as (srv, coord), make(coord, batch_records_max=records_max) as p:
        futs = [
            p.send(v, key=k, partition=None if k is not None else min(sticky)) for k, v in records
        ]
        singles = [f.result(10) for f in futs]
        by_send = [log(srv, "t", q) for q in range(3)]
    assert by_batch == by_send
    assert metas == singles


def _timestamps(srv: FakePartitionServer, topic: str, partition: int) -> list[tuple[int, int]]:
    """(base sequence, timestamp) of each stored batch."""
    out = []
    for b in srv.parts[(topic, partition)].batches:
        h = P.decode_batch_header(b)
        out.append((h.base_sequence, h.timestamp_ms))
    return out


def test_explicit_timestamp_is_every_batch_s_timestamp(fake) -> None:  # type: ignore[no-untyped-def]
    """``send_batch(timestamp_ms=T)`` stamps each batch the call makes with T (a mirror
    keeps its source's timestamps); without it the producer's clock is the timestamp."""
    srv, coord = fake
    with make(coord, topic="mono", batch_records_max=2, wall_ms=lambda: 5_000.0) as p:
        p.send_batch([b"a", b"b", b"c"], partition=0, sequence_ids=[0, 1, 2], timestamp_ms=17)
        p.send_batch([b"d"], partition=0, sequence_ids=[3]).result(10)
        for bad in (-1, 1.5, "1", True):
            with pytest.raises(errors.ConfigError, match="timestamp_ms"):
                p.send_batch([b"x"], partition=0, sequence_ids=[9], timestamp_ms=bad)
    assert _timestamps(srv, "mono", 0) == [(0, 17), (2, 17), (3, 5_000)]

    async def run() -> None:
        async with AsyncProducer(
            "http://fake", topic="mono", http_transport=coord.transport()
        ) as ap:
            await (await ap.send_batch([b"e"], partition=1, timestamp_ms=42))

    asyncio.run(run())
    assert [ts for _, ts in _timestamps(srv, "mono", 1)] == [42]
