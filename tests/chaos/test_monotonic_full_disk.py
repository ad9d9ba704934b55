"""A monotonic topic on a disk that fills and then grows (docs/reliability.md, finding 2): a
partition server's data dir is an 8 MiB tmpfs (``mount -t tmpfs``, needs root; skipped with
the reason otherwise). Producers pipeline (``max_in_flight`` 5) batches of mixed sizes with explicit
sequence ids, a hole between every two batches, as a replayable source does.

Once the disk is full, a large batch N fails to be written (ENOSPC: SERVER_UNAVAILABLE,
retriable) while a small N+1 behind it still fits in the last page. Before the fix the
partition appended N+1 (a monotonic topic takes any base above the highwater) and answered
N's resend DUPLICATE ("at or below the highwater"): acknowledged, never written. The rule
now ("a refusal leaves no hole", docs/protocol.md): N+1 is refused until N is resent. After the
filesystem is grown every send completes; every acknowledged record must be in the log
exactly once, at the offset it was acknowledged at. Each run prints its seed
(``PIDLEASE_CHAOS_SEED=N`` replays the plan; the disk's timing is the kernel's)."""

from __future__ import annotations

import random
import shutil
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from checker import Acked, check, read_topic
from fulldisk import acked_count, failed_count, mount, wait_stalled
from runner import SERVER_ENV

from pidlease.client.producer import Producer, RecordMetadata
from pidlease.testing.devcluster import LocalCluster

TOPIC = "tmpfs-mono"
PRODUCERS = 3
BYTES_PER_PRODUCER = 4 * 1024 * 1024  # 12 MiB of values in all: more than the 8 MiB disk
STALL_S = 4.0  # no new acks for this long while full: the disk is full
WAIT_S = 40.0  # each phase's bound


def plan(rng: random.Random, budget: int) -> list[tuple[int, int, int]]:
    """(first sequence id, records, value bytes) per batch: sizes from one small record to
    about 64 KiB, ids increasing with a hole of 1..50 after every batch."""
    out = []
    seq = rng.randrange(1000)
    used = 0
    while used < budget:
        count = rng.choice((1, 2, 5, rng.randint(1, 40), rng.randint(40, 200)))
        vlen = rng.choice((16, 100, rng.randint(16, 400)))
        out.append((seq, count, vlen))
        used += count * vlen
        seq += count + rng.randint(1, 50)
    return out


@pytest.mark.slow
def test_monotonic_tmpfs_full_then_grown_loses_no_acked_record(tmpfs_cluster, chaos_seed) -> None:  # type: ignore[no-untyped-def]
    cluster, data = tmpfs_cluster
    _run(cluster, data, random.randrange(1 << 30) if chaos_seed is None else chaos_seed)


def _run(cluster: LocalCluster, data: Path, seed: int) -> None:
    rng = random.Random(seed)  # replay: PIDLEASE_CHAOS_SEED=N
    cluster.add_server(1, extra_env=SERVER_ENV)
    cluster.create_topic(TOPIC, partitions=1, dedup="monotonic")
    plans = [plan(rng, BYTES_PER_PRODUCER) for _ in range(PRODUCERS)]
    total = sum(c for p in plans for _, c, _ in p)
    kw = {
        "max_in_flight": 5,
        "linger_ms": 2,
        "request_timeout_ms": 5_000,
        "retry_backoff_max_ms": 300,
        "buffer_records_max": total + 1,
    }
    producers = [
        Producer(cluster.coordinator_url, TOPIC, producer_name=f"mono-{i}", **kw)  # type: ignore[arg-type]
        for i in range(PRODUCERS)
    ]
    try:
        futs: list[list[Future[RecordMetadata]]] = [[] for _ in producers]
        # Interleave the producers batch by batch, each batch one run of contiguous ids.
        for j in range(max(len(p) for p in plans)):
            for i, p in enumerate(producers):
                if j < len(plans[i]):
                    first, count, vlen = plans[i][j]
                    value = rng.randbytes(vlen)
                    futs[i].extend(
                        p.send(value, partition=0, sequence_id=first + k) for k in range(count)
                    )
        every = [f for fs in futs for f in fs]
        wait_stalled(every, stall_s=STALL_S, timeout_s=WAIT_S, interval_s=0.1)
        acked_full, failed_full = acked_count(every), failed_count(every)
        df = shutil.disk_usage(data)
        assert acked_full < total, "the tmpfs never filled"
        assert failed_full == 0, "a full disk must be retried, not fail the sends"
        grown = mount("-o", "remount,size=64m", str(data))
        assert grown.returncode == 0, grown.stderr
        deadline = time.monotonic() + WAIT_S
        metas = [f.result(timeout=max(0.1, deadline - time.monotonic())) for f in every]
        pids = [p.pid for p in producers]
        retries = sum(p.stats.get("retries", 0) for p in producers)
    finally:
        for p in producers:
            p.close()
    acked = []
    for i, fs in enumerate(futs):
        acked.extend(
            Acked(m.partition, pids[i], m.sequence_id, m.offset) for m in (f.result() for f in fs)
        )
    dups = sum(m.duplicate for m in metas)
    rep = check(read_topic(cluster.coordinator_url, TOPIC, 1), acked, strict=False)
    print(
        f"MONOTONIC tmpfs-full: {PRODUCERS} producers, {sum(len(p) for p in plans)} batches, "
        f"{total} records; acked before the disk filled {acked_full} (disk {df.used}/"
        f"{df.total} bytes used), producer retries {retries}, answered DUPLICATE "
        f"{dups}; after remount size=64m: {rep.summary()} (seed {seed})"
    )
    assert rep.acked == total
    assert rep.ok, rep.summary()
