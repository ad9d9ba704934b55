"""min_insync_replicas on a replicated partition without servers: a leader whose in-sync
set is below the topic's minimum refuses a write with nothing written, the high watermark
does not move while fewer replicas count, an ack waiting when the set shrinks is answered
NOT_ENOUGH_REPLICAS and its resend SEQUENCE_UNKNOWN until the set grows back, then
DUPLICATE (never a second copy)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from partition_server.isr import InSyncReplicas
from partition_server.partition import Partition
from partition_server.producer_state import FenceOutcome, Outcome
from partition_server.testing import b, open_part, outcome
from pidlease import errors
from pidlease.errors import NotEnoughReplicas
from pidlease.wire import protocol as P
from pidlease.wire.cluster import TopicSpec


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


def test_the_new_error_is_retriable_with_its_own_code() -> None:
    assert errors.ERRORS_BY_CODE[25] is NotEnoughReplicas
    assert errors.ERRORS_BY_NAME["NOT_ENOUGH_REPLICAS"] is NotEnoughReplicas
    assert NotEnoughReplicas.retriable and NotEnoughReplicas.http_status == 503
    assert not NotEnoughReplicas.invalid_metadata  # the leader is right; wait, not look up


def test_the_effective_minimum_comes_from_the_topic() -> None:
    assert [TopicSpec("t", 1, r).min_insync for r in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert TopicSpec("t", 1, 3, min_insync_replicas=1).min_insync == 1


def test_isr_rules_count_the_confirmed_set_for_writes_and_the_counted_for_commits() -> None:
    isr = InSyncReplicas(1, [1, 2, 3], [1], now_ms=0, min_insync=2)
    assert not isr.accepts_writes() and not isr.commits()
    isr.begin_change([2], [])  # a joiner counts for the HW before ZooKeeper confirms it
    assert isr.commits() and not isr.accepts_writes()
    isr.set_isr([1, 2])
    assert isr.accepts_writes() and isr.commits()


@pytest.mark.parametrize("mode", ["strict", "monotonic"])
def test_a_refused_produce_leaves_nothing_behind(tmp_path: Path, mode: str) -> None:
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
