"""The producer against fakes: a real socket to an in-process partition server that follows
the append rules, and a coordinator as an httpx mock transport."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from pidlease import errors
from pidlease.client.producer import AsyncProducer, DeliveryTimeout, Producer, ProducerClosed
from pidlease.client.reader import Reader
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"t": (3, "strict"), "one": (1, "strict"), "mono": (1, "monotonic")}


def make(coord: FakeCoordinator, topic: str = "t", **kw: object) -> Producer:
    return Producer("http://fake", topic=topic, http_transport=coord.transport(), **kw)  # type: ignore[arg-type]


def assert_exactly_once(srv: FakePartitionServer, topic: str, partitions: int, metas: list) -> None:
    """Every acked record is in the log once, at the offset it was acked with, and each
    PID's sequences in a partition run 0,1,2,... in log order."""
    for p in range(partitions):
        recs = srv.records(topic, p)
        by_offset = {r.offset: r for r in recs}
        seqs: dict[int, list[int]] = {}
        for r in recs:
            seqs.setdefault(r.pid, []).append(r.sequence_id)
        for pid, s in seqs.items():
            assert s == list(range(len(s))), f"partition {p} pid {pid}: not contiguous in order"
        for m in (m for m in metas if m.partition == p):
            if m.offset >= 0:
                assert by_offset[m.offset].sequence_id == m.sequence_id
    keys = Counter((m.partition, m.sequence_id) for m in metas)
    assert max(keys.values()) == 1


def test_send_many_keyed_and_unkeyed(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord) as p:
        assert p.pid == 1000 and p.generation == 7
        assert [p.last_sequence_id(i) for i in range(3)] == [-1, -1, -1]
        futs = [p.send(b"v%d" % i, key=(b"k%d" % i) if i % 2 else None) for i in range(6000)]
        p.flush()
        metas = [f.result(5) for f in futs]
        for i, m in enumerate(metas):
            if i % 2:  # keyed records follow the stable hash
                import zlib

                assert m.partition == zlib.crc32(b"k%d" % i) % 3
        counts = Counter(m.partition for m in metas)
        assert [p.last_sequence_id(i) for i in range(3)] == [counts[i] - 1 for i in range(3)]
    assert sum(len(srv.records("t", i)) for i in range(3)) == 6000
    assert_exactly_once(srv, "t", 3, metas)
    # the first lease is by pid -1 on partition 0, the rest renew with pid+generation
    leases = [b for path, b in coord.requests if path.startswith("/v1/lease")]
    assert leases[0] == {"topic": "t", "partition": 0, "pid": -1}
    assert leases[1]["requests"] == [
        {"topic": "t", "partition": q, "pid": 1000, "generation": 7} for q in (1, 2)
    ]


def test_append_lost_answer_is_resent_and_answered_duplicate_with_original_offsets(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", batch_records_max=50) as p:
        first = [p.send(b"a%d" % i) for i in range(500)]
        p.flush()
        srv.drop_after_append = 4  # append, then cut the connection without answering
        futs = [p.send(b"b%d" % i) for i in range(2000)]
        p.flush()
        metas = [f.result(5) for f in first + futs]
        assert p.stats["batches_resent"] > 0
    dups = [m for m in metas if m.duplicate]
    assert dups, "the server appended batches whose answers were lost: resends must be duplicates"
    assert all(m.offset >= 0 for m in dups)
    recs = srv.records("one", 0)
    assert len(recs) == 2500
    assert [r.value for r in recs] == [b"a%d" % i for i in range(500)] + [
        b"b%d" % i for i in range(2000)
    ]
    assert_exactly_once(srv, "one", 1, metas)


def test_drop_connections_midstream(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, batch_records_max=100) as p:
        futs = []
        for i in range(20_000):
            futs.append(p.send(b"x%d" % i))
            if i % 4000 == 3999:
                p.drop_connections()
        p.flush()
        metas = [f.result(5) for f in futs]
    assert sum(len(srv.records("t", i)) for i in range(3)) == 20_000
    assert_exactly_once(srv, "t", 3, metas)


@pytest.mark.parametrize(
    "code",
    [
        errors.SequenceUnknown.code,
        errors.NotLeader.code,
        errors.ServerUnavailable.code,
        errors.UnknownTopicOrPartition.code,
    ],
)
def test_retriable_answers_are_retried(fake, code: int) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", batch_records_max=20) as p:
        srv.fail_next.extend([code, code, code])
        futs = [p.send(b"r%d" % i) for i in range(400)]
        p.flush()
        metas = [f.result(5) for f in futs]
        assert p.stats["retries"] >= 3
    assert [r.value for r in srv.records("one", 0)] == [b"r%d" % i for i in range(400)]
    assert_exactly_once(srv, "one", 1, metas)


def test_out_of_order_behind_a_failed_batch_is_a_consequence_not_fatal(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", batch_records_max=10, linger_ms=50) as p:
        p.send(b"warm").result(5)
        srv.silent = True  # hold answers so several batches pile up in flight
        futs = [p.send(b"o%d" % i) for i in range(50)]
        time.sleep(0.2)
        srv.silent = False
        srv.fail_next.append(errors.NotLeader.code)
        p.drop_connections()  # resend: first batch NOT_LEADER, the rest OUT_OF_ORDER
        p.flush()
        metas = [f.result(5) for f in futs]
    assert len(srv.records("one", 0)) == 51
    assert_exactly_once(srv, "one", 1, metas)


def test_real_out_of_order_is_fatal(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    p = make(coord, topic="one")
    try:
        p.send(b"a").result(5)
        with srv.lock:  # the server lost our first record: the next batch is out of order
            srv.parts[("one", 0)].pids[p.pid].highwater = -1
        fut = p.send(b"b")
        with pytest.raises(errors.OutOfOrderSequence):
            fut.result(5)
        with pytest.raises(errors.OutOfOrderSequence):
            p.send(b"c")
    finally:
        p.close()


@pytest.mark.parametrize(
    ("code", "exc"),
    [
        (errors.ProducerFenced.code, errors.ProducerFenced),
        (errors.Unauthorized.code, errors.Unauthorized),
        (errors.InvalidRequest.code, errors.InvalidRequest),
    ],
)
def test_fatal_answers_fail_the_producer(fake, code: int, exc: type) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    p = make(coord, topic="one")
    try:
        srv.fail_next.append(code)
        futs = [p.send(b"f%d" % i) for i in range(10)]
        p.flush()
        for f in futs:
            with pytest.raises(exc):
                f.result(5)
        with pytest.raises(exc):
            p.send(b"later")
    finally:
        p.close()
    assert srv.records("one", 0) == []


def test_zombie_is_fenced_before_the_new_owner_sends(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    a = make(coord, topic="one", producer_name="X")
    try:
        a.send(b"from-a").result(5)
        b = make(coord, topic="one", producer_name="X")
        try:
            assert (b.pid, b.generation) == (a.pid, a.generation + 1)
            assert b.last_sequence_id(0) == 0  # the sequence continues across the takeover
            with pytest.raises(errors.ProducerFenced):
                a.send(b"zombie").result(5)
            assert b.send(b"from-b").result(5).sequence_id == 1
        finally:
            b.close()
    finally:
        a.close()
    assert [r.value for r in srv.records("one", 0)] == [b"from-a", b"from-b"]


def test_explicit_sequence_ids_strict(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", producer_name="src") as p:
        futs = [p.send(b"s%d" % i, sequence_id=i) for i in range(100)]
        p.flush()
        assert [f.result(5).sequence_id for f in futs] == list(range(100))
        with pytest.raises(errors.ConfigError, match="needs sequence_id 100"):
            p.send(b"gap", sequence_id=102)
        with pytest.raises(errors.ConfigError, match="explicit sequence ids"):
            p.send(b"no-seq")
        assert p.send(b"s100", sequence_id=100).result(5).sequence_id == 100  # nothing changed
    # a restarted replayable source resends from 0: what is durable is a duplicate
    with make(coord, topic="one", producer_name="src") as p:
        assert p.last_sequence_id(0) == 100
        metas = [p.send(b"s%d" % i, sequence_id=i) for i in range(105)]
        p.flush()
        got = [f.result(5) for f in metas]
        assert all(m.duplicate and m.offset == -1 for m in got[:101])
        assert not any(m.duplicate for m in got[101:])
    assert [r.sequence_id for r in srv.records("one", 0)] == list(range(105))


def test_explicit_sequence_ids_monotonic_holes_make_separate_batches(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="mono", linger_ms=200) as p:
        ids = [0, 1, 2, 10, 11, 50, 51, 52, 53, 1000]
        futs = [p.send(b"m%d" % i, sequence_id=i) for i in ids]
        p.flush()
        assert [f.result(5).sequence_id for f in futs] == ids
        # below the durable highwater: the server would answer DUPLICATE, so the SDK does
        back = p.send(b"back", sequence_id=999).result(5)
        assert back.duplicate and back.offset == -1
        srv.silent = True
        pending = p.send(b"m2000", sequence_id=2000)
        with pytest.raises(errors.ConfigError, match="not acknowledged yet"):
            p.send(b"m1500", sequence_id=1500)
        srv.silent = False
        p.drop_connections()
        assert pending.result(5).sequence_id == 2000
    with srv.lock:
        batches = list(srv.parts[("mono", 0)].batches)
    from pidlease.wire import protocol as P

    runs = [
        (P.decode_batch_header(b).base_sequence, P.decode_batch_header(b).count) for b in batches
    ]
    assert runs == [(0, 3), (10, 2), (50, 4), (1000, 1), (2000, 1)]


def test_bad_input_raises_and_changes_nothing(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", batch_bytes_max=4096) as p:
        with pytest.raises(errors.ConfigError):
            p.send(12345)  # type: ignore[arg-type]
        with pytest.raises(errors.ConfigError):
            p.send(b"x", partition=3)
        with pytest.raises(errors.RecordTooLarge):
            p.send(b"x" * 5000)
        with pytest.raises(errors.ConfigError):
            p.send(b"x", sequence_id=-1)
        assert p.send(b"ok").result(5).sequence_id == 0
    assert [r.value for r in srv.records("one", 0)] == [b"ok"]
    with pytest.raises(errors.ConfigError):
        Producer("http://fake", topic="one", max_in_flight=0, http_transport=coord.transport())
    with pytest.raises(errors.UnknownTopicOrPartition):
        Producer("http://fake", topic="nope", http_transport=coord.transport())


def test_local_mistakes_raise_config_error_before_any_request(fake) -> None:  # type: ignore[no-untyped-def]
    # A caller's mistake is a ConfigError (also a ValueError), raised at construction: not
    # the server's INVALID_REQUEST, and not CoordinatorUnavailable retried until a timeout.
    _srv, coord = fake
    for url in ("127.0.0.1:8470", "ftp://fake", "http://"):
        with pytest.raises(errors.ConfigError, match="needs http:// or https://"):
            Producer(url, "one", start_timeout_ms=100, http_transport=coord.transport())
    with pytest.raises(ValueError, match="linger_ms=-1"):
        Producer("http://fake", "one", linger_ms=-1, http_transport=coord.transport())
    with pytest.raises(errors.ConfigError, match="needs a topic"):
        Producer("http://fake", http_transport=coord.transport())
    with pytest.raises(errors.ConfigError, match="needs http:// or https://"):
        Reader("localhost:8470", "one")
    assert coord.requests == []


def test_delivery_timeout_fails_the_records_and_the_producer(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    p = make(coord, topic="one", delivery_timeout_ms=300, request_timeout_ms=100)
    try:
        srv.silent = True
        fut = p.send(b"lost?")
        with pytest.raises(DeliveryTimeout):
            fut.result(10)
        with pytest.raises(DeliveryTimeout):
            p.send(b"after")
    finally:
        p.close()


def test_lease_is_renewed_and_new_tokens_are_used(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", expire_ms=300) as p:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            p.send(b"tick").result(5)
            renewals = [b for path, b in coord.requests if path == "/v1/lease_pid/batch"]
            if len(renewals) >= 3 and len(set(srv.tokens_seen)) >= 3:
                break
            time.sleep(0.05)
        assert all(r["requests"][0]["generation"] == p.generation for r in renewals)
        assert len(set(srv.tokens_seen)) >= 3


def test_coordinator_unavailable_at_start_is_retried(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake
    coord.fail_leases = 3
    with make(coord, topic="one") as p:
        assert p.send(b"late start").result(5).offset == 0


def test_send_after_close_raises(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake
    p = make(coord, topic="one")
    p.close()
    p.close()  # idempotent
    with pytest.raises(ProducerClosed):
        p.send(b"x")


def test_async_producer_surface(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake

    async def main() -> list:
        async with AsyncProducer(
            "http://fake", "t", http_transport=coord.transport(), linger_ms=1
        ) as p:
            assert p.pid > 0
            one = await p.send_and_wait(b"first", key=b"k")
            futs = [await p.send(b"v%d" % i, partition=2) for i in range(300)]
            await p.flush()
            return [one] + [await f for f in futs]

    metas = asyncio.run(main())
    assert [m.sequence_id for m in metas[1:]] == list(range(300)) or metas[0].partition == 2
    assert all(m.partition == 2 for m in metas[1:])
    assert_exactly_once(srv, "t", 3, metas)


def test_buffer_bound_blocks_send_until_acks_free_space(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", buffer_records_max=1000, batch_records_max=100) as p:
        futs = [p.send(b"b%d" % i) for i in range(5000)]  # 5x the bound: send must wait, not grow
        p.flush()
        assert all(f.result(5) for f in futs)
        assert p._acc.used == 0 and p._unresolved == 0
    assert len(srv.records("one", 0)) == 5000


def test_buffer_bound_with_several_partitions_and_threads(fake) -> None:  # type: ignore[no-untyped-def]
    """Callers on several threads, round robin over 3 partitions, a buffer smaller than
    the open runs could take: every record acked once, the bound held, nothing left over."""
    import threading

    srv, coord = fake
    seen_max = []
    with make(coord, topic="t", buffer_records_max=300, batch_records_max=100) as p:
        futs: list[list] = [[] for _ in range(4)]

        def worker(k: int) -> None:
            for i in range(1500):
                futs[k].append(p.send(b"w%d-%d" % (k, i) if i % 7 else b"x" * (i % 13)))
                if i % 100 == 0:
                    with p._lock:
                        seen_max.append(p._acc.used)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        p.flush()
        metas = [f.result(5) for fs in futs for f in fs]
        assert p._unresolved == 0 and p._acc.used == 0
    assert max(seen_max) <= 300
    assert sum(len(srv.records("t", i)) for i in range(3)) == 6000
    assert_exactly_once(srv, "t", 3, metas)
    assert sorted((m.partition, m.sequence_id) for m in metas) == sorted(
        (q, s) for q in range(3) for s in range(Counter(m.partition for m in metas)[q])
    )


def test_records_linger_without_flush_and_keep_admission_order(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with make(coord, topic="one", linger_ms=20, batch_records_max=10) as p:
        futs = [p.send(b"r%d" % i) for i in range(25)]  # 2 full runs and an open one
        assert [f.result(5).sequence_id for f in futs] == list(range(25))  # no flush
        late = p.send(b"late", key=b"k")
        assert late.result(5).sequence_id == 25
    assert [r.value for r in srv.records("one", 0)] == [b"r%d" % i for i in range(25)] + [b"late"]


def test_untrusted_server_certificate_fails_at_once_not_retried(fake) -> None:  # type: ignore[no-untyped-def]
    """A connect that fails as Unauthorized (pidlease/wire/tls.py: a server certificate the CA
    does not vouch for) is not retried until the delivery timeout: the records and the
    producer fail with it at once."""
    _, coord = fake
    p = make(coord, topic="one", delivery_timeout_ms=15_000)  # bounded even if it were retried
    calls = []

    async def untrusted(partition: int) -> object:
        calls.append(partition)
        raise errors.Unauthorized("TLS: certificate verification failed")

    try:
        p._engine._pool.connection_for = untrusted  # type: ignore[method-assign,union-attr]
        started = time.monotonic()
        fut = p.send(b"x")
        with pytest.raises(errors.Unauthorized):
            fut.result(10)
        assert time.monotonic() - started < 5
        assert len(calls) == 1
        with pytest.raises(errors.Unauthorized):
            p.send(b"later")
    finally:
        p.close(timeout_ms=2_000)
