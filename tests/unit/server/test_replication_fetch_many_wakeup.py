"""A leader holds a follower's REPLICA_FETCH_MANY while none of its partitions has anything
new, and answers it at the first append to any of them, not when every one has had one
(found through issue 25: an acks=all produce or a group's offset commit on a 2-server
cluster took ``replica_fetch_wait_max_ms``, 500 ms, one time in two, because the follower
fetches every partition it follows there in one request: consumer groups sharing a
group with librdkafka committed 200 records in 37 s). A real leader ``ReplicaManager``
with two real partitions, a fake ZooKeeper."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

from partition_server.flusher import Flusher
from partition_server.replication import ReplicaManager
from partition_server.testing import InlineExecutor, b, open_part
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState
from pidlease.wire.framing import unpack_header
from tests.helpers import ManualClock
from tests.sim.zk import partition_zk

WAIT_MS = 5_000  # the follower's fetch may be held this long when nothing comes


def request(entries: list[P.ReplicaFetchEntry]) -> P.Request:
    frame = P.replica_fetch_many_request(
        1,
        entries,
        replica_id=2,
        max_wait_ms=WAIT_MS,
        max_bytes=1 << 20,
        partition_max_bytes=1 << 20,
    )
    assert unpack_header(frame[:4]) == len(frame) - 4
    return P.decode_request(frame[4:])


def test_a_held_fetch_is_answered_at_the_first_append_to_any_of_its_partitions(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        flusher = Flusher(mode="batch", interval_ms=0, executor=InlineExecutor())
        parts = {}
        for i in range(3):
            part = open_part(tmp_path / str(i), flusher, partition=i, clock_ms=clock)
            part.hosted = True
            part.become_leader(1, 1, [1, 2], [1, 2])
            parts[("t", i)] = part
        settings = SimpleNamespace(
            server_id=1,
            routes={},
            replica_lag_time_max_ms=10_000,
            isr_change_min_interval_ms=0,
            replica_fetch_wait_max_ms=WAIT_MS,
            fetch_bytes_max=1 << 20,
            frame_bytes_max=1 << 21,
        )
        registry = SimpleNamespace(
            zk=partition_zk(PartitionState([1, 2], 1, 1, [1, 2])),
            refresh=lambda: None,
            assignment=None,
        )
        mgr = ReplicaManager(
            settings, registry, parts, tmp_path, clock_ms=clock, zk_executor=InlineExecutor()
        )
        # The follower has everything (offset 0, high watermark 0) in all three.
        held = asyncio.create_task(
            mgr.replica_fetch_many(
                request([P.ReplicaFetchEntry("t", i, 1, 0, 0) for i in range(3)])
            )
        )
        await asyncio.sleep(0.05)
        assert not held.done(), "nothing new: the leader holds the fetch"
        t0 = time.monotonic()
        part = parts[("t", 1)]
        raw = bytearray(b(7, 0))
        part.append(memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=1)
        answer = await asyncio.wait_for(held, WAIT_MS / 1000 + 5)
        took = time.monotonic() - t0
        resp = P.decode_response(P.REPLICA_FETCH_MANY, answer[4:])
        assert [(f.topic, f.partition) for f in resp.fetched or []] == [("t", 1)]
        assert len(bytes(resp.fetched[0].data)) == len(raw)  # type: ignore[index]
        assert took < 1.0, f"answered {took:.2f} s after the append (held for the others)"

    asyncio.run(go())
