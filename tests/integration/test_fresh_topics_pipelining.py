"""Issue 12, "must show": 200 fresh topics (100 strict, 100 monotonic, 2 partitions each),
each produced to by the SDK immediately after ``POST /v1/topics``, with ``max_in_flight`` 5
and small batches so that many are pipelined on one connection while the partition
servers are still learning about the topic. Every producer must succeed, and every
acknowledged record must be in the log exactly once, in sequence order.

Before the pipelining guarantee (docs/protocol.md), a server parked the first batch of a
fresh partition until it had re-read ZooKeeper while later batches on the same connection
went straight in: strict producers died with OUT_OF_ORDER_SEQUENCE or UNKNOWN_PID, and
monotonic ones were answered DUPLICATE for batches that were never written.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from pidlease.cli.verify import audit
from pidlease.client.producer import AsyncProducer, RecordMetadata
from pidlease.testing.wire import WireClient
from pidlease.wire import protocol as P

TOPICS = 200
PARTITIONS = 2
RECORDS = 400  # per topic, 200 per partition
BATCH_RECORDS = 8  # 25 batches per partition, 5 in flight at a time
CONCURRENT = 30  # topics being created and produced to at once
PACE_S = 0.01  # between two batches' worth of sends
ENV = {"PIDLEASE_FSYNC_INTERVAL_MS": "2"}


Acked = tuple[int, list[RecordMetadata]]  # the producer's pid, its records' metadata


async def _one_topic(url: str, http: httpx.AsyncClient, name: str, dedup: str) -> Acked:
    r = await http.post(
        url + "/v1/topics",
        json={"name": name, "partitions": PARTITIONS, "replication_factor": 1, "dedup": dedup},
    )
    assert r.status_code == 200, r.text
    p = await AsyncProducer.create(
        url,
        name,
        max_in_flight=5,
        linger_ms=1,
        batch_records_max=BATCH_RECORDS,
        delivery_timeout_ms=60_000,
    )
    try:
        futs = []
        for i in range(RECORDS):
            futs.append(await p.send(b"%s-%d" % (name.encode(), i), partition=i % PARTITIONS))
            if i % (BATCH_RECORDS * PARTITIONS) == 0:
                # A steady stream rather than one burst: batches go out over time, so the
                # first ones straddle the servers' ZooKeeper reads of the new topic.
                await asyncio.sleep(PACE_S)
        await p.flush()
        return p.pid, [await f for f in futs]  # raises the producer's error, if it failed
    finally:
        await p.close()


async def _produce_all(url: str, names: list[tuple[str, str]]) -> dict[str, Acked]:
    gate = asyncio.Semaphore(CONCURRENT)

    async def bounded(http: httpx.AsyncClient, name: str, dedup: str) -> Acked:
        async with gate:
            return await _one_topic(url, http, name, dedup)

    async with httpx.AsyncClient(timeout=30) as http:
        results = await asyncio.gather(
            *(bounded(http, n, d) for n, d in names), return_exceptions=True
        )
    failed = [
        (n, repr(r))
        for (n, _), r in zip(names, results, strict=True)
        if isinstance(r, BaseException)
    ]
    assert not failed, f"{len(failed)} of {len(names)} producers failed, e.g. {failed[:5]}"
    return {
        n: r for (n, _), r in zip(names, results, strict=True) if not isinstance(r, BaseException)
    }


def _read_log(addresses: list[str], topic: str, partition: int) -> list[P.Record]:
    """A partition's whole log (control records left out), from whichever server leads it."""
    for a in addresses:
        with WireClient(a) as c:
            if c.fetch(topic, partition, 0, 1).error_code == 0:
                return [r for r in c.read_all(topic, partition) if not r.is_control]
    raise AssertionError(f"no server leads {topic}/{partition}")


def test_200_fresh_topics_produced_to_at_once(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=2, env=ENV)
    names = [(f"fresh-{d}-{i}", d) for i in range(TOPICS // 2) for d in ("strict", "monotonic")]
    started = time.monotonic()
    acked = asyncio.run(_produce_all(cluster.coordinator_url, names))
    took_s = time.monotonic() - started
    addresses = [s.address for s in cluster.servers]
    for name, dedup in names:
        pid, metas = acked[name]
        assert len(metas) == RECORDS and not any(m.duplicate for m in metas), name
        logs = {q: _read_log(addresses, name, q) for q in range(PARTITIONS)}
        report = audit(
            name,
            PARTITIONS,
            dedup,
            lambda q, logs=logs: iter(logs[q]),
            acked=[(m.partition, pid, m.sequence_id) for m in metas],
        )
        assert report.ok, report.summary()
        for q, recs in logs.items():
            # Exactly the sends, in the order sent, at the offsets the producer was told.
            assert [r.value for r in recs] == [
                b"%s-%d" % (name.encode(), i) for i in range(q, RECORDS, PARTITIONS)
            ], (name, q)
            assert [r.sequence_id for r in recs] == list(range(len(recs))), (name, q)
            assert [m.offset for m in metas if m.partition == q] == [r.offset for r in recs]
    print(f"{TOPICS} fresh topics x {RECORDS} records produced in {took_s:.1f} s")
