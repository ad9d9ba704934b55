"""A replicated partition without servers: acks wait for the in-sync followers, recovery
does not call batches above the checkpointed high watermark durable, a follower's cut
rebuilds the producer state, and snapshot rows from before a cut are never trusted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from partition_server.log import PartitionLog
from partition_server.partition import Partition
from partition_server.producer_state import Outcome
from partition_server.testing import b, open_part, outcome, stored
from pidlease.errors import CorruptRecord, NotLeader
from pidlease.wire import protocol as P

SEGMENT_BYTES = 4096


def write_log(data_dir: Path, batches: list[bytes]) -> None:
    lg, _ = PartitionLog.open(data_dir / "t-0", 1 << 20)
    for raw in batches:
        buf = bytearray(raw)
        P.set_base_offset(buf, lg.next_offset)
        lg.append(buf, P.decode_batch_header(bytes(buf)).count)
    lg.close()


async def close(part: Partition) -> None:
    await part.flusher.wait_idle()  # no fsync of its files may be running when they close
    part.close()


def test_acks_wait_for_the_in_sync_followers(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path, segment_bytes_max=SEGMENT_BYTES)
        part.become_leader(1, 1, [1, 2, 3], [1, 2, 3])
        raw = bytearray(b(7, 0, 3))
        h = P.validate_batch(bytes(raw))
        _, fut = part.append(
            memoryview(raw), h, lambda base, last: (base, last), epoch=part.leader_epoch
        )
        assert fut is not None
        await part.wait_flushed(3)
        await asyncio.sleep(0.01)
        assert not fut.done() and part.high_watermark == 0
        assert outcome(part, 7, 0, 3) is Outcome.SEQUENCE_UNKNOWN  # not committed yet
        part.record_replica_fetch(2, 3)
        assert not fut.done()  # 3 has not fetched
        part.record_replica_fetch(3, 3)
        assert fut.done() and fut.result() == (0, 2) and part.high_watermark == 3
        assert outcome(part, 7, 0, 3) is Outcome.DUPLICATE
        # a follower's fetch of everything waits for the next append
        waiter = part.wait_for_data()
        assert not waiter.done()
        raw2 = bytearray(b(7, 3))
        _, fut2 = part.append(
            memoryview(raw2),
            P.validate_batch(bytes(raw2)),
            lambda *_: None,
            epoch=part.leader_epoch,
        )
        assert fut2 is not None
        assert waiter.done()
        # deposed before the followers had it: the ack fails as retriable NOT_LEADER
        part.become_follower(2, 2, "127.0.0.1:1")
        with pytest.raises(NotLeader):
            await fut2
        await close(part)

    asyncio.run(go())


def test_recovery_counts_only_below_the_checkpointed_high_watermark_as_durable(
    tmp_path: Path,
) -> None:
    write_log(tmp_path, [b(1, 0, 2), b(1, 2, 2), b(2, 0)])  # offsets 0-1, 2-3, 4

    async def go() -> None:
        part = open_part(tmp_path, segment_bytes_max=SEGMENT_BYTES, hw=2)
        assert part.high_watermark == 2 and part.log.next_offset == 5
        assert outcome(part, 1, 0, 2) is Outcome.DUPLICATE
        assert outcome(part, 1, 2, 2) is Outcome.SEQUENCE_UNKNOWN
        assert outcome(part, 2, 0, 1) is Outcome.SEQUENCE_UNKNOWN
        assert outcome(part, 1, 4, 1) is Outcome.APPEND
        part.set_high_watermark(5)
        assert outcome(part, 1, 2, 2) is Outcome.DUPLICATE
        assert outcome(part, 2, 0, 1) is Outcome.DUPLICATE
        await close(part)
        # with one replica nothing changes: the whole recovered log is durable
        solo = open_part(tmp_path, segment_bytes_max=SEGMENT_BYTES, hw=None)
        assert solo.high_watermark == 5 and outcome(solo, 1, 2, 2) is Outcome.DUPLICATE
        await close(solo)

    asyncio.run(go())


def test_follower_appends_what_the_leader_sent_and_refuses_a_gap(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path, segment_bytes_max=SEGMENT_BYTES)
        part.become_follower(1, 3, "127.0.0.1:1")
        n = part.append_replicated(memoryview(stored([b(1, 0, 2), b(1, 2)])), [(0, 0), (3, 2)])
        assert n == 2 and part.log.next_offset == 3
        assert part.epochs.entries == [(0, 0), (3, 2)]
        assert part.state.get(1).highwater == 2  # type: ignore[union-attr]
        # the same fetch again changes nothing (a fetch starts at the batch holding the offset)
        assert part.append_replicated(memoryview(stored([b(1, 2)], 2)), [(3, 2)]) == 0
        with pytest.raises(CorruptRecord):
            part.append_replicated(memoryview(stored([b(1, 5)], 5)), [(3, 2)])
        await part.wait_flushed(3)
        part.set_high_watermark(3)
        assert outcome(part, 1, 2, 1) is Outcome.DUPLICATE
        await close(part)

    asyncio.run(go())


def test_cutting_a_divergent_suffix_rebuilds_state_and_distrusts_older_snapshots(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        part = open_part(tmp_path, segment_bytes_max=SEGMENT_BYTES)
        part.become_follower(1, 1, "127.0.0.1:1")
        part.append_replicated(memoryview(stored([b(1, 0, 2), b(1, 2, 2), b(1, 4, 2)])), [(1, 0)])
        await part.wait_flushed(part.log.next_offset)
        part.set_high_watermark(2)
        image = await part.capture()  # rows say pid 1 is at sequence 5
        assert image.covered_to == 6 and image.truncations == 0
        end = part.truncate_to(3)  # inside the second batch: it goes whole
        assert end == 2 and part.log.next_offset == 2 and part.epochs.truncations == 1
        assert part.state.get(1).highwater == 1  # type: ignore[union-attr]
        assert outcome(part, 1, 2, 2) is Outcome.APPEND
        # the new leader's epoch 2 writes other records there, past the old covered_to
        part.append_replicated(memoryview(stored([b(1, 2, 1), b(9, 0, 5)], 2)), [(1, 0), (2, 2)])
        await part.wait_flushed(part.log.next_offset)
        assert part.log.next_offset == 8 and part.epochs.entries == [(1, 0), (2, 2)]
        await close(part)
        again = open_part(tmp_path, segment_bytes_max=SEGMENT_BYTES, hw=2, snapshot=image)
        e1 = again.state.get(1)
        assert e1 is not None and e1.highwater == 2  # not the snapshot's 5
        assert again.state.get(9) is not None
        assert again.epochs.truncations == 1
        await close(again)

    asyncio.run(go())


def test_a_follower_rejoins_only_once_it_holds_the_new_leaders_log_at_its_epoch_start(
    tmp_path: Path,
) -> None:
    """Simulation seed 501223 (before the fix): the old leader acked offset 56 (its high
    watermark 57); the new leader held 56 but had only learnt a high watermark of 56. A
    follower that had started over at 56 (empty) fetched at 56, "reached the high
    watermark", rejoined the in-sync set, and was elected when the leader died: the acked
    batch at 56 was gone. What the old leader may have acked is everything below the new
    leader's log end at the start of its epoch, not below its high watermark."""
    write_log(tmp_path, [b(7, 0, 3), b(7, 3)])  # offsets 0..3, log end 4
    part = open_part(tmp_path, hw=3)  # it learnt a high watermark of 3 as a follower
    part.set_min_insync(2)
    part.become_leader(1, 2, [1, 2, 3], [1])
    assert part.isr is not None
    assert part.high_watermark == 3  # one in sync of the two needed: it cannot move
    part.record_replica_fetch(2, 3)  # follower 2 holds 0..2: not offset 3, maybe acked
    assert part.isr.joiners(part.high_watermark) == []
    part.record_replica_fetch(2, 4)
    assert part.isr.joiners(part.high_watermark) == [2]
    part.close()
