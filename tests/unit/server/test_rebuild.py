"""Every path that rebuilds producer state (partition_server/rebuild.py, the table in
docs/log.md) keeps the state of a PID whose batches retention deleted: through a fence
(issue 23 item 2), a start-over followed by a crash (item 3) and a cut of more than K of its
batches followed by a crash (item 4). Real Partition, PartitionLog and snapshot files."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from partition_server.epochs import EpochHistory
from partition_server.partition import Partition
from partition_server.producer_state import Outcome
from partition_server.rebuild import START_OVER_FILE
from partition_server.replica_fetcher import _leader_rows
from partition_server.retention import LogPolicy
from partition_server.snapshot import decode as decode_snapshot
from partition_server.testing import open_part, outcome, stored
from pidlease import errors
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P
from pidlease.wire.protocol import KAFKA_GENERATION_BASE
from tests.helpers import ManualClock
from tests.unit.server.test_retention import (
    HOUR_MS,
    OLD_TS,
    SEG,
    append,
    follower_past_pid7,
    make_log_manager,
    raw_batch,
    reopen,
    replica_fetch_from,
    retain,
    shut,
)

POLICY = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)


def fence(pid: int, generation: int, ts: int) -> bytes:
    return P.encode_control_batch(pid=pid, generation=generation, timestamp_ms=ts)


def gen_outcome(part: Partition, pid: int, generation: int, seq: int) -> Outcome:
    return part.state.check_append(pid, generation, seq, 1).outcome


async def fenced_follower(tmp_path: Path, clock: ManualClock) -> tuple[Partition, object]:
    """``follower_past_pid7`` (PID 7 wrote 0..2, retention deleted them), then a takeover's
    FENCE of PID 7 at generation 1 (offset 23, committed) and PID 9's batch above the high
    watermark (offset 24, which the new leader does not have)."""
    part, b = await follower_past_pid7(tmp_path, clock, POLICY)
    assert part.state.get(7) is not None and part.state.get(7).highwater == 2  # type: ignore[union-attr]
    assert part.append_replicated(stored([fence(7, 1, clock.now)], start=23), [(1, 0)]) == 1
    await part.wait_flushed(24)
    part.set_high_watermark(24)
    extra = [bytes(raw_batch(9, 0, clock.now))]
    assert part.append_replicated(stored(extra, start=24), [(1, 0)]) == 1
    await part.wait_flushed(25)
    return part, b


def test_a_cut_keeps_the_highwater_of_a_pid_whose_only_batch_left_is_a_fence(
    tmp_path: Path,
) -> None:
    """Item 2: a fence raises the generation; it never stands in for the data batches
    retention deleted (the rebuild from the fence alone gave highwater -1: sequence 0)."""
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        part, _ = await fenced_follower(tmp_path, clock)
        assert part.truncate_to(24) == 24
        e = part.state.get(7)
        assert e is not None
        assert (e.generation, e.highwater, e.durable_highwater) == (1, 2, 2)
        assert gen_outcome(part, 7, 1, 3) is Outcome.APPEND
        assert gen_outcome(part, 7, 1, 0) is Outcome.DUPLICATE
        assert gen_outcome(part, 7, 0, 3) is Outcome.FENCED
        assert part.state.get(9) is None
        await shut(part)

    asyncio.run(go())


def test_recovery_from_a_distrusted_snapshot_keeps_the_highwater_of_a_pid_only_fenced_since(
    tmp_path: Path,
) -> None:
    """Item 2, the other path: the snapshot (from before the fence) is not trusted after
    the cut, the rebuild from the log start finds PID 7's fence only."""
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        part, b = await fenced_follower(tmp_path, clock)
        part.truncate_to(24)
        await shut(part)  # killed before the next snapshot
        again = reopen(tmp_path, clock, b, policy=POLICY, hw=24)
        e = again.state.get(7)
        assert e is not None
        assert (e.generation, e.highwater) == (1, 2)
        assert gen_outcome(again, 7, 1, 3) is Outcome.APPEND
        assert gen_outcome(again, 7, 0, 3) is Outcome.FENCED
        assert again.state.get(9) is None
        await shut(again)

    asyncio.run(go())


def test_recovery_after_a_cut_of_more_than_k_batches_keeps_the_committed_highwater(
    tmp_path: Path,
) -> None:
    """Item 4: PID 7's committed batches (0..2) are below the log start, its 7 newer ones
    (3..9, more than the K=5 a row keeps) above the high watermark; the snapshot saw them,
    the cut drops them, the server dies before its next snapshot. The row's batches are all
    cut, and only the durable highwater in the snapshot says where PID 7 was committed."""
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        part, b = await follower_past_pid7(tmp_path, clock, POLICY)
        extra = [bytes(raw_batch(7, 3 + i, clock.now)) for i in range(7)]
        assert part.append_replicated(stored(extra, start=23), [(1, 0)]) == 7
        await part.wait_flushed(30)
        await b.snapshot_now()  # sees PID 7 at 9, committed at 2
        assert part.truncate_to(23) == 23
        assert outcome(part, 7, 3, 1) is Outcome.APPEND
        await shut(part)
        again = reopen(tmp_path, clock, b, policy=POLICY, hw=23)
        assert outcome(again, 7, 3, 1) is Outcome.APPEND  # not UNKNOWN_PID
        assert outcome(again, 7, 2, 1) is Outcome.DUPLICATE
        assert outcome(again, 7, 4, 1) is Outcome.OUT_OF_ORDER
        await shut(again)

    asyncio.run(go())


async def leader_past_pid7(tmp_path: Path, clock: ManualClock) -> tuple[Partition, int]:
    """A leader whose PID 7 wrote 0..5 and PID 8 0..19, retention deleted PID 7's."""
    lead = open_part(tmp_path / "leader", clock_ms=clock, policy=POLICY)
    lead.hosted = True
    lead.become_leader(1, 1, [1, 2], [1])
    b = make_log_manager(tmp_path / "leader", clock, lead)
    for seq in range(6):
        append(lead, 7, seq, OLD_TS)
    for seq in range(20):
        append(lead, 8, seq, OLD_TS)
    await lead.wait_durable(lead.log.next_offset)
    await b.snapshot_now()
    assert await retain(b, clock.now) > 0
    assert lead.log.log_start_offset > 6
    return lead, lead.log.log_start_offset


def test_a_follower_killed_after_starting_over_keeps_the_state_it_adopted(
    tmp_path: Path,
) -> None:
    """Item 3: the follower held PID 7's sequences 0..1 and a snapshot of them, was down
    while PID 7 wrote 2..5 and retention deleted them on the leader, started over with the
    leader's rows (PID 7 at 5) and was killed before its next snapshot. Its older snapshot
    says PID 7 is at 1: recovery must not trust it."""
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        lead, start = await leader_past_pid7(tmp_path, clock)
        lead.state.note_dropped(777)  # the leader expired some PID used at 777
        fdir = tmp_path / "follower"
        fol = open_part(fdir, clock_ms=clock, policy=POLICY)
        fol.become_follower(1, 1, "127.0.0.1:1")
        fb = make_log_manager(fdir, clock, fol)
        held = [bytes(raw_batch(7, s, OLD_TS)) for s in range(2)]
        assert fol.append_replicated(stored(held), [(1, 0)]) == 2
        await fol.wait_flushed(2)
        fol.set_high_watermark(2)
        await fb.snapshot_now()  # PID 7 at 1
        resp = await replica_fetch_from(lead, tmp_path, clock, offset=2)
        assert resp.error_code == errors.OffsetOutOfRange.code and resp.high_watermark == start
        assert resp.data is not None
        image = decode_snapshot(bytes(resp.data)).partitions[("t", 0)]
        assert image.dropped_last_use_max_ms == 777  # the leader's horizon travels along
        fol.restart_at(start, _leader_rows(fol, resp.data))
        assert fol.state.dropped_last_use_max_ms == 777
        data = lead.replica_read(start, 1 << 20)
        assert fol.append_replicated(memoryview(b"".join(data)), lead.epochs.entries_from(start))
        await fol.wait_flushed(fol.log.next_offset)
        assert outcome(fol, 7, 6, 1) is Outcome.APPEND
        await shut(fol)  # SIGKILLed before the next snapshot
        again = reopen(fdir, clock, fb, policy=POLICY, hw=start)
        assert again.log.log_start_offset == start
        assert outcome(again, 7, 6, 1) is Outcome.APPEND  # not at 1: sequence 2 again
        assert outcome(again, 7, 5, 1) is Outcome.DUPLICATE
        assert outcome(again, 8, 20, 1) is Outcome.APPEND
        assert again.state.dropped_last_use_max_ms == 777
        await shut(again)
        await shut(lead)

    asyncio.run(go())


def test_the_start_over_image_goes_once_a_snapshot_holds_the_partition(tmp_path: Path) -> None:
    """The start-over image is trusted until a server snapshot captured after it replaces
    it; that snapshot also brings the adopted rows back after a crash."""
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        lead, start = await leader_past_pid7(tmp_path, clock)
        fdir = tmp_path / "follower"
        fol = open_part(fdir, clock_ms=clock, policy=POLICY)
        fol.become_follower(1, 1, "127.0.0.1:1")
        fb = make_log_manager(fdir, clock, fol)
        resp = await replica_fetch_from(lead, tmp_path, clock, offset=0)
        fol.restart_at(start, _leader_rows(fol, resp.data))
        image_file = fdir / "t-0" / START_OVER_FILE
        assert image_file.exists() and fol.start_over_file
        assert fol.epochs.truncations == 1  # older snapshots are no longer trusted
        await fb.snapshot_now()
        assert not image_file.exists() and not fol.start_over_file
        await shut(fol)
        again = reopen(fdir, clock, fb, policy=POLICY, hw=start)
        assert outcome(again, 7, 6, 1) is Outcome.APPEND
        assert outcome(again, 7, 5, 1) is Outcome.DUPLICATE
        await shut(again)
        await shut(lead)

    asyncio.run(go())


def test_a_start_over_whose_count_cannot_be_saved_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk after the image is written, before the raised truncation count is saved
    (the same as a crash there): the log and the state stay as they were, the old snapshot
    stays trusted and the image (written at the count not saved) is not; the next fetch
    starts over again."""
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        lead, start = await leader_past_pid7(tmp_path, clock)
        fdir = tmp_path / "follower"
        fol = open_part(fdir, clock_ms=clock, policy=POLICY)
        fol.become_follower(1, 1, "127.0.0.1:1")
        fb = make_log_manager(fdir, clock, fol)
        held = [bytes(raw_batch(7, s, OLD_TS)) for s in range(2)]
        assert fol.append_replicated(stored(held), [(1, 0)]) == 2
        await fol.wait_flushed(2)
        fol.set_high_watermark(2)
        await fb.snapshot_now()
        resp = await replica_fetch_from(lead, tmp_path, clock, offset=2)

        def full(self: EpochHistory) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(EpochHistory, "save", full)
            with pytest.raises(OSError, match="No space left"):
                fol.restart_at(start, _leader_rows(fol, resp.data))
        assert (fol.log.log_start_offset, fol.log.next_offset) == (0, 2)
        assert fol.epochs.truncations == 0
        assert outcome(fol, 7, 2, 1) is Outcome.APPEND  # its own state, nothing adopted
        assert (fdir / "t-0" / START_OVER_FILE).exists()
        await shut(fol)
        again = reopen(fdir, clock, fb, policy=POLICY, hw=2)
        assert (again.log.log_start_offset, again.log.next_offset) == (0, 2)
        assert outcome(again, 7, 2, 1) is Outcome.APPEND
        again.become_follower(1, 1, "127.0.0.1:1")
        again.restart_at(start, _leader_rows(again, resp.data))  # the next fetch
        assert outcome(again, 7, 6, 1) is Outcome.APPEND
        await shut(again)
        again = reopen(fdir, clock, fb, policy=POLICY, hw=start)
        assert outcome(again, 7, 6, 1) is Outcome.APPEND
        await shut(again)
        await shut(lead)

    asyncio.run(go())


def kafka_batch(pid: int, seq: int, ts: int) -> bytes:
    """A Kafka idempotent producer's batch (epoch 0), as the Kafka listener stores it."""
    return K.encode_kafka_batch(
        [(None, b"x" * 600)],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        base_timestamp_ms=ts,
    )


def kafka_append(part: Partition, pid: int, seq: int, ts: int) -> None:
    raw = bytearray(kafka_batch(pid, seq, ts))
    d, _ = part.append(
        memoryview(raw),
        K.validate_kafka_batch(bytes(raw)),
        lambda *_: None,
        epoch=part.leader_epoch,
    )
    assert d.outcome is Outcome.APPEND


def kafka_outcome(part: Partition, pid: int, seq: int) -> Outcome:
    return part.state.check_append(pid, KAFKA_GENERATION_BASE, seq, 1).outcome


def test_a_follower_starting_over_keeps_the_leaders_batches_below_its_log_start(
    tmp_path: Path,
) -> None:
    """Simulation seed 500201 (--retention): Kafka producer 7 wrote 0..5 (retention deleted them on
    the leader) and then 6, still in the leader's log. A follower holding 0..1 starts over
    at the leader's log start: the leader's rows must bring PID 7's batches below that
    start too, not only the rows of PIDs with no batch left there. Without them the
    follower's row went from 1 straight to 6 (the fetched batch); leading later it answered
    a resend of 5 (committed, deleted) OUT_OF_ORDER_SEQUENCE where the leader said
    DUPLICATE (Kafka's rules: a sequence below the next is a duplicate only when a kept
    batch holds it), and the producer failed."""
    clock = ManualClock(100 * HOUR_MS)

    async def go() -> None:
        lead = open_part(tmp_path / "leader", clock_ms=clock, policy=POLICY)
        lead.hosted = True
        lead.become_leader(1, 1, [1, 2], [1])
        b = make_log_manager(tmp_path / "leader", clock, lead)
        for seq in range(6):
            kafka_append(lead, 7, seq, OLD_TS)
        for seq in range(20):
            append(lead, 8, seq, OLD_TS)
        kafka_append(lead, 7, 6, clock.now)
        await lead.wait_durable(lead.log.next_offset)
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        start = lead.log.log_start_offset
        assert 6 <= start < lead.log.next_offset  # PID 7's 0..5 deleted, its 6 kept
        fdir = tmp_path / "follower"
        fol = open_part(fdir, clock_ms=clock, policy=POLICY)
        fol.become_follower(1, 1, "127.0.0.1:1")
        held = [kafka_batch(7, s, OLD_TS) for s in range(2)]
        assert fol.append_replicated(stored(held), [(1, 0)]) == 2
        await fol.wait_flushed(2)
        fol.set_high_watermark(2)
        resp = await replica_fetch_from(lead, tmp_path, clock, offset=2)
        assert resp.error_code == errors.OffsetOutOfRange.code and resp.high_watermark == start
        assert resp.data is not None
        fol.restart_at(start, _leader_rows(fol, resp.data))
        data = lead.replica_read(start, 1 << 20)
        assert fol.append_replicated(memoryview(b"".join(data)), lead.epochs.entries_from(start))
        await fol.wait_flushed(fol.log.next_offset)
        fol.set_high_watermark(fol.log.next_offset)
        answers = [(kafka_outcome(fol, 7, s), kafka_outcome(lead, 7, s)) for s in range(8)]
        assert kafka_outcome(fol, 7, 5) is Outcome.DUPLICATE
        assert [f for f, _ in answers] == [ld for _, ld in answers]
        await shut(fol)  # and so after a crash (the start-over image holds them)
        again = reopen(fdir, clock, make_log_manager(fdir, clock, fol), policy=POLICY, hw=start)
        assert kafka_outcome(again, 7, 5) is Outcome.DUPLICATE
        await shut(again)
        await shut(lead)

    asyncio.run(go())
