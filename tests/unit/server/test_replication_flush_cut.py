"""A follower's flushed end across a cut of its log (docs/reliability.md, finding 3): a flush that
began before ``truncate_to`` covered the old log, not the batches fetched after the cut,
so its completion must not call them fsynced (the follower's next fetch reports its log
end to the leader as held durably, and the leader counts it for the high watermark).
Fsyncs are held by an executor and completed exactly where each test wants."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from partition_server.flusher import Flusher
from partition_server.testing import HeldExecutor, b, open_part, settle, stored


def test_a_flush_from_before_a_cut_does_not_cover_batches_fetched_after_it(tmp_path: Path) -> None:
    async def go() -> None:
        ex = HeldExecutor()
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0, executor=ex))
        part.become_follower(1, 1, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2), b(1, 2, 2), b(1, 4, 2)]), [(1, 0)])  # 0..5
        fetched = part.wait_flushed(6)  # the fetcher fsyncs before its next fetch
        await settle()
        assert len(ex.held) == 1  # flush 1: offsets 0..5
        image = await part.capture()  # a snapshot asks meanwhile, so the
        snap = part.wait_flushed(image.covered_to)  # partition is dirty again
        ex.run_next()
        await settle()
        assert fetched.done() and snap.done() and part.flushed_end == 6
        assert len(ex.held) == 1  # flush 2 began with the log ending at 6
        # The fetcher's next session: the leader's log diverges at 2. The new batch is
        # written after flush 2 took its fds: flush 2 does not cover it.
        assert part.truncate_to(2) == 2 and part.flushed_end == 2
        part.append_replicated(stored([b(2, 0, 3)], 2), [(1, 0), (2, 2)])  # 2..4
        after_cut = part.wait_flushed(part.log.next_offset)
        ex.run_next()
        await settle()
        assert part.flushed_end <= 2, "a flush from before the cut marked later batches fsynced"
        assert not after_cut.done()
        await _run_flushes(ex, after_cut)  # a flush that began after the write
        assert after_cut.done() and part.flushed_end == 5
        seg_fd = part.log.segments[-1].fd
        assert any(seg_fd in args[0] for args in ex.ran[2:])  # ... and it fsynced the segment
        await _close(part, ex)

    asyncio.run(go())


def test_truncate_during_a_flush_keeps_the_fds_that_flush_holds(tmp_path: Path) -> None:
    """The caller need not wait for flushes before cutting: a dropped segment's fd stays
    open until the fsync that holds it is over (a closed fd fails the fsync, and a failed
    fsync stops the server)."""

    async def go() -> None:
        ex = HeldExecutor()
        failures: list[BaseException] = []
        flusher = Flusher(mode="batch", interval_ms=0, executor=ex, on_error=failures.append)
        part = open_part(tmp_path, flusher, segment_bytes_max=1)  # one batch per segment
        part.become_follower(1, 1, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2), b(1, 2, 2), b(1, 4, 2)]), [(1, 0)])
        assert len(part.log.segments) == 3
        waiting = part.wait_flushed(6)
        await settle()
        assert len(ex.held) == 1  # holds the fds of all three segments
        assert part.truncate_to(2) == 2 and len(part.log.segments) == 2  # the third is gone
        ex.run_next()
        await settle()
        assert failures == []
        assert part.flushed_end <= 2  # it covered the old log, now cut
        assert waiting.done()  # ... and what it waited for is gone
        assert isinstance(waiting.exception(), Exception)
        kept = part.wait_flushed(2)
        await _run_flushes(ex, kept)
        assert kept.done() and part.flushed_end == 2 and failures == []
        await _close(part, ex)

    asyncio.run(go())


async def _run_flushes(ex: HeldExecutor, until: asyncio.Future[Any]) -> None:
    """Complete flushes one by one until ``until`` is resolved (a few at most)."""
    for _ in range(5):
        await settle()
        if until.done() or not ex.held:
            return
        ex.run_next()


async def _close(part, ex: HeldExecutor) -> None:  # type: ignore[no-untyped-def]
    for _ in range(10):
        if not ex.held:
            break
        ex.run_next()
        await settle()
    part.close()
