"""``LogManager`` (partition_server/log_manager.py): snapshots of every partition it holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

from partition_server.log_manager import LogManager
from partition_server.registry import Registry
from partition_server.settings import ServerSettings
from partition_server.testing import b, open_part, stored


def test_a_snapshot_leaves_out_a_partition_cut_below_what_it_waits_for(tmp_path: Path) -> None:
    """docs/reliability.md finding 4: a snapshot leaves out a partition cut below what it
    waits for.

    The snapshot waits until each captured end is fsynced. A cut below that end (the
    follower's fetcher reconciling meanwhile) may leave it unreachable: the snapshot must
    neither wait for it forever nor keep that image."""

    async def go() -> None:
        settings = ServerSettings(
            data_dir=str(tmp_path), fsync="interval", fsync_interval_ms=10_000, server_id=1
        )
        log_manager = LogManager(settings, Registry("127.0.0.1:1", 1))
        a = open_part(tmp_path, log_manager.flusher)
        c = open_part(tmp_path, log_manager.flusher, partition=1)
        log_manager.partitions[("t", 0)] = a
        log_manager.partitions[("t", 1)] = c
        for p in (a, c):
            p.become_follower(2, 1, "127.0.0.1:1")
            p.append_replicated(memoryview(stored([b(1, 0, 2), b(1, 2, 2), b(1, 4, 2)])), [(1, 0)])
        capture_c = c.capture

        async def cut_a_then_capture_c(chunk_pids: int = 20_000):  # type: ignore[no-untyped-def]
            # t-0's fetcher reconciles with a leader whose log diverges at 2, after the
            # snapshot captured t-0 up to 6 and before anything fsynced it
            a.truncate_to(2)
            return await capture_c(chunk_pids)

        c.capture = cut_a_then_capture_c  # type: ignore[method-assign]
        await asyncio.wait_for(log_manager.snapshot_now(), 10)
        loaded = log_manager.snapshots.load_newest()
        assert loaded is not None
        assert ("t", 0) not in loaded[0].partitions  # replayed from its log at recovery
        assert loaded[0].partitions[("t", 1)].covered_to == 6
        await log_manager.flusher.wait_idle()
        for p in (a, c):
            p.close()

    asyncio.run(go())
