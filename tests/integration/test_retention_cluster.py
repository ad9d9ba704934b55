"""Retention on a real partition server (issue 13): a topic with a short ``retention_ms``
and small segments loses its old segments, ``log_start_offset`` moves, the active segment
stays, a read below the start is OFFSET_OUT_OF_RANGE with both bounds, and a producer idle
while every segment it wrote went resumes with no UNKNOWN_PID and no duplicate, also
after a SIGKILL and restart of the server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, token
from pidlease.wire.cluster import (
    PartitionState,
    TopicSpec,
    connect_zk,
    partition_path,
    topic_path,
)
from tests.helpers import wait_for

SEG = 4096
ENV = {
    "PIDLEASE_FSYNC_INTERVAL_MS": "1",
    "PIDLEASE_SEGMENT_BYTES_MAX": str(1 << 20),  # the topic's segment_bytes must win
    "PIDLEASE_RETENTION_CHECK_MS": "100",
    "PIDLEASE_SNAPSHOT_INTERVAL_MS": "200",
}


def create_short_retention_topic(zk_hosts: str, name: str) -> None:
    spec = TopicSpec(
        name, 1, created_ms=int(time.time() * 1000), retention_ms=1_500, segment_bytes=SEG
    )
    zk = connect_zk(zk_hosts)
    try:
        zk.create(topic_path(name), spec.to_bytes())
        zk.create(partition_path(name, 0), PartitionState([1], 1, 0, [1]).to_bytes(), makepath=True)
    finally:
        zk.stop()
        zk.close()


def entry(c: WireClient, topic: str) -> dict[str, Any]:
    e = entry_or_none(c, topic)
    assert e is not None, f"{topic} not in the server's METADATA"
    return e


def entry_or_none(c: WireClient, topic: str) -> dict[str, Any] | None:
    """The partition's METADATA entry, or None while the server has not opened it yet (a
    follower learns its assignment from ZooKeeper a moment after the leader)."""
    md = c.metadata()
    return next((p for p in md["partitions"] if p["topic"] == topic), None)


def test_short_retention_deletes_old_segments_and_an_idle_producer_resumes(
    make_cluster, zk_hosts
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    svc = cluster.servers[0]
    part_dir = cluster.data_dir / f"server-{svc.ident}" / "data" / "r-0"
    create_short_retention_topic(zk_hosts, "r")
    idle, busy = token(DEV_SECRET, 7, 1), token(DEV_SECRET, 8, 1)
    with WireClient(svc.address) as c:
        for seq in range(5):
            r = c.produce("r", 0, batch(7, 1, seq, [b"idle-%d" % seq]), idle)
            assert r.error_code == 0, r.detail
        assert r.last_offset == 4
        for seq in range(40):
            r = c.produce("r", 0, batch(8, 1, seq, [b"x" * 500]), busy)
            assert r.error_code == 0, r.detail
        assert len(list(part_dir.glob("*.log"))) >= 5
        # PID 7's batches (offsets 0..4) sit in the oldest segment; PID 8 keeps writing
        # (a fresh active segment) until retention has taken every older one.
        seq8 = 40

        def gone() -> dict[str, Any] | None:
            nonlocal seq8
            r = c.produce("r", 0, batch(8, 1, seq8, [b"y" * 500]), busy)
            assert r.error_code == 0, r.detail
            seq8 += 1
            e = entry(c, "r")
            return e if e["log_start_offset"] >= 45 else None

        wait_for(gone, 30, "retention to delete the old segments", interval_s=0.2)

        # Nothing written now: every closed segment ages out, the active one stays.
        def only_active() -> list[Path] | None:
            fs = sorted(part_dir.glob("*.log"))
            return fs if len(fs) == 1 else None

        files = wait_for(only_active, 30, "only the active segment left")
        e = entry(c, "r")
        start = e["log_start_offset"]
        assert int(files[0].name[:-4]) == start
        assert e["log_end_offset"] > start and e["size_bytes"] > 0  # the active one stays
        assert e["size_bytes"] == sum(f.stat().st_size for f in files)
        r = c.fetch("r", 0, 0)
        assert r.error_code == errors.OffsetOutOfRange.code
        assert r.log_start_offset == start and r.high_watermark >= e["high_watermark"]
        r = c.fetch("r", 0, start)
        assert r.error_code == 0 and r.log_start_offset == start
        # The idle producer resumes: its resend is a DUPLICATE, its next batch appends.
        r = c.produce("r", 0, batch(7, 1, 4, [b"idle-4"]), idle)
        assert r.error_code == errors.DUPLICATE, (r.error_code, r.detail)
        assert (r.base_offset, r.last_offset) == (4, 4)
        r = c.produce("r", 0, batch(7, 1, 5, [b"idle-5"]), idle)
        assert r.error_code == 0, r.detail
    cluster.restart(svc)  # SIGKILL, then start again
    with WireClient(svc.address) as c:
        e = entry(c, "r")
        assert e["log_start_offset"] >= start
        r = c.produce("r", 0, batch(7, 1, 5, [b"idle-5"]), idle)
        assert r.error_code == errors.DUPLICATE, (r.error_code, r.detail)
        r = c.produce("r", 0, batch(7, 1, 6, [b"idle-6"]), idle)
        assert r.error_code == 0, r.detail
        r = c.produce("r", 0, batch(8, 1, seq8, [b"y"]), busy)
        assert r.error_code == 0, r.detail


def test_r3_every_replica_deletes_and_an_idle_producer_resumes_after_a_failover(
    make_cluster, zk_hosts
) -> None:  # type: ignore[no-untyped-def]
    env = {
        **ENV,
        "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
        "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
        "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
    }
    cluster = make_cluster(servers=3, coordinators=0, env=env)
    spec = TopicSpec(
        "r3",
        1,
        replication_factor=3,
        created_ms=int(time.time() * 1000),
        retention_ms=1_500,
        segment_bytes=SEG,
    )
    zk = connect_zk(zk_hosts)
    try:
        zk.create(topic_path("r3"), spec.to_bytes())
        zk.create(
            partition_path("r3", 0),
            PartitionState([1, 2, 3], 1, 0, [1, 2, 3]).to_bytes(),
            makepath=True,
        )
    finally:
        zk.stop()
        zk.close()
    idle, busy = token(DEV_SECRET, 7, 1), token(DEV_SECRET, 8, 1)
    leader = cluster.server(1)

    def entries() -> list[dict[str, Any]]:
        out = []
        for svc in cluster.servers:
            if svc.alive:
                with WireClient(svc.address) as c:
                    e = entry_or_none(c, "r3")
                if e is not None:
                    out.append(e)
        return out

    with WireClient(leader.address) as c:
        r = wait_for(
            lambda: (
                (r := c.produce("r3", 0, batch(7, 1, 0, [b"idle-0"]), idle)).error_code == 0 and r
            ),
            30,
            "the leader to take produces",
            interval_s=0.2,
        )
        for seq in range(1, 5):
            r = c.produce("r3", 0, batch(7, 1, seq, [b"idle-%d" % seq]), idle)
            assert r.error_code == 0, r.detail
        seq8 = 0

        def all_deleted() -> bool:
            nonlocal seq8
            r = c.produce("r3", 0, batch(8, 1, seq8, [b"y" * 500]), busy)
            assert r.error_code == 0, r.detail
            seq8 += 1
            es = entries()
            return len(es) == 3 and all(e["log_start_offset"] >= 5 for e in es)

        wait_for(all_deleted, 60, "retention on every replica past PID 7's batches", interval_s=0.2)
    cluster.kill(leader)

    def new_leader() -> Any:
        for svc in cluster.servers:
            if svc.alive:
                with WireClient(svc.address) as c:
                    e = entry_or_none(c, "r3")
                    if e is not None and e["role"] == "leader":
                        return svc
        return None

    svc = wait_for(new_leader, 60, "a new leader", ignore=(OSError,))
    with WireClient(svc.address) as c:
        r = wait_for(
            lambda: (
                (r := c.produce("r3", 0, batch(7, 1, 4, [b"idle-4"]), idle)).error_code
                not in (errors.NotLeader.code, errors.SequenceUnknown.code)
                and r
            ),
            30,
            "the new leader to answer",
            interval_s=0.2,
        )
        assert r.error_code == errors.DUPLICATE, (r.error_code, r.detail)
        r = c.produce("r3", 0, batch(7, 1, 5, [b"idle-5"]), idle)
        assert r.error_code == 0, r.detail
