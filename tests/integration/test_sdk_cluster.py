"""The SDK against a real cluster (ZooKeeper, coordinator and partition server processes):
produce and read back, zombie fencing, retries answered with their original offsets, lease
renewal, replayable sources with explicit sequence ids."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pidlease import errors
from pidlease.client.connection import BlockingConnection
from pidlease.client.lease_client import LeaseClient
from pidlease.client.producer import AsyncProducer, Producer
from pidlease.client.reader import Reader
from pidlease.wire import protocol as P


def test_produce_and_read_back(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=2)
    c.create_topic("orders", partitions=3)
    with Producer(c.coordinator_url, topic="orders") as p:
        assert p.pid > 0 and 0 <= p.generation < 2**31
        futs = [p.send(b"order-%d" % i, key=b"customer-%d" % (i % 13)) for i in range(3000)]
        p.flush()
        metas = [f.result(30) for f in futs]
        last = [p.last_sequence_id(q) for q in range(3)]
    got = {q: list(Reader(c.coordinator_url, "orders", partition=q)) for q in range(3)}
    assert sum(len(v) for v in got.values()) == 3000
    for q, recs in got.items():
        assert [r.sequence_id for r in recs] == list(range(len(recs)))
        assert last[q] == len(recs) - 1
        assert all(r.pid == p.pid and r.generation == p.generation for r in recs)
    by_key: dict[bytes, set[int]] = {}
    for q, recs in got.items():
        for r in recs:
            assert r.key is not None
            by_key.setdefault(r.key, set()).add(q)
    assert all(len(parts) == 1 for parts in by_key.values()), "a key always lands on one partition"
    for m in metas:
        rec = got[m.partition][m.offset]
        assert rec.offset == m.offset and rec.sequence_id == m.sequence_id


def test_async_producer(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("a", partitions=1)

    async def main() -> list:
        p = await AsyncProducer.create(c.coordinator_url, "a", producer_name="async-one")
        try:
            futs = [await p.send(b"%d" % i) for i in range(500)]
            await p.flush()
            return [await f for f in futs]
        finally:
            await p.close()

    metas = asyncio.run(main())
    assert [m.offset for m in metas] == list(range(500))


@pytest.mark.parametrize(
    "zombie_partition", [0, 1], ids=["written-partition", "leased-only-partition"]
)
def test_zombie_is_fenced_though_the_new_owner_sent_nothing(
    make_cluster, zombie_partition: int
) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("z", partitions=2)
    a = Producer(c.coordinator_url, topic="z", producer_name="X")
    try:
        a.send(b"a-0", partition=0).result(30)
        b = Producer(c.coordinator_url, topic="z", producer_name="X")
        try:
            assert b.pid == a.pid and b.generation != a.generation
            assert b.last_sequence_id(0) == 0 and b.last_sequence_id(1) == -1
            # B has sent nothing; A's next send is refused all the same
            with pytest.raises(errors.ProducerFenced):
                a.send(b"zombie", partition=zombie_partition).result(30)
            with pytest.raises(errors.ProducerFenced):
                a.send(b"zombie-again")
            assert b.send(b"b-1", partition=0).result(30).sequence_id == 1
        finally:
            b.close()
    finally:
        a.close()
    recs = list(Reader(c.coordinator_url, "z", 0, include_control=True))
    data = [r for r in recs if not r.is_control]
    assert [r.value for r in data] == [b"a-0", b"b-1"]
    assert any(r.is_control and r.generation == b.generation for r in recs), (
        "fence record in the log"
    )


def test_retry_of_any_of_the_last_k_batches_returns_its_original_offsets(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("k", partitions=1)
    with LeaseClient(c.coordinator_url) as lc:
        lease = lc.lease("k", 0, -1)
        leader = lc.topic("k").leader_address(0)
    assert leader
    pid, gen = lease.pid, lease.generation
    batches = [
        P.encode_batch(
            [(None, b"b%d-%d" % (k, j)) for j in range(3)],
            pid=pid,
            generation=gen,
            base_sequence=3 * k,
            timestamp_ms=1,
        )
        for k in range(8)
    ]

    def produce(conn: BlockingConnection, batch: bytes) -> P.Response:
        return conn.request(
            P.PRODUCE, lambda corr: P.produce_request(corr, "k", 0, lease.lease_token, batch)
        )

    with BlockingConnection(leader) as conn:
        first = []
        for b in batches:
            r = produce(conn, b)
            assert r.error_code == errors.NONE, r.detail
            first.append((r.base_offset, r.last_offset))
        # any of the last K=5 batches: DUPLICATE with the offsets it was first written at
        for k in range(3, 8):
            r = produce(conn, batches[k])
            assert r.error_code == errors.DUPLICATE
            assert (r.base_offset, r.last_offset) == first[k]
        # older ones are still duplicates (nothing appended), offsets no longer known
        r = produce(conn, batches[0])
        assert r.error_code == errors.DUPLICATE and r.base_offset == -1
    assert [x.value for x in Reader(c.coordinator_url, "k", 0)] == [
        b"b%d-%d" % (k, j) for k in range(8) for j in range(3)
    ]


def _block_loop_then_drop(p: Producer, block_s: float) -> None:
    """Once every in-flight batch has been written, freeze the producer's event loop (so
    the server's answers wait unread in the socket), then cut the connections: the answers
    are lost and the batches must be resent."""
    eng = p._engine

    async def freeze_and_cut() -> None:
        for _ in range(1000):
            if all(b.response is not None for s in eng._senders for b in s.in_flight if not b.done):
                break
            await asyncio.sleep(0.001)
        time.sleep(block_s)  # noqa: ASYNC251 - deliberately blocking: nothing reads the answers meanwhile
        eng.drop_connections()

    asyncio.run_coroutine_threadsafe(freeze_and_cut(), p._loop).result(30)


def test_resent_batches_are_acked_as_duplicates_with_their_original_offsets(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("d", partitions=1)
    metas = []
    with Producer(c.coordinator_url, topic="d", batch_records_max=10, linger_ms=0) as p:
        for attempt in range(10):
            futs = [p.send(b"r%d-%d" % (attempt, i)) for i in range(40)]
            _block_loop_then_drop(p, 0.3 + 0.2 * attempt)
            p.flush()
            metas += [f.result(30) for f in futs]
            if any(m.duplicate for m in metas):
                break
        assert p.stats["batches_resent"] > 0
    dups = [m for m in metas if m.duplicate]
    assert dups, "no resend was answered DUPLICATE in 10 attempts"
    log = {r.offset: r for r in Reader(c.coordinator_url, "d", 0)}
    assert len(log) == len(metas)
    for m in metas:
        assert m.offset >= 0 and log[m.offset].sequence_id == m.sequence_id


def test_lease_renewal_keeps_a_short_lease_alive(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("r", partitions=2)
    with Producer(c.coordinator_url, topic="r", expire_ms=1000) as p:
        deadline = time.monotonic() + 3.5  # several lifetimes of the lease
        n = 0
        while time.monotonic() < deadline:
            p.send(b"%d" % n).result(30)
            n += 1
            time.sleep(0.02)
        assert p.stats["retries"] == 0
    with LeaseClient(c.coordinator_url) as lc:
        rows = [x for x in lc.pids() if x["pid"] == p.pid]
    assert rows and rows[0]["generation"] == p.generation


def test_replayable_source_resumes_with_explicit_sequence_ids(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("file", partitions=1, dedup="monotonic")
    offsets_in_file = [0, 17, 40, 41, 90, 200, 201, 350]
    with Producer(c.coordinator_url, topic="file", producer_name="file-loader") as p:
        for s in offsets_in_file[:5]:
            p.send(b"line@%d" % s, sequence_id=s)
        p.flush()
    # the loader restarts and replays the whole file: the first part is recognised
    with Producer(c.coordinator_url, topic="file", producer_name="file-loader") as p:
        assert p.last_sequence_id(0) == 90
        futs = [p.send(b"line@%d" % s, sequence_id=s) for s in offsets_in_file]
        p.flush()
        metas = [f.result(30) for f in futs]
    assert [m.duplicate for m in metas] == [True] * 5 + [False] * 3
    assert [r.sequence_id for r in Reader(c.coordinator_url, "file", 0)] == offsets_in_file


def test_reader_follows_a_restarted_leader(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("f", partitions=1)
    with Producer(c.coordinator_url, topic="f", batch_records_max=50) as p:
        for i in range(500):
            p.send(b"%-200d" % i)
        p.flush()
    rd = Reader(c.coordinator_url, "f", 0, fetch_bytes_max=4096)
    it = iter(rd)
    head = [next(it) for _ in range(10)]
    c.restart(c.servers[0])  # SIGKILL and start again
    rest = list(it)
    assert [int(r.value) for r in head + rest] == list(range(500))


def test_producer_rides_out_a_coordinator_outage_longer_than_its_lease(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("o", partitions=1)
    coord = c.coordinators[0]
    with Producer(c.coordinator_url, topic="o", expire_ms=1000) as p:
        assert p.send(b"before").result(30).offset == 0
        c.kill(coord)
        time.sleep(1.5)  # the token expires meanwhile: sends must wait, not be refused
        pending = p.send(b"during")
        assert not pending.done() or pending.result(0).offset == 1
        c.start_service(coord)
        assert pending.result(60).offset == 1
        assert p.send(b"after").result(30).offset == 2
    assert [r.value for r in Reader(c.coordinator_url, "o", 0)] == [b"before", b"during", b"after"]


def test_a_takeover_mid_stream_says_which_records_may_have_landed(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """A sends to 3 partitions without pause; B takes the name over. Every A future is
    acked (in the log), ProducerFenced not indeterminate (not in the log), or
    indeterminate, which B's last_sequence_id settles: landed iff it is at or above the
    batch's last sequence. B resumes right after what is in the log."""
    c = make_cluster(servers=2)
    c.create_topic("mid", partitions=3)
    a = Producer(
        c.coordinator_url, topic="mid", producer_name="M", batch_records_max=20, linger_ms=0
    )
    futs = []
    taken: list[Producer] = []
    refused_at_send: errors.ProducerFenced | None = None

    def take_over() -> None:
        time.sleep(0.3)  # while A sends
        taken.append(Producer(c.coordinator_url, topic="mid", producer_name="M"))

    t = threading.Thread(target=take_over)
    b = None
    try:
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                futs.append(a.send(b"r%d" % len(futs)))
            except errors.ProducerFenced as exc:
                refused_at_send = exc
                break
            if len(futs) % 200 == 0:
                time.sleep(0.002)  # batches go out while A sends on
        t.join(30)
        b = taken[0]
        assert refused_at_send is not None, "A was fenced while sending"
        assert refused_at_send.indeterminate is False  # refused at send: nothing sent
        a.flush()
        resume = [b.last_sequence_id(q) for q in range(3)]
    finally:
        a.close(5000)
        if b is not None:
            b.close()
    logged = {
        q: {r.sequence_id for r in Reader(c.coordinator_url, "mid", q) if r.pid == a.pid}
        for q in range(3)
    }
    assert resume == [max(logged[q], default=-1) for q in range(3)]
    kinds = {"acked": 0, "not written": 0, "landed": 0, "did not land": 0}
    for f in futs:
        exc = f.exception(30)
        if exc is None:
            m = f.result()
            assert m.sequence_id in logged[m.partition]
            kinds["acked"] += 1
            continue
        assert isinstance(exc, errors.ProducerFenced), exc
        q = exc.partition
        assert q is not None
        if exc.first_sequence is None:  # never numbered: never sent
            assert exc.indeterminate is False
            kinds["not written"] += 1
            continue
        assert exc.last_sequence is not None
        seqs = set(range(exc.first_sequence, exc.last_sequence + 1))
        if not exc.indeterminate:
            assert not seqs & logged[q], "a batch said not written is in the log"
            kinds["not written"] += 1
        else:
            landed = resume[q] >= exc.last_sequence
            assert (seqs <= logged[q]) == landed and (seqs & logged[q] == set()) != landed
            kinds["landed" if landed else "did not land"] += 1
    assert kinds["acked"] + kinds["landed"] == sum(len(s) for s in logged.values())
    print("outcomes:", kinds)
