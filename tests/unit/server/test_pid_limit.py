"""The tracked-PID limit (after Kafka's KIP-936) and the column storage of the producer-state
table: a full table refuses a new PID with TOO_MANY_PIDS instead of forgetting a live one,
evicts only PIDs idle long enough (monotonic: only expired ones), and replay never refuses.
Also the batch storage's compact and flat forms, which must answer DUPLICATE alike."""

from __future__ import annotations

import asyncio
from array import array
from pathlib import Path

import pytest

from partition_server.partition import Partition, replay_batch
from partition_server.producer_state import FenceOutcome, Outcome, ProducerStateTable
from partition_server.testing import open_part
from pidlease.errors import TooManyPids
from pidlease.wire.protocol import BatchHeader, batch_from_records, encode_record, validate_batch

IDLE = 1_000


def table(
    mode: str = "strict", pids_max: int = 2, expire_ms: int | None = None, k: int = 5
) -> ProducerStateTable:
    return ProducerStateTable(
        mode=mode, batches_kept=k, pids_max=pids_max, evict_idle_min_ms=IDLE, expire_ms=expire_ms
    )


def write(
    t: ProducerStateTable, pid: int, base: int, count: int, offset: int, now: int, gen: int = 1
) -> None:
    d = t.check_append(pid, gen, base, count, now)
    assert d.outcome is Outcome.APPEND, d
    t.apply_append(pid, gen, base, count, offset, now)
    t.mark_durable(offset + count)


def test_full_table_refuses_a_new_pid_and_changes_nothing() -> None:
    t = table()
    write(t, 1, 0, 1, 0, now=0)
    write(t, 2, 0, 1, 1, now=10)
    before = (t.export_rows(), t.pids(), t.evicted_total)
    d = t.check_append(3, 1, 0, 1, now_ms=IDLE - 1)  # PID 1 idle 999 ms: not enough
    assert d.outcome is Outcome.TOO_MANY_PIDS
    for words in (
        "tracked_pids_max_per_partition=2",
        "pid_evict_idle_min_ms=1000",
        "producer names",
        "PIDLEASE_TRACKED_PIDS_MAX_PER_PARTITION",
    ):
        assert words in d.detail, (words, d.detail)
    assert (t.export_rows(), t.pids(), t.evicted_total) == before
    assert t.refused_total == 1
    # tracked PIDs go on normally, and a tracked PID's append makes no room
    write(t, 1, 1, 1, 2, now=IDLE - 1)
    write(t, 2, 1, 1, 3, now=IDLE - 1)
    assert t.check_append(3, 1, 0, 1, now_ms=IDLE + 5).outcome is Outcome.TOO_MANY_PIDS
    # without now_ms (followers, replay) the limit is not the check's business
    assert t.check_append(3, 1, 0, 1).outcome is Outcome.APPEND
    # a PID that would be UNKNOWN_PID anyway is told so, not TOO_MANY_PIDS
    assert t.check_append(3, 1, 4, 1, now_ms=IDLE - 1).outcome is Outcome.UNKNOWN_PID


def test_idle_enough_pid_is_evicted_and_later_gets_unknown_pid_never_a_duplicate() -> None:
    t = table()
    write(t, 1, 0, 5, 0, now=0)
    write(t, 2, 0, 1, 5, now=500)
    write(t, 3, 0, 1, 6, now=IDLE)  # PID 1 idle exactly 1000 ms: evicted
    assert t.pids() == [2, 3] and t.evicted_total == 1 and t.get(1) is None
    for base, count in ((5, 1), (3, 2), (0, 5)):
        d = t.check_append(1, 1, base, count, now_ms=IDLE)
        if base:
            assert d.outcome is Outcome.UNKNOWN_PID, (base, d)
        else:
            # base 0 of an unknown PID is a new entry by the contract; here the table is
            # full with PID 2 idle only 500 ms, so even that is refused
            assert d.outcome is Outcome.TOO_MANY_PIDS


def test_in_flight_pid_is_never_evicted() -> None:
    t = table()
    t.apply_append(1, 1, 0, 1, 5, now_ms=0)  # at offset 5, not durable yet
    write(t, 2, 0, 1, 0, now=5 * IDLE)  # durable up to offset 1 only
    assert t.check_append(3, 1, 0, 1, now_ms=5 * IDLE).outcome is Outcome.TOO_MANY_PIDS
    t.mark_durable(6)
    assert t.check_append(3, 1, 0, 1, now_ms=5 * IDLE).outcome is Outcome.APPEND
    write(t, 3, 0, 1, 6, now=5 * IDLE)
    assert t.pids() == [2, 3]


def test_eviction_follows_last_use_not_creation() -> None:
    t = table(pids_max=3)
    for pid in (1, 2, 3):
        write(t, pid, 0, 1, pid, now=pid)
    t.touch(1, 50)  # PRODUCER_STATE (a lease renewal) refreshes PID 1
    write(t, 4, 0, 1, 10, now=IDLE + 10)
    assert t.pids() == [3, 1, 4]  # 2 was the least recently used
    write(t, 5, 0, 1, 11, now=IDLE + 10)
    assert t.pids() == [1, 4, 5] and t.evicted_total == 2


def test_monotonic_never_evicts_a_live_pid() -> None:
    t = table("monotonic", expire_ms=10 * IDLE)
    write(t, 1, 100, 1, 0, now=0)
    write(t, 2, 7, 1, 1, now=0)
    # idle far beyond pid_evict_idle_min_ms, but not expired: refused
    d = t.check_append(3, 1, 0, 1, now_ms=10 * IDLE - 1)
    assert d.outcome is Outcome.TOO_MANY_PIDS and "pid_expire_ms" in d.detail
    # replay/followers still apply: the table grows past the limit instead
    t.apply_append(3, 1, 5, 1, 2, now_ms=10 * IDLE - 1, durable=True)
    assert len(t) == 3 and t.evicted_total == 0
    # PID 1's old sequence ids are still refused as duplicates
    assert t.check_append(1, 1, 100, 1).outcome is Outcome.DUPLICATE
    # once expired by the normal rule, PIDs may go, down to below the limit
    write(t, 4, 0, 1, 3, now=10 * IDLE)
    assert t.pids() == [3, 4] and t.evicted_total == 2
    # without an expiry, monotonic never evicts
    u = table("monotonic")
    write(u, 1, 0, 1, 0, now=0)
    write(u, 2, 0, 1, 1, now=0)
    assert u.check_append(3, 1, 0, 1, now_ms=10**12).outcome is Outcome.TOO_MANY_PIDS


def test_replay_and_fences_never_refuse() -> None:
    t = table(pids_max=1)
    for pid in (1, 2, 3):
        replay_batch(t, BatchHeader(pid, 0, 0, 0, pid, 1, 0, 1, 0), 0)
    assert len(t) == 3  # nothing idle long enough: over the limit, nothing lost
    assert t.check_fence(9, 1, True) is FenceOutcome.APPEND
    t.apply_fence(9, 1, 0)
    assert len(t) == 4 and t.get(9) is not None


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


@pytest.mark.parametrize("k", [1, 2, 5])
def test_compact_and_flat_batch_forms_round_trip(k: int) -> None:
    """Batches kept in the compact form (contiguous sequences) and in flat triples (a hole,
    a huge offset gap, a sequence going back) answer DUPLICATE alike and export alike."""
    t = ProducerStateTable(mode="monotonic", batches_kept=k, pids_max=100)
    shapes = {
        1: [(0, 3, 0), (4, 1, 10), (5, 2, 20), (7, 1, 30), (8, 1, 40), (9, 5, 50)],  # compact
        2: [(0, 1, 1), (5, 1, 2), (6, 1, 3)],  # a hole
        3: [(0, 1, 4), (1, 1, 2**33), (2, 1, 2**33 + 1)],  # far offsets
        4: [(0, 1, 2**33 + 2), (1, 2**40, 2**33 + 3)],  # a vast batch
    }
    for pid, batches in shapes.items():
        for base, count, off in batches:
            t.apply_append(pid, 1, base, count, off, 0, durable=True)
    rows = t.export_rows()
    u = ProducerStateTable(mode="monotonic", batches_kept=k, pids_max=100)
    u.load_rows(rows)
    assert u.export_rows() == rows
    for pid, batches in shapes.items():
        kept = batches[-k:]
        flat = array("q", [x for b, c, o in kept for x in (b, b + c - 1, o)])
        assert t.get(pid).batches == flat  # type: ignore[union-attr]
        for tab in (t, u):
            for base, count, off in batches:
                d = tab.check_append(pid, 1, base, count)
                assert d.outcome is Outcome.DUPLICATE
                want = (off, off + count - 1) if (base, count, off) in kept else (-1, -1)
                assert (d.base_offset, d.last_offset) == want, (k, pid, base)


def test_slots_and_rings_are_reused() -> None:
    t = ProducerStateTable(batches_kept=3, pids_max=10, evict_idle_min_ms=0)
    for round_ in range(5):
        for n in range(1, 11):
            pid = n + round_ * 100
            for b in range(4):
                t.apply_append(pid, 1, b, 1, round_ * 1000 + pid * 4 + b, round_, durable=True)
        assert len(t) == 10
        t.expire(now_ms=round_ + 1, expire_ms=1)
        assert len(t) == 0
    assert len(t._pid) == 10 and len(t._rings) == 10 * 4
    assert t.memory_bytes() > 0


def test_refresh_is_touch_without_the_copy() -> None:
    t = table(pids_max=10)
    write(t, 1, 0, 1, 0, now=5)
    write(t, 2, 0, 1, 1, now=6)
    assert t.refresh(1, 9) and not t.refresh(3, 9)
    assert t.pids() == [2, 1] and t.get(1).last_use_ms == 9  # type: ignore[union-attr]
    assert t.refresh(1, 7) and t.get(1).last_use_ms == 9  # type: ignore[union-attr]
