"""Snapshots of a follower whose log is cut while they are taken (docs/reliability.md,
finding 4): an image must never mix producer state from before a cut with a truncation count
from after it, or recovery trusts rows that describe batches no longer in the log (a cut batch
answered DUPLICATE, never committed) and skips batches the rows do not describe (a resend
appended twice)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from partition_server.flusher import Flusher
from partition_server.log_manager import LogManager
from partition_server.producer_state import Outcome
from partition_server.registry import Registry
from partition_server.settings import ServerSettings
from partition_server.snapshot import Snapshot, SnapshotStore
from partition_server.testing import b, open_part, outcome, stored


def test_rows_captured_before_a_cut_are_not_trusted_at_recovery(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path / "data", Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 1, "127.0.0.1:1")
        # pid 1: sequences 0-1 at 0..1 and 2-3 at 2..3; pid 2: sequence 0 at 4
        part.append_replicated(memoryview(stored([b(1, 0, 2), b(1, 2, 2), b(2, 0)])), [(1, 0)])
        await part.wait_flushed(5)
        part.set_high_watermark(2)
        assert part.state.pids() == [1, 2]  # the capture exports pid 1, then yields

        async def fetcher_session() -> None:
            # The next session with a new leader: its epoch 2 began at 2, so pid 1's
            # sequences 2-3 and pid 2's batch were never committed; the new leader holds
            # pid 9's batch there instead.
            part.truncate_to(2)
            part.append_replicated(memoryview(stored([b(9, 0, 3)], 2)), [(1, 0), (2, 2)])

        cut = asyncio.get_running_loop().create_task(fetcher_session())
        image = await part.capture(chunk_pids=1)  # yields between pids: the cut runs there
        await cut
        await part.wait_flushed(image.covered_to)
        store = SnapshotStore(tmp_path / "snapshots")
        snap = Snapshot(1)
        snap.partitions[("t", 0)] = image
        store.write(snap)
        await part.flusher.wait_idle()
        part.close()

        loaded = store.load_newest()
        assert loaded is not None
        again = open_part(
            tmp_path / "data",
            Flusher(mode="batch", interval_ms=0),
            hw=2,
            snapshot=loaded[0].partitions[("t", 0)],
        )
        # pid 1's resend of the cut sequences 2-3 must be written, not answered DUPLICATE
        assert outcome(again, 1, 2, 2) is Outcome.APPEND
        assert outcome(again, 2, 0, 1) is Outcome.APPEND
        # pid 9's batch is in the log: its resend must not be appended a second time
        assert again.state.get(9) is not None
        assert outcome(again, 9, 0, 3) is not Outcome.APPEND
        await again.flusher.wait_idle()
        again.close()

    asyncio.run(go())


def test_a_snapshot_leaves_out_a_partition_cut_below_what_it_waits_for(tmp_path: Path) -> None:
    """The snapshot waits until each captured end is fsynced. A cut below that end (the
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
