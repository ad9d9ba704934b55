"""LIST_OFFSETS and ``Reader(start_timestamp_ms=...)`` on a real cluster (issue 13, item
4): batches with timestamps of our choosing (produced over the wire, as the SDK stamps its
own), then the earliest, latest and by-time offsets the leader answers and the first
record a Reader returns; a follower answers NOT_LEADER naming the leader; after retention
moved the log start, earliest is the new start and a time before it gives the start."""

from __future__ import annotations

import json
import time
from typing import Any

from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pidlease.client.reader import Reader
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, token
from pidlease.wire import protocol as P
from tests.helpers import cli, wait_for

ENV = {
    "PIDLEASE_FSYNC_INTERVAL_MS": "1",
    "PIDLEASE_RETENTION_CHECK_MS": "100",
    "PIDLEASE_SNAPSHOT_INTERVAL_MS": "200",
}
PER_BATCH = 5


def stamped(pid: int, seq: int, ts: int, value: bytes = b"v") -> bytes:
    return P.encode_batch(
        [(None, value)] * PER_BATCH, pid=pid, generation=1, base_sequence=seq, timestamp_ms=ts
    )


def leader_of(url: str, topic: str) -> str:
    def find() -> str | None:
        with LeaseClient(url) as lc:
            return lc.topic(topic).leader_address(0)

    return wait_for(find, 30, f"a leader for {topic}", interval_s=0.2)


def produce_all(address: str, topic: str, pid: int, stamps: list[int], value: bytes) -> None:
    tok = token(DEV_SECRET, pid, 1)
    with WireClient(address) as c:
        for i, ts in enumerate(stamps):
            b = stamped(pid, i * PER_BATCH, ts, value)
            # The first produce may race the partition's opening on a fresh topic.
            r = wait_for(
                lambda b=b: (
                    (r := c.produce(topic, 0, b, tok)).error_code
                    not in (errors.NotLeader.code, errors.UnknownTopicOrPartition.code)
                    and r
                ),
                30,
                "the leader to take produces",
                interval_s=0.2,
            )
            assert r.error_code == 0, r.detail
            assert r.base_offset == i * PER_BATCH


def first_and_end(url: str, topic: str, **start: Any) -> tuple[int | None, int]:
    """The first offset a Reader started with ``start`` returns, and where it ends."""
    with Reader(url, topic, 0, **start) as rd:
        offs = [r.offset for r in rd]
        assert offs == list(range(offs[0], rd.position)) if offs else True
        return (offs[0] if offs else None), rd.position


def test_list_offsets_and_a_reader_start_by_time_on_a_replicated_partition(
    make_cluster,
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=3, env=ENV)
    url = cluster.coordinator_url
    cluster.create_topic("ts", partitions=1, replication_factor=3)
    leader = leader_of(url, "ts")
    # Producers' clocks need not agree: 3_000 is written before 2_000.
    produce_all(leader, "ts", 7, [1_000, 3_000, 2_000, 4_000], b"v")  # offsets 0 5 10 15
    with WireClient(leader) as c:
        want = {
            P.EARLIEST_TIMESTAMP: 0,
            P.LATEST_TIMESTAMP: 20,
            0: 0,
            1_000: 0,
            1_001: 5,  # 3_000 at offset 5 is the first batch at or after it
            2_000: 5,
            3_001: 15,
            4_000: 15,
            4_001: 20,  # none that new: the high watermark, where a reader waits
            10**13: 20,
        }
        for ts, offset in want.items():
            r = c.list_offsets("ts", 0, ts)
            assert r.error_code == 0, (ts, r.detail)
            assert (r.offset, r.log_start_offset, r.high_watermark) == (offset, 0, 20), ts
        r = c.list_offsets("ts", 0, -3)
        assert r.error_code == errors.InvalidRequest.code and "-3" in r.detail
        r = c.list_offsets("ts", 4, 0)
        assert r.error_code == errors.UnknownTopicOrPartition.code, r.detail
        assert c.metadata()["server_id"] > 0  # the connection still serves
    for svc in cluster.servers:
        if svc.address == leader:
            continue
        with WireClient(svc.address) as c:
            r = wait_for(
                lambda c=c: (
                    (r := c.list_offsets("ts", 0, 0)).error_code
                    != errors.UnknownTopicOrPartition.code
                    and r
                ),
                30,
                "the follower to know the partition",
                interval_s=0.2,
            )
            assert r.error_code == errors.NotLeader.code, (r.error_code, r.detail)
            assert r.leader == leader
    assert first_and_end(url, "ts", start_timestamp_ms=1_001) == (5, 20)
    assert first_and_end(url, "ts", start_timestamp_ms=3_001) == (15, 20)
    assert first_and_end(url, "ts", start_timestamp_ms=4_001) == (None, 20)
    assert first_and_end(url, "ts", start="earliest") == (0, 20)
    assert first_and_end(url, "ts", start="latest") == (None, 20)
    # The CLI's start options are the Reader's.
    out = cli("consume", "ts", "--from-time", "1970-01-01T00:00:03.001Z", "--json", url=url)
    assert out.returncode == 0, out.stderr
    assert [json.loads(x)["offset"] for x in out.stdout.splitlines()] == list(range(15, 20))
    out = cli("consume", "ts", "--from", "latest", url=url)
    assert (out.returncode, out.stdout) == (0, ""), out.stderr


def test_after_retention_earliest_is_the_new_log_start(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, env=ENV)
    url = cluster.coordinator_url
    # Ten minutes of retention and 4 KiB segments: batches stamped two hours ago go as soon
    # as their segment is closed, the ones stamped now stay.
    cluster.create_topic("old", partitions=1, retention_ms=600_000, segment_bytes=4096)
    leader = leader_of(url, "old")
    now = int(time.time() * 1000)
    old = [now - 7_200_000 + i for i in range(12)]
    new = [now + i for i in range(6)]
    produce_all(leader, "old", 8, old + new, b"x" * 120)  # ~650-byte batches
    first_new = len(old) * PER_BATCH
    with WireClient(leader) as c:

        def moved() -> P.Response | None:
            r = c.list_offsets("old", 0, P.EARLIEST_TIMESTAMP)
            assert r.error_code == 0, r.detail
            return r if r.offset > 0 else None

        r = wait_for(moved, 30, "retention to delete the old segments", interval_s=0.2)
        start = r.offset
        assert 0 < start <= first_new and start % PER_BATCH == 0
        assert (r.log_start_offset, r.high_watermark) == (start, first_new + 6 * PER_BATCH)
        r = c.list_offsets("old", 0, old[0])  # a time before the log start: the start
        assert (r.error_code, r.offset) == (0, start)
        r = c.list_offsets("old", 0, new[0])
        assert (r.error_code, r.offset) == (0, first_new)
        assert c.fetch("old", 0, 0).error_code == errors.OffsetOutOfRange.code
    end = first_new + 6 * PER_BATCH
    assert first_and_end(url, "old", start="earliest") == (start, end)
    assert first_and_end(url, "old", start_timestamp_ms=0) == (start, end)
    assert first_and_end(url, "old", start_timestamp_ms=new[2]) == (first_new + 10, end)
