"""Retention (issue 13): whole closed segments go from the old end by age and by size,
never the active one, never past the high watermark, never below the newest snapshot's
``replay_from`` (so producer state never needs a deleted segment); the log start is
persisted and survives a reopen and a crash mid-deletion; a read below it is
OFFSET_OUT_OF_RANGE with both bounds. Real files in tmp_path, an injected clock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from partition_server.log_manager import LogManager
from partition_server.partition import Partition
from partition_server.producer_state import Outcome
from partition_server.registry import Assignment
from partition_server.replica_fetcher import FetchSessionError, _leader_rows
from partition_server.replication import ReplicaManager
from partition_server.retention import LOG_START_FILE, LogPolicy, read_log_start
from partition_server.settings import ServerSettings
from partition_server.testing import open_part, outcome, stored
from pidlease import errors
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, TopicSpec
from tests.helpers import ManualClock

SEG = 4096
OLD_TS = 1_000  # batch timestamps far older than the clock's now
HOUR_MS = 3_600_000


def raw_batch(pid: int, seq: int, ts: int) -> bytearray:
    return bytearray(
        P.encode_batch(
            [(None, b"x" * 600)], pid=pid, generation=0, base_sequence=seq, timestamp_ms=ts
        )
    )


def append(part: Partition, pid: int, seq: int, ts: int) -> tuple[Outcome, int]:
    raw = raw_batch(pid, seq, ts)
    d, _ = part.append(
        memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=part.leader_epoch
    )
    return d.outcome, part.log.next_offset


def segment_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))


def make_log_manager(tmp_path: Path, clock: ManualClock, part: Partition) -> LogManager:
    s = ServerSettings(data_dir=str(tmp_path))
    b = LogManager(s, None, clock_ms=clock)  # type: ignore[arg-type]  # no registry needed here
    b.partitions[("t", 0)] = part
    part.hosted = True
    return b


async def fill(part: Partition, pid: int, seqs: range, ts: int) -> None:
    for seq in seqs:
        o, _ = append(part, pid, seq, ts)
        assert o is Outcome.APPEND
    await part.wait_durable(part.log.next_offset)


async def settle(b: LogManager) -> None:
    """Wait for a retention pass running in the background (started by a roll or by the
    snapshot a blocked pass waited for)."""
    while b._retention_task is not None and not b._retention_task.done():
        await b._retention_task


async def retain(b: LogManager, now: int) -> int:
    """One retention round; a snapshot it asks for is awaited, and the pass that snapshot
    starts. Returns the segments deleted meanwhile, by this round or in the background."""
    await settle(b)
    before = b.segments_deleted
    await b.apply_retention(now)
    if b._snapshot_task is not None:
        await b._snapshot_task
    await settle(b)
    return b.segments_deleted - before


async def shut(part: Partition) -> None:
    await part.flusher.wait_idle()
    part.close()


def reopen(tmp_path: Path, clock: ManualClock, b: LogManager, **kw: object) -> Partition:
    loaded = b.snapshots.load_newest()
    snap = loaded[0].partitions.get(("t", 0)) if loaded else None
    kw.setdefault("hw", None)
    return open_part(tmp_path, clock_ms=clock, snapshot=snap, **kw)


def test_retention_ms_deletes_old_closed_segments_keeps_the_active_one_and_the_start_persists(
    tmp_path: Path,
) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        b = make_log_manager(tmp_path, clock, part)
        await fill(part, 7, range(20), OLD_TS)
        n_files = len(segment_files(tmp_path))
        assert n_files >= 4
        # No snapshot yet: recovery would replay from 0, so nothing may go; one is taken,
        # and once it is written retention runs again at once (not a retention_check_ms
        # later): every closed segment goes, the active one stays.
        before = part.log.segment_infos()
        assert await b.apply_retention(clock.now) == 0
        assert b._snapshot_task is not None
        assert len(segment_files(tmp_path)) == n_files
        await b._snapshot_task
        assert b._retention_task is not None
        await b._retention_task
        start = before[-1].base_offset
        assert segment_files(tmp_path) == [f"{start:020d}.log"]
        assert part.log.log_start_offset == start == read_log_start(tmp_path / "t-0")
        # A segment with a recent batch stays while older ones go.
        await fill(part, 7, range(20, 30), clock.now)
        await b.snapshot_now()
        assert await retain(b, clock.now) == 0  # the first one holds recent batches too
        assert part.log.log_start_offset == start
        assert part.log.segments[0].max_timestamp_ms == clock.now
        # The active segment stays even when it is old enough to go.
        clock.now += 2 * HOUR_MS
        await retain(b, clock.now)
        assert len(part.log.segments) == 1 and part.log.segments[0].size > 0
        start = part.log.log_start_offset
        end = part.log.next_offset
        with pytest.raises(errors.OffsetOutOfRange) as ei:
            part.fetch(start - 1, 1 << 20)
        assert (ei.value.earliest, ei.value.latest) == (start, end)
        assert ei.value.http_status == 416 and not ei.value.retriable
        assert part.fetch(start, 1 << 20)
        assert part.metadata()["log_start_offset"] == start
        assert part.metadata()["size_bytes"] == part.log.size_bytes > 0
        await shut(part)
        again = reopen(tmp_path, clock, b, policy=policy)
        assert again.log.log_start_offset == start and again.log.next_offset == end
        with pytest.raises(errors.OffsetOutOfRange):
            again.fetch(0, 1 << 20)
        assert outcome(again, 7, 30, 1) is Outcome.APPEND
        await shut(again)

    asyncio.run(go())


def test_a_roll_runs_retention_so_the_size_bound_holds_between_timer_rounds(
    tmp_path: Path,
) -> None:
    """No timer runs here (``maintain`` is not started): deletion comes only from the
    roll trigger and the snapshot it waits for, and the partition never grows past
    retention_bytes + two segments (the one being written, the one waiting for a
    snapshot), while 15 segments' worth is written."""
    clock = ManualClock(100 * HOUR_MS)
    limit = 3 * SEG
    policy = LogPolicy(retention_bytes=limit, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        b = make_log_manager(tmp_path, clock, part)
        part.on_roll = b.retention_soon
        biggest = 0
        for seq in range(100):
            o, _ = append(part, 7, seq, clock.now)
            assert o is Outcome.APPEND
            await part.wait_durable(part.log.next_offset)
            biggest = max(biggest, part.log.size_bytes)
            # Let a pass the roll started, the snapshot it asked for and the pass that
            # snapshot starts run to the end (they use the executor: no fixed yields).
            for _ in range(3):
                await settle(b)
                if b._snapshot_task is not None:
                    await b._snapshot_task
            biggest = max(biggest, part.log.size_bytes)
        assert part.log.log_start_offset > 0
        assert biggest <= limit + 2 * SEG, (biggest, limit)
        await shut(part)

    asyncio.run(go())


def test_never_past_the_high_watermark(tmp_path: Path) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=0, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=0, clock_ms=clock, policy=policy)
        part.become_leader(1, 1, [1, 2], [1, 2])
        b = make_log_manager(tmp_path, clock, part)
        for seq in range(20):
            append(part, 7, seq, OLD_TS)
        await part.wait_flushed(part.log.next_offset)
        await b.snapshot_now()
        assert part.high_watermark == 0
        assert await retain(b, clock.now) == 0  # follower 2 has nothing: nothing is committed
        infos = part.log.segment_infos()
        part.record_replica_fetch(2, infos[1].end_offset)  # commits the first two segments
        assert part.high_watermark == infos[1].end_offset
        assert await retain(b, clock.now) == 2
        assert part.log.log_start_offset == infos[2].base_offset
        await shut(part)
        # The high-watermark checkpoint may lag behind a deletion: the log start is
        # committed all the same.
        again = open_part(tmp_path, hw=0, clock_ms=clock, policy=policy)
        assert again.high_watermark == infos[2].base_offset
        await shut(again)

    asyncio.run(go())


def test_retention_bytes_bounds_the_size(tmp_path: Path) -> None:
    clock = ManualClock(100 * HOUR_MS)
    limit = 3 * SEG
    policy = LogPolicy(retention_bytes=limit, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        b = make_log_manager(tmp_path, clock, part)
        await fill(part, 7, range(60), clock.now)  # recent: only the size limit applies
        before = part.log.size_bytes
        assert before > 2 * limit
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        size = part.log.size_bytes
        assert limit <= size <= limit + SEG
        md = b.metadata(1, "here")["retention"]
        assert md["segments_deleted"] > 0 and md["bytes_deleted"] == before - size
        assert size == sum(p.stat().st_size for p in (tmp_path / "t-0").glob("*.log"))
        await shut(part)

    asyncio.run(go())


def test_deletion_waits_for_a_snapshot_whose_replay_from_is_above_the_segments(
    tmp_path: Path,
) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        b = make_log_manager(tmp_path, clock, part)
        await fill(part, 7, range(6), OLD_TS)
        await b.snapshot_now()
        replay_from = part.log.next_offset
        await fill(part, 7, range(6, 30), OLD_TS)
        taken = b.snapshots_taken
        # Only the segments wholly below the snapshot's replay_from may go ...
        before = b.segments_deleted
        await b.apply_retention(clock.now)
        assert all(s.end_offset > replay_from for s in part.log.segment_infos())
        assert part.log.log_start_offset <= replay_from
        # ... and being blocked asks for a snapshot, after which the rest goes.
        assert b._snapshot_task is not None
        await b._snapshot_task
        assert b.snapshots_taken == taken + 1
        await retain(b, clock.now)
        assert len(part.log.segments) == 1 and b.segments_deleted - before >= 3
        await shut(part)

    asyncio.run(go())


def test_a_pid_whose_segments_all_went_keeps_its_state_across_a_reopen(tmp_path: Path) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        b = make_log_manager(tmp_path, clock, part)
        await fill(part, 7, range(5), OLD_TS)  # PID 7 then idles
        await fill(part, 8, range(20), OLD_TS)
        await fill(part, 8, range(20, 30), clock.now)
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        first = part.log.segments[0].base_offset
        assert first > 5, "PID 7's batches are all deleted"
        await shut(part)
        again = reopen(tmp_path, clock, b, policy=policy)
        assert again.log.log_start_offset == first
        assert outcome(again, 7, 5, 1) is Outcome.APPEND  # no UNKNOWN_PID, no restart at 0
        assert outcome(again, 7, 4, 1) is Outcome.DUPLICATE
        o, _ = append(again, 7, 5, clock.now)
        assert o is Outcome.APPEND
        await shut(again)

    asyncio.run(go())


def test_a_crash_between_persisting_the_start_and_unlinking_is_repaired_at_open(
    tmp_path: Path,
) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        await fill(part, 7, range(20), OLD_TS)
        infos = part.log.segment_infos()
        end = part.log.next_offset
        part.log.persist_log_start(infos[2].base_offset)  # and the process dies here
        await shut(part)
        assert len(segment_files(tmp_path)) == len(infos)
        again = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        assert again.log.log_start_offset == infos[2].base_offset
        assert len(segment_files(tmp_path)) == len(infos) - 2
        assert again.log.next_offset == end
        await shut(again)
        # A damaged log-start file is ignored: the first segment is the start.
        (tmp_path / "t-0" / LOG_START_FILE).write_bytes(b"junk")
        third = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        assert third.log.log_start_offset == infos[2].base_offset
        await shut(third)

    asyncio.run(go())


def test_segments_roll_by_size_and_age_and_a_new_assignment_changes_the_policy(
    tmp_path: Path,
) -> None:
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, segment_bytes_max=1 << 20)
        b = make_log_manager(tmp_path, clock, part)
        await fill(part, 7, range(10), clock.now)
        assert len(part.log.segments) == 1  # the default policy: the server's size only
        spec = TopicSpec("t", 1, segment_bytes=SEG, segment_ms=1_000, retention_ms=-1)
        b.apply_assignment(
            Assignment(topics={"t": spec}, partitions={("t", 0): PartitionState([1], 1)})
        )
        assert part.log.policy == LogPolicy(-1, -1, SEG, 1_000)
        await fill(part, 7, range(10, 11), clock.now)
        assert len(part.log.segments) == 2  # over SEG: rolled
        await fill(part, 7, range(11, 12), clock.now)
        assert len(part.log.segments) == 2
        clock.now += 999
        await fill(part, 7, range(12, 13), clock.now)
        assert len(part.log.segments) == 2
        clock.now += 1
        await fill(part, 7, range(13, 14), clock.now)
        assert len(part.log.segments) == 3  # 1 s old at this append: rolled
        await shut(part)

    asyncio.run(go())


def test_a_follower_cut_keeps_the_state_of_a_pid_whose_segments_all_went(tmp_path: Path) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    def old(pid: int, seq: int) -> bytes:
        return bytes(raw_batch(pid, seq, OLD_TS))

    async def go() -> None:
        part = open_part(tmp_path, clock_ms=clock, policy=policy)
        part.become_follower(2, 1, "127.0.0.1:1")
        b = make_log_manager(tmp_path, clock, part)
        batches = [old(7, s) for s in range(3)] + [old(8, s) for s in range(20)]
        assert part.append_replicated(stored(batches), [(1, 0)]) == 23
        await part.wait_flushed(23)
        part.set_high_watermark(23)
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        assert part.log.log_start_offset > 3  # PID 7's batches are gone
        # A suffix above the high watermark that the new leader does not have, then cut.
        extra = [bytes(raw_batch(8, 20, clock.now)), bytes(raw_batch(9, 0, clock.now))]
        assert part.append_replicated(stored(extra, start=23), [(1, 0)]) == 2
        await part.wait_flushed(25)
        assert part.truncate_to(23) == 23
        assert outcome(part, 7, 3, 1) is Outcome.APPEND  # not UNKNOWN_PID
        assert outcome(part, 7, 2, 1) is Outcome.DUPLICATE
        assert outcome(part, 8, 20, 1) is Outcome.APPEND  # the cut batch is gone
        assert part.state.get(9) is None
        # Recovery would not trust the snapshot from before the cut: take a new one soon.
        taken = b.snapshots_taken
        assert await retain(b, clock.now) == 0
        assert b.snapshots_taken == taken + 1
        await shut(part)

    asyncio.run(go())


async def follower_past_pid7(
    tmp_path: Path, clock: ManualClock, policy: LogPolicy
) -> tuple[Partition, LogManager]:
    """A follower that fetched PID 7's sequences 0-2 and PID 8's 0-19 (offsets 0-22, all
    committed and old), took a snapshot, and whose retention deleted PID 7's batches."""
    part = open_part(tmp_path, clock_ms=clock, policy=policy)
    part.become_follower(2, 1, "127.0.0.1:1")
    b = make_log_manager(tmp_path, clock, part)
    batches = [bytes(raw_batch(7, s, OLD_TS)) for s in range(3)]
    batches += [bytes(raw_batch(8, s, OLD_TS)) for s in range(20)]
    assert part.append_replicated(stored(batches), [(1, 0)]) == 23
    await part.wait_flushed(23)
    part.set_high_watermark(23)
    await b.snapshot_now()
    assert await retain(b, clock.now) > 0
    assert part.log.log_start_offset > 3
    return part, b


@pytest.mark.parametrize("cut_batches", [2, 7])  # 7: more than the K=5 batches a row keeps
def test_a_follower_cut_rewinds_a_pid_whose_other_batches_all_went(
    tmp_path: Path, cut_batches: int
) -> None:
    """The simulation's seed 1863 (``--retention``): PID 7's committed batches are all
    below the log start, its only other batches are in the suffix a cut drops. Its state
    must be the one as of the cut (highwater 2): the resend of sequence 3 appends, not
    UNKNOWN_PID (the old rebuild knew neither part), not DUPLICATE (the cut batches'
    sequences must not be kept)."""
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        part, _ = await follower_past_pid7(tmp_path, clock, policy)
        assert part.log.log_start_offset > 3  # PID 7's committed batches are gone
        extra = [bytes(raw_batch(7, 3 + i, clock.now)) for i in range(cut_batches)]
        n = part.append_replicated(stored(extra, start=23), [(1, 0)])
        assert n == cut_batches
        await part.wait_flushed(23 + n)
        assert part.truncate_to(23) == 23
        assert outcome(part, 7, 3, 1) is Outcome.APPEND
        assert outcome(part, 7, 4, 1) is Outcome.OUT_OF_ORDER  # strict: 3 first
        assert outcome(part, 7, 2, 1) is Outcome.DUPLICATE
        await shut(part)

    asyncio.run(go())


def test_recovery_from_a_snapshot_taken_before_a_cut_keeps_pids_only_retention_deleted(
    tmp_path: Path,
) -> None:
    """Recovery does not trust a snapshot taken before a cut (it rebuilds from the log
    start), but PIDs whose batches retention deleted are in no log: their rows come back
    from that snapshot, with only the batches below the log start (the snapshot also saw
    PID 7's sequences 3-4, which the cut dropped: a resend of 3 must append)."""
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        part, b = await follower_past_pid7(tmp_path, clock, policy)
        start = part.log.log_start_offset
        assert start > 3
        extra = [bytes(raw_batch(7, 3 + i, clock.now)) for i in range(2)]
        extra.append(bytes(raw_batch(9, 0, clock.now)))
        assert part.append_replicated(stored(extra, start=23), [(1, 0)]) == 3
        await part.wait_flushed(26)
        await b.snapshot_now()  # sees PID 7 at sequence 4 and PID 9
        assert part.truncate_to(23) == 23
        await shut(part)
        again = reopen(tmp_path, clock, b, policy=policy, hw=23)
        assert again.log.log_start_offset == start
        assert outcome(again, 7, 3, 1) is Outcome.APPEND  # not UNKNOWN_PID, not DUPLICATE
        assert outcome(again, 7, 2, 1) is Outcome.DUPLICATE
        assert outcome(again, 8, 20, 1) is Outcome.APPEND
        assert again.state.get(9) is None  # it wrote only in the cut range
        await shut(again)

    asyncio.run(go())


async def replica_fetch_from(
    lead: Partition, tmp_path: Path, clock: ManualClock, *, offset: int
) -> P.Response:
    """Follower 2's REPLICA_FETCH at ``offset`` answered by ``lead``'s replica manager."""
    settings = SimpleNamespace(
        server_id=1,
        routes={},
        replica_lag_time_max_ms=10_000,
        isr_change_min_interval_ms=0,
        replica_fetch_wait_max_ms=0,
        fetch_bytes_max=1 << 20,
    )
    registry = SimpleNamespace(zk=None, refresh=lambda: None, assignment=None)
    mgr = ReplicaManager(settings, registry, {("t", 0): lead}, tmp_path, clock_ms=clock)  # type: ignore[arg-type]
    req = P.Request(
        P.REPLICA_FETCH, 1, "t", 0, offset=offset, max_bytes=1 << 20, replica_id=2, leader_epoch=1
    )
    return P.decode_response(P.REPLICA_FETCH, (await mgr.replica_fetch(req, lead))[4:])


def test_a_replica_fetch_below_the_leaders_log_start_restarts_the_follower_there(
    tmp_path: Path,
) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        # The leader: retention took its old segments.
        lead = open_part(tmp_path / "leader", clock_ms=clock, policy=policy)
        lead.hosted = True
        lead.become_leader(1, 1, [1, 2], [1])
        b = make_log_manager(tmp_path / "leader", clock, lead)
        for seq in range(20):
            append(lead, 8, seq, OLD_TS)
        await lead.wait_durable(lead.log.next_offset)
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        start, end = lead.log.log_start_offset, lead.log.next_offset
        resp = await replica_fetch_from(lead, tmp_path, clock, offset=2)
        assert resp.error_code == errors.OffsetOutOfRange.code
        assert resp.high_watermark == start  # where the follower starts over
        # The follower: two batches of PID 7, then down while the leader moved on.
        fol = open_part(tmp_path / "follower", clock_ms=clock, policy=policy)
        fol.become_follower(1, 1, "127.0.0.1:1")
        assert (
            fol.append_replicated(
                stored([bytes(raw_batch(7, s, OLD_TS)) for s in range(2)]), [(1, 0)]
            )
            == 2
        )
        await fol.wait_flushed(2)
        fol.set_high_watermark(2)
        fol.restart_at(start)
        assert (fol.log.log_start_offset, fol.log.next_offset, fol.high_watermark) == (start,) * 3
        assert segment_files(tmp_path / "follower") == [f"{start:020d}.log"]
        assert outcome(fol, 7, 1, 1) is Outcome.DUPLICATE  # its own state stays
        data = lead.replica_read(start, 1 << 20)
        assert (
            fol.append_replicated(memoryview(b"".join(data)), lead.epochs.entries_from(start)) > 0
        )
        assert fol.log.next_offset == end
        await fol.flusher.wait_idle()
        fol.close()
        again = open_part(tmp_path / "follower", clock_ms=clock, policy=policy)
        assert (again.log.log_start_offset, again.log.next_offset) == (start, end)
        await shut(again)
        # A new replica (no epochs yet) starts at the log start too, inside epoch 1.
        new = open_part(tmp_path / "new", clock_ms=clock, policy=policy)
        new.become_follower(1, 1, "127.0.0.1:1")
        new.restart_at(start)
        assert (
            new.append_replicated(memoryview(b"".join(data)), lead.epochs.entries_from(start)) > 0
        )
        assert new.epochs.entries == [(1, start)] and new.log.next_offset == end
        await shut(new)
        await shut(lead)

    asyncio.run(go())


def test_a_follower_starting_over_gets_the_state_of_pids_that_wrote_only_in_the_skipped_range(
    tmp_path: Path,
) -> None:
    """The start-over answer carries the leader's rows as of its log start: PID 5 wrote
    only in the range the follower skips; without its row the follower, once it leads,
    would answer its next batch UNKNOWN_PID (docs/log.md)."""
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        lead = open_part(tmp_path / "leader", clock_ms=clock, policy=policy)
        lead.hosted = True
        lead.become_leader(1, 1, [1, 2], [1])
        b = make_log_manager(tmp_path / "leader", clock, lead)
        for seq in range(2):
            append(lead, 7, seq, OLD_TS)  # the follower holds these two
        for seq in range(3):
            append(lead, 5, seq, OLD_TS)  # only in the range the follower will skip
        for seq in range(20):
            append(lead, 8, seq, OLD_TS)
        append(lead, 7, 2, clock.now)  # PID 7 also wrote above the leader's log start
        await lead.wait_durable(lead.log.next_offset)
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        start = lead.log.log_start_offset
        assert start > 5
        resp = await replica_fetch_from(lead, tmp_path, clock, offset=2)
        assert resp.error_code == errors.OffsetOutOfRange.code and resp.high_watermark == start
        rows = _leader_rows(lead, resp.data)
        # 5 whole; 7 and 8 also wrote above the start: their batches below it (sim finding
        # s23.1), the follower replays the others
        assert rows is not None and {r[0] for r in rows.rows} == {5, 7, 8}
        assert all(r[4][i + 2] < start for r in rows.rows for i in range(0, len(r[4]), 3))
        fol = open_part(tmp_path / "follower", clock_ms=clock, policy=policy)
        fol.become_follower(1, 1, "127.0.0.1:1")
        held = [bytes(raw_batch(7, s, OLD_TS)) for s in range(2)]
        assert fol.append_replicated(stored(held), [(1, 0)]) == 2
        await fol.wait_flushed(2)
        fol.set_high_watermark(2)
        fol.restart_at(start, rows)
        data = lead.replica_read(start, 1 << 20)
        assert (
            fol.append_replicated(memoryview(b"".join(data)), lead.epochs.entries_from(start)) > 0
        )
        for part in (lead, fol):
            assert outcome(part, 5, 3, 1) is Outcome.APPEND  # not UNKNOWN_PID
            assert outcome(part, 5, 2, 1) is Outcome.DUPLICATE
            assert outcome(part, 7, 3, 1) is Outcome.APPEND
            assert outcome(part, 8, 20, 1) is Outcome.APPEND
        with pytest.raises(FetchSessionError):
            _leader_rows(lead, memoryview(bytes(resp.data)[:-1] + b"\x00"))
        await shut(fol)
        await shut(lead)

    asyncio.run(go())


# -- retention over Kafka batches
KPID = 7


def kafka(epoch: int, seq: int, ts: int) -> bytes:
    return K.encode_kafka_batch(
        [(None, b"x" * 600)],
        producer_id=KPID,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp_ms=ts,
    )


def decide(part: Partition, raw: bytes) -> tuple[Outcome, int]:
    h = P.decode_batch_header(raw)
    d = part.state.check_append(h.pid, h.generation, h.base_sequence, h.count)
    return d.outcome, d.base_offset


def test_a_kafka_pid_whose_segments_all_went_keeps_its_state(tmp_path: Path) -> None:
    """Retention over Kafka batches (docs/kafka.md): segments of a Kafka producer's batches go
    by age, and its state survives in the snapshot's rows, so it still answers by Kafka's
    rules, not UNKNOWN_PRODUCER_ID."""

    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        b = make_log_manager(tmp_path, clock, part)
        for seq in range(5):
            raw = kafka(3, seq, OLD_TS)
            h = K.validate_kafka_batch(raw)
            d, _ = part.append(memoryview(raw), h, lambda *_: None, epoch=part.leader_epoch)
            assert d.outcome is Outcome.APPEND
        await fill(part, 8, range(20), OLD_TS)  # ours, old too
        await fill(part, 8, range(20, 30), clock.now)
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        first = part.log.segments[0].base_offset
        assert first > 5, "the Kafka producer's batches are all deleted"
        await shut(part)
        again = reopen(tmp_path, clock, b, policy=policy)
        assert again.log.log_start_offset == first
        assert decide(again, kafka(3, 5, 1)) == (Outcome.APPEND, -1)  # not UNKNOWN_PID
        assert decide(again, kafka(3, 4, 1)) == (Outcome.DUPLICATE, 4)  # its first offset
        assert decide(again, kafka(2, 5, 1))[0] is Outcome.FENCED
        assert decide(again, kafka(4, 0, 1))[0] is Outcome.APPEND
        await shut(again)

    asyncio.run(go())
