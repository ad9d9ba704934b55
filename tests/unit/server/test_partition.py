"""``Partition`` (partition_server/partition.py): a follower's log cut (``truncate_to``)
against its flushed end. Fsyncs are held by an executor and completed exactly where each
test wants, or made to fail through the ``os`` module seen by ``log.py`` (the disk is real);
a snapshot capture interleaved with a cut.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from partition_server import log as log_module
from partition_server.epochs import EpochHistory
from partition_server.flusher import Flusher
from partition_server.partition import Partition, Role
from partition_server.producer_state import FenceOutcome, Outcome
from partition_server.snapshot import (
    Snapshot,
    SnapshotStore,
)
from partition_server.testing import (
    HeldExecutor,
    InlineExecutor,
    b,
    open_part,
    outcome,
    settle,
    stored,
)
from pidlease.errors import NotEnoughReplicas, ServerUnavailable, TooManyPids
from pidlease.wire import protocol as P
from pidlease.wire.cluster import TopicSpec
from pidlease.wire.protocol import BatchHeader, batch_from_records, encode_record, validate_batch
from tests.helpers import ManualClock
from tests.unit.server._disks import FullDisk, on_disk


def test_a_flush_from_before_a_cut_does_not_cover_batches_fetched_after_it(tmp_path: Path) -> None:
    """docs/reliability.md finding 3: a flush that began before ``truncate_to`` covered the
    old log, not the batches fetched after the cut, so its completion must not call them
    fsynced (the follower's next fetch reports its log end to the leader as held durably,
    and the leader counts it for the high watermark)."""

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
    """docs/reliability.md finding 3: a cut during a flush keeps the fds that flush holds.

    The caller need not wait for flushes before cutting: a dropped segment's fd stays
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


class FailingDisk:
    """``os`` for log.py: the call named in ``failing`` raises EIO."""

    def __init__(self) -> None:
        self.failing = ""

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name != self.failing:
            return real

        def fail(*_args: Any) -> None:
            raise OSError(errno.EIO, f"Input/output error (test {name})")

        return fail


@pytest.mark.parametrize("call", ["fsync", "ftruncate"])
def test_a_failed_cut_calls_the_fsync_error_policy_and_lowers_the_flushed_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """docs/reliability.md finding 9 (simulation, seed 1426): a follower's cut whose ftruncate
    or fsync fails.

    ``PartitionLog.truncate_to`` raised out of ``Partition.truncate_to`` midway, with the
    truncation counted and the file maybe cut but ``flushed_end`` still at the old end; the
    fetcher took the OSError for a session error, refetched, and batches fetched after the
    cut counted as fsynced below that stale end. A failed fsync or truncate follows the
    server's policy for a failed fsync (the flusher's error handler: crash, recover from
    what is on disk), and ``flushed_end`` is never left above the log's end. The disk is
    real; only the ``os`` module seen by ``log.py`` is swapped for one whose call fails on
    demand."""

    async def go() -> None:
        failures: list[BaseException] = []
        flusher = Flusher(
            mode="batch", interval_ms=0, executor=InlineExecutor(), on_error=failures.append
        )
        part = open_part(tmp_path, flusher)
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2), b(1, 2, 2), b(1, 4, 2)]), [(1, 0), (2, 2)])
        fsynced = part.wait_flushed(6)
        await settle()
        assert fsynced.done() and part.flushed_end == 6
        disk = FailingDisk()
        monkeypatch.setattr(log_module, "os", disk)
        disk.failing = call
        with pytest.raises(OSError, match=f"test {call}"):  # the injected failure, unwrapped
            part.truncate_to(3)  # the batch holding 3 starts at 2: the log ends at 2
        assert part.flushed_end <= 2, f"flushed_end {part.flushed_end} above the cut at 2"
        assert part.high_watermark <= 2
        assert len(failures) == 1, "a failed fsync or truncate in a cut did not stop the server"
        monkeypatch.setattr(log_module, "os", os)
        part.close()

    asyncio.run(go())


def test_rows_captured_before_a_cut_are_not_trusted_at_recovery(tmp_path: Path) -> None:
    """docs/reliability.md finding 4 (review 4): a snapshot captured while a follower's log
    is cut must never mix producer state from before the cut with a truncation count from
    after it, or recovery trusts rows that describe batches no longer in the log (a cut
    batch answered DUPLICATE, never committed) and skips batches the rows do not describe
    (a resend appended twice)."""

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


IDLE = 1_000  # the tracked-PID limit's idle time before eviction


def _partition(tmp_path: Path, pids_max: int, clock: list[int]) -> Partition:
    return open_part(
        tmp_path,
        hw=None,
        pids_max=pids_max,
        clock_ms=lambda: clock[0],
        evict_idle_min_ms=IDLE,
        expire_ms=10**9,
    )


def _batch(pid: int, base: int) -> tuple[memoryview, BatchHeader]:
    raw = batch_from_records(
        encode_record(None, b"v"), 1, pid=pid, generation=1, base_sequence=base, timestamp_ms=0
    )
    return memoryview(raw), validate_batch(raw)


def test_partition_append_raises_too_many_pids_naming_the_partition(tmp_path: Path) -> None:
    """Tracked-PID limit (docs/reliability.md, after Kafka's KIP-936): a full table refuses a
    new PID with TOO_MANY_PIDS instead of silently forgetting a live one."""

    clock = [0]
    part = _partition(tmp_path, 1, clock)

    async def go() -> None:
        d, fut = part.append(*_batch(1, 0), lambda b, e: (b, e), epoch=part.leader_epoch)
        assert d.outcome is Outcome.APPEND and fut is not None
        assert await fut == (0, 0)
        with pytest.raises(TooManyPids) as info:
            part.append(*_batch(2, 0), lambda b, e: (b, e), epoch=part.leader_epoch)
        assert info.value.retriable and "partition t-0" in info.value.detail
        end = part.log.next_offset
        clock[0] = IDLE
        d, fut = part.append(*_batch(2, 0), lambda b, e: (b, e), epoch=part.leader_epoch)
        assert d.outcome is Outcome.APPEND and part.log.next_offset == end + 1
        assert part.state.pids() == [2] and part.state.refused_total == 1
        assert fut is not None
        await fut
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


# -- a leader-epoch file that cannot be saved (sim findings 8 and 14); ``disk``: conftest.py


def test_a_failed_save_in_become_leader_changes_nothing_and_the_retry_saves(
    tmp_path: Path, disk: FullDisk
) -> None:
    """docs/reliability.md sim finding 8: a leader-epoch file that cannot be saved (ENOSPC)
    leaves the history in memory as it was, so the retry saves it."""

    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 1, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2)]), [(1, 0)])
        assert on_disk(part.log.dir) == [(1, 0)]
        disk.full.add("t-0")
        with pytest.raises(OSError, match=r"No space left on device \(test\)"):
            part.become_leader(2, 2, [1, 2], [1, 2])
        assert part.role is Role.FOLLOWER and part.leader_epoch == 1
        assert part.epochs.entries == [(1, 0)], "the epoch stayed in memory, not on disk"
        disk.full.clear()
        part.become_leader(2, 2, [1, 2], [1, 2])  # the reconcile a second later
        assert part.role is Role.LEADER and part.leader_epoch == 2
        assert on_disk(part.log.dir) == [(1, 0), (2, 2)], "the retry never saved the epoch"
        part.close()

    asyncio.run(go())


def test_a_failed_save_of_fetched_epochs_changes_nothing(tmp_path: Path, disk: FullDisk) -> None:
    """docs/reliability.md sim finding 8: a leader-epoch file that cannot be saved (ENOSPC)
    leaves the history in memory as it was, so the retry saves it."""

    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2)]), [(1, 0)])
        disk.full.add("t-0")
        with pytest.raises(OSError, match=r"No space left on device \(test\)"):
            part.append_replicated(stored([b(1, 2, 2)], 2), [(2, 2)])
        assert part.epochs.entries == [(1, 0)] and part.log.next_offset == 2
        disk.full.clear()
        assert part.append_replicated(stored([b(1, 2, 2)], 2), [(2, 2)]) == 1  # the refetch
        assert on_disk(part.log.dir) == [(1, 0), (2, 2)]
        part.close()

    asyncio.run(go())


def test_a_failed_log_write_after_the_epochs_were_saved_leaves_no_entry_past_the_end(
    tmp_path: Path,
) -> None:
    """docs/reliability.md sim finding 14 (seed 500722 --retention): a follower's failed log
    write after the fetched batches' epochs were saved leaves no epoch entry past its log
    end.

    Found by the simulation (seed 500722 --retention): a follower at log end 2 fetched
    the leader's epoch 0 batch at 2 and its epoch 3 starting at 4; the epochs were saved,
    then the log write failed (ENOSPC). Epoch 3 "starting at 4" stayed in memory past the
    log end, so when this replica was elected at its end (2) it could never take the
    role ("epoch 4 would start at 2, before epoch 3's start 4"), retrying for ever: the
    partition stuck."""

    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2)]), [(1, 0)])

        def full(*_a: object) -> int:
            raise ServerUnavailable("write failed: [Errno 28] No space left on device")

        real = part.log.append
        part.log.append = full  # type: ignore[method-assign]
        with pytest.raises(ServerUnavailable):
            part.append_replicated(stored([b(1, 2, 2), b(1, 4, 2)], 2), [(1, 0), (3, 4)])
        part.log.append = real  # type: ignore[method-assign]
        assert part.log.next_offset == 2
        assert all(start <= 2 for _, start in part.epochs.entries), part.epochs.entries
        part.become_leader(2, 4, [1, 2], [2])  # elected at its end: takes the role
        assert part.epochs.entries[-1] == (4, 2)
        part.close()

    asyncio.run(go())


def test_a_failed_save_in_a_cut_changes_nothing(tmp_path: Path, disk: FullDisk) -> None:
    """docs/reliability.md sim finding 8: a leader-epoch file that cannot be saved (ENOSPC)
    leaves the history in memory as it was, so the retry saves it."""

    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2), b(1, 2, 2)]), [(1, 0), (2, 2)])
        before = (list(part.epochs.entries), part.epochs.truncations)
        disk.full.add("t-0")
        with pytest.raises(OSError, match=r"No space left on device \(test\)"):
            part.truncate_to(2)
        assert (part.epochs.entries, part.epochs.truncations) == before
        assert part.log.next_offset == 4
        disk.full.clear()
        assert part.truncate_to(2) == 2
        assert on_disk(part.log.dir) == [(1, 0)]
        assert EpochHistory.load(part.log.dir).truncations == before[1] + 1
        part.close()

    asyncio.run(go())


# -- the horizon of dropped PIDs (docs/reliability.md finding 6)
EXPIRE_MS = 10_000


def test_fence_creates_an_entry_only_for_a_pid_leased_after_the_horizon(tmp_path: Path) -> None:
    """docs/reliability.md finding 6 (review 6): a partition remembers the newest last use of
    any PID it dropped, and a takeover's FENCE creates a fresh entry only for a PID leased
    after it."""

    async def go() -> None:
        clock = ManualClock()
        part = open_part(tmp_path, hw=None, clock_ms=clock)
        part.state.note_dropped(5_000)
        answer = lambda existed, dhw, off: (existed, dhw, off)  # noqa: E731
        outcome, fut = part.fence(7, 3, True, answer, leased_since_ms=5_000)
        assert outcome is FenceOutcome.ABSENT and await fut == (False, -1, -1)
        assert 7 not in part.state and part.log.next_offset == 0, "nothing written"
        outcome, fut = part.fence(7, 3, True, answer, leased_since_ms=5_001)
        assert outcome is FenceOutcome.APPEND and await fut == (False, -1, 0)
        assert part.state.get(7).generation == 3  # type: ignore[union-attr]
        outcome, fut = part.fence(8, 1, True, answer)  # an older coordinator: as before
        assert outcome is FenceOutcome.APPEND and (await fut)[2] == 1
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


def test_capture_records_the_horizon(tmp_path: Path) -> None:
    """docs/reliability.md finding 6 (review 6): a partition remembers the newest last use of
    any PID it dropped, and a takeover's FENCE creates a fresh entry only for a PID leased
    after it."""

    async def go() -> None:
        clock = ManualClock()
        part = open_part(tmp_path, hw=None, clock_ms=clock)
        part.state.apply_append(7, 0, 0, 1, 0, 123, durable=True)
        part.state.expire(123 + EXPIRE_MS, EXPIRE_MS)
        img = await part.capture()
        assert img.dropped_last_use_max_ms == 123 and img.rows == []
        part.close()

    asyncio.run(go())


# -- a partition below its minimum in-sync set (docs/replication.md, min_insync_replicas)
def append(part: Partition, raw: bytes) -> tuple[Outcome, asyncio.Future[object] | None]:
    buf = bytearray(raw)
    d, fut = part.append(
        memoryview(buf),
        P.validate_batch(bytes(buf)),
        lambda base, last: base,
        epoch=part.leader_epoch,
    )
    return d.outcome, fut


async def close(part: Partition) -> None:
    await part.flusher.wait_idle()
    part.close()


def shrink_to_leader(part: Partition) -> None:
    """What the replica manager does once ZooKeeper confirmed a smaller set."""
    assert part.isr is not None
    part.isr.begin_change([], [2, 3])
    part.isr.set_isr([1])
    part.in_sync_changed()


@pytest.mark.parametrize("mode", ["strict", "monotonic"])
def test_a_refused_produce_leaves_nothing_behind(tmp_path: Path, mode: str) -> None:
    """min_insync_replicas (docs/replication.md): a leader whose in-sync set is below the
    topic's minimum refuses a write with nothing written and acks nothing on fewer copies."""

    async def go() -> None:
        part = open_part(tmp_path, mode=mode)
        part.set_min_insync(2)
        part.become_leader(1, 1, [1, 2, 3], [1])  # only the leader in sync
        with pytest.raises(NotEnoughReplicas):
            append(part, b(7, 0, 3))
        assert part.log.next_offset == 0 and part.state.get(7) is None
        assert part.min_insync_refusals == 1
        with pytest.raises(NotEnoughReplicas):  # a FENCE writes nothing either
            part.fence(7, 1, True, lambda *a: a)
        assert part.log.next_offset == 0 and part.state.get(7) is None
        if mode == "monotonic":
            # a refusal leaves no hole: a later batch waits for this one's resend
            assert outcome(part, 7, 5, 1) is Outcome.SEQUENCE_UNKNOWN
        # a follower is back in sync: the same batch is taken and acked
        assert part.isr is not None
        part.isr.set_isr([1, 2])
        part.in_sync_changed()
        o, fut = append(part, b(7, 0, 3))
        assert o is Outcome.APPEND and fut is not None
        await part.wait_flushed(3)
        part.record_replica_fetch(2, 3)
        assert await asyncio.wait_for(fut, 5) == 0 and part.high_watermark == 3
        await close(part)

    asyncio.run(go())


def test_no_ack_on_fewer_copies_and_the_resend_is_never_a_second_copy(tmp_path: Path) -> None:
    """min_insync_replicas (docs/replication.md): a leader whose in-sync set is below the
    topic's minimum refuses a write with nothing written and acks nothing on fewer copies."""

    async def go() -> None:
        part = open_part(tmp_path)
        part.set_min_insync(2)
        part.become_leader(1, 1, [1, 2, 3], [1, 2, 3])
        o, fut = append(part, b(7, 0, 3))  # accepted: three in sync
        assert o is Outcome.APPEND and fut is not None
        await part.wait_flushed(3)
        shrink_to_leader(part)  # before any follower fetched it
        with pytest.raises(NotEnoughReplicas):
            await asyncio.wait_for(fut, 5)  # answered, not held
        part.record_replica_fetch(2, 0)  # a late fetch moves nothing: one copy counted
        part.advance_high_watermark()
        assert part.high_watermark == 0 and part.log.next_offset == 3
        # the SDK's resend: in the log, not committed
        assert outcome(part, 7, 0, 3) is Outcome.SEQUENCE_UNKNOWN
        assert append(part, b(7, 0, 3)) == (Outcome.SEQUENCE_UNKNOWN, None)
        with pytest.raises(NotEnoughReplicas):  # new batches are refused meanwhile
            append(part, b(7, 3))
        # follower 2 fetches everything and rejoins: committed on two copies, DUPLICATE
        part.record_replica_fetch(2, 3)
        assert part.isr is not None
        assert part.isr.joiners(part.high_watermark) == [2]
        part.isr.begin_change([2], [])
        part.advance_high_watermark()
        assert part.high_watermark == 3
        assert outcome(part, 7, 0, 3) is Outcome.DUPLICATE
        assert part.log.next_offset == 3  # one copy of the batch, never two
        await close(part)

    asyncio.run(go())


def test_a_waiting_ack_is_answered_once_the_set_grows_back(tmp_path: Path) -> None:
    """min_insync_replicas (docs/replication.md): a leader whose in-sync set is below the
    topic's minimum refuses a write with nothing written and acks nothing on fewer copies."""

    async def go() -> None:
        part = open_part(tmp_path)
        part.set_min_insync(2)
        part.become_leader(1, 1, [1, 2, 3], [1, 2])
        o, fut = append(part, b(7, 0, 2))
        assert o is Outcome.APPEND and fut is not None
        await part.wait_flushed(2)
        await asyncio.sleep(0.01)
        assert not fut.done()  # follower 2 has not fetched it
        part.record_replica_fetch(2, 2)
        assert fut.done() and fut.result() == 0 and part.high_watermark == 2
        await close(part)

    asyncio.run(go())


def test_raising_the_minimum_on_a_running_leader_applies_at_once(tmp_path: Path) -> None:
    """min_insync_replicas (docs/replication.md): a leader whose in-sync set is below the
    topic's minimum refuses a write with nothing written and acks nothing on fewer copies."""

    async def go() -> None:
        part = open_part(tmp_path)
        part.become_leader(1, 1, [1, 2, 3], [1, 2])  # default 1 until the topic says 3
        o, fut = append(part, b(7, 0))
        assert o is Outcome.APPEND and fut is not None
        part.set_min_insync(3)  # a PATCH: the waiting ack cannot be committed now
        with pytest.raises(NotEnoughReplicas):
            await asyncio.wait_for(fut, 5)  # answered, not held
        with pytest.raises(NotEnoughReplicas):
            append(part, b(7, 1))
        part.set_min_insync(2)  # and back: taken again
        assert append(part, b(7, 1))[0] is Outcome.APPEND
        await close(part)

    asyncio.run(go())


def test_r2_with_the_default_minimum_acks_on_the_leader_alone(tmp_path: Path) -> None:
    """min_insync_replicas (docs/replication.md): a leader whose in-sync set is below the
    topic's minimum refuses a write with nothing written and acks nothing on fewer copies."""

    async def go() -> None:
        part = open_part(tmp_path)
        part.set_min_insync(TopicSpec("t", 1, 2).min_insync)  # 1
        part.become_leader(1, 1, [1, 2], [1])
        o, fut = append(part, b(7, 0))
        assert o is Outcome.APPEND and fut is not None
        assert await asyncio.wait_for(fut, 5) == 0 and part.high_watermark == 1
        outcome_, fence_fut = part.fence(7, 1, True, lambda *a: a[2])
        assert outcome_ is FenceOutcome.APPEND and await fence_fut == 1
        await close(part)

    asyncio.run(go())


# -- LIST_OFFSETS: the first committed batch at or after a time (issue 13 item 4)
STAMPS = [100, 200, 150, 400, 300, 500]  # producers' clocks: need not grow with the offset


async def _filled(tmp_path: Path) -> Partition:
    part = open_part(tmp_path, hw=0, segment_bytes_max=300)  # replicated: hw moved by hand
    for seq, ts in enumerate(STAMPS):
        raw = bytearray(
            P.encode_batch(
                [(None, b"x" * 60)], pid=7, generation=0, base_sequence=seq, timestamp_ms=ts
            )
        )
        part.append(
            memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=part.leader_epoch
        )
    await part.wait_flushed(part.log.next_offset)
    return part


def test_partition_answers_the_first_committed_batch_at_or_after_the_time(
    tmp_path: Path,
) -> None:
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    partition answers the first committed batch at or after the time, the high watermark
    when none."""

    async def main() -> None:
        part = await _filled(tmp_path)
        assert len(part.log.segments) > 2
        part.set_high_watermark(4)  # offsets 4 and 5 are written, not committed
        at = part.offset_for_timestamp
        assert (at(P.EARLIEST_TIMESTAMP), at(P.LATEST_TIMESTAMP)) == (0, 4)
        assert [at(t) for t in (0, 100, 101, 150, 160, 201, 400)] == [0, 0, 1, 1, 1, 3, 3]
        # Only uncommitted batches are that new: start at the high watermark and wait.
        assert at(401) == 4 and at(10**12) == 4
        part.set_high_watermark(6)
        assert (at(401), at(500), at(501), at(P.LATEST_TIMESTAMP)) == (5, 5, 6, 6)
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(main())
