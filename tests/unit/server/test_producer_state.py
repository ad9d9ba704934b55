"""One test per row of the append rules table (docs/protocol.md, PRODUCE) (the rows the
partition's pure producer state decides; NOT_LEADER and UNAUTHORIZED are the server's and are
tested over the wire), plus fences, durability, expiry and the snapshot round trip."""

from __future__ import annotations

import time
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.partition import replay_batch
from partition_server.producer_state import (
    FenceOutcome,
    Outcome,
    ProducerStateTable,
    adopt_rows,
    cut_row,
    pids_with_data,
    row_below,
)
from pidlease.wire.protocol import FLAG_CONTROL, BatchHeader


def table(mode: str = "strict", k: int = 5, pids_max: int = 1000) -> ProducerStateTable:
    return ProducerStateTable(mode=mode, batches_kept=k, pids_max=pids_max)


def append(
    t: ProducerStateTable,
    pid: int,
    gen: int,
    base: int,
    count: int,
    offset: int,
    now_ms: int = 0,
    durable: bool = True,
) -> None:
    assert t.check_append(pid, gen, base, count).outcome is Outcome.APPEND
    t.apply_append(pid, gen, base, count, offset, now_ms)
    if durable:
        t.mark_durable(offset + count)


def test_pid_zero_and_dedup_off_skip_every_check() -> None:
    t = table()
    for base in (0, 5, 5, 0):
        assert t.check_append(0, 0, base, 1).outcome is Outcome.APPEND
        t.apply_append(0, 0, base, 1, 0, 0)
    assert len(t) == 0
    off = table("off")
    for base in (7, 7, 0):
        assert off.check_append(9, 1, base, 2).outcome is Outcome.APPEND
        off.apply_append(9, 1, base, 2, 0, 0)
    assert len(off) == 0
    assert off.check_fence(9, 5, True) is FenceOutcome.ABSENT


def test_older_generation_is_fenced() -> None:
    t = table()
    append(t, 1, 5, 0, 1, 0)
    d = t.check_append(1, 4, 1, 1)
    assert d.outcome is Outcome.FENCED
    # even a would-be duplicate from an older generation is fenced
    assert t.check_append(1, 4, 0, 1).outcome is Outcome.FENCED


def test_unknown_pid_strict_base_zero_creates_entry() -> None:
    t = table()
    append(t, 3, 7, 0, 4, 10, now_ms=123)
    e = t.get(3)
    assert e is not None
    assert (e.generation, e.highwater, e.durable_highwater, e.last_use_ms) == (7, 3, 3, 123)


def test_unknown_pid_strict_base_above_zero_is_unknown_pid() -> None:
    t = table()
    d = t.check_append(3, 7, 1, 1)
    assert d.outcome is Outcome.UNKNOWN_PID
    assert len(t) == 0


@pytest.mark.parametrize("base", [0, 1, 1000])
def test_unknown_pid_monotonic_any_base(base: int) -> None:
    t = table("monotonic")
    append(t, 3, 0, base, 2, 0)
    assert t.get(3).highwater == base + 1  # type: ignore[union-attr]


def test_next_sequence_appends_and_adopts_newer_generation() -> None:
    t = table()
    append(t, 1, 5, 0, 3, 0)
    append(t, 1, 6, 3, 2, 3)
    e = t.get(1)
    assert (e.generation, e.highwater) == (6, 4)  # type: ignore[union-attr]
    assert t.check_append(1, 5, 5, 1).outcome is Outcome.FENCED


def test_monotonic_accepts_any_higher_sequence() -> None:
    t = table("monotonic")
    append(t, 1, 0, 10, 1, 0)
    append(t, 1, 0, 50, 3, 1)
    assert t.check_append(1, 0, 53, 1).outcome is Outcome.APPEND
    d = t.check_append(1, 0, 5, 1)  # older than every kept batch: written before them
    assert (d.outcome, d.base_offset) == (Outcome.DUPLICATE, -1)
    d = t.check_append(1, 0, 30, 1)  # between two kept batches: never written
    assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 53)
    d = t.check_append(1, 0, 52, 3)  # straddles H
    assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 53)


def test_duplicate_answers_original_offsets_for_last_k_batches_only() -> None:
    t = table(k=3)
    for i in range(5):
        append(t, 1, 0, i * 2, 2, 100 + i * 2)
    for i in range(5):
        d = t.check_append(1, 0, i * 2, 2)
        assert d.outcome is Outcome.DUPLICATE
        if i >= 2:
            assert (d.base_offset, d.last_offset) == (100 + i * 2, 101 + i * 2)
        else:
            assert (d.base_offset, d.last_offset) == (-1, -1)
    # a different split of already-written sequences is a duplicate without offsets
    d = t.check_append(1, 0, 9, 1)
    assert (d.outcome, d.base_offset) == (Outcome.DUPLICATE, -1)


def test_in_flight_batch_is_sequence_unknown_until_durable() -> None:
    t = table()
    append(t, 1, 0, 0, 2, 0)
    append(t, 1, 0, 2, 2, 2, durable=False)
    d = t.check_append(1, 0, 2, 2)
    assert d.outcome is Outcome.SEQUENCE_UNKNOWN
    d = t.check_append(1, 0, 1, 2)  # straddles the durable highwater, at or below H
    assert d.outcome is Outcome.SEQUENCE_UNKNOWN
    assert t.get(1).durable_highwater == 1  # type: ignore[union-attr]
    t.mark_durable(3)  # not past the batch's last offset (3)
    assert t.check_append(1, 0, 2, 2).outcome is Outcome.SEQUENCE_UNKNOWN
    t.mark_durable(4)
    d = t.check_append(1, 0, 2, 2)
    assert (d.outcome, d.base_offset, d.last_offset) == (Outcome.DUPLICATE, 2, 3)


def test_gap_and_straddle_are_out_of_order_with_expected_sequence() -> None:
    t = table()
    append(t, 1, 0, 0, 3, 0)
    for base, count in ((4, 1), (2, 2), (10, 5)):
        d = t.check_append(1, 0, base, count)
        assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 3)


def test_fence_outcomes() -> None:
    t = table()
    assert t.check_fence(1, 5, False) is FenceOutcome.ABSENT
    assert t.check_fence(1, 5, True) is FenceOutcome.APPEND
    t.apply_fence(1, 5, 0)
    e = t.get(1)
    assert (e.generation, e.highwater, e.durable_highwater) == (5, -1, -1)  # type: ignore[union-attr]
    assert t.check_fence(1, 5, True) is FenceOutcome.SAME
    assert t.check_fence(1, 4, True) is FenceOutcome.FENCED
    assert t.check_fence(1, 6, False) is FenceOutcome.APPEND
    # a fenced-in entry: the zombie's first append is fenced, the new holder starts at 0
    assert t.check_append(1, 4, 0, 1).outcome is Outcome.FENCED
    assert t.check_append(1, 5, 0, 1).outcome is Outcome.APPEND
    d = t.check_append(1, 5, 3, 1)
    assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 0)


def test_expiry_drops_least_recently_used_first_and_touch_keeps_alive() -> None:
    t = table()
    for pid in (1, 2, 3):
        append(t, pid, 0, 0, 1, pid, now_ms=pid * 10)
    t.touch(1, 100)  # PRODUCER_STATE refreshes last use
    assert t.expire(now_ms=115, expire_ms=80) == 2  # 2 (20) and 3 (30) are 80 ms old
    assert t.pids() == [1]
    assert t.expire(now_ms=179, expire_ms=80) == 0
    assert t.expire(now_ms=180, expire_ms=80) == 1
    assert len(t) == 0 and t.expired_total == 3
    assert t.check_append(1, 0, 1, 1).outcome is Outcome.UNKNOWN_PID


def test_expiry_keeps_pids_with_batches_in_flight() -> None:
    t = table()
    append(t, 1, 0, 0, 1, 0, now_ms=0, durable=False)
    assert t.expire(now_ms=1000, expire_ms=10) == 0
    t.mark_durable(1)
    assert t.expire(now_ms=2000, expire_ms=10) == 1


def test_tracked_pids_are_bounded_by_evicting_the_least_recently_used() -> None:
    t = table(pids_max=3)
    t.evict_idle_min_ms = 0  # every idle PID may go (the limit's rules: below)
    for pid in range(1, 6):
        append(t, pid, 0, 0, 1, pid, now_ms=pid)
    assert t.pids() == [3, 4, 5] and t.evicted_total == 2


def test_rows_round_trip_keeps_rules_identical() -> None:
    t = table(k=2)
    for i in range(4):
        append(t, 8, 3, i, 1, i, now_ms=i)
    t.apply_fence(9, 2, 5)
    u = table(k=2)
    u.load_rows(t.export_rows())
    assert u.export_rows() == t.export_rows()
    for args in (
        (8, 3, 2, 1),
        (8, 3, 3, 1),
        (8, 3, 4, 1),
        (8, 2, 4, 1),
        (9, 1, 0, 1),
        (9, 2, 0, 1),
    ):
        assert u.check_append(*args) == t.check_append(*args)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match=r"dedup mode must be one of .*, not 'sometimes'"):
        ProducerStateTable(mode="sometimes")


def test_group_commit_boundary_between_two_pending_batches() -> None:
    t = table()
    append(t, 1, 0, 0, 2, 0, durable=False)  # offsets 0-1
    append(t, 1, 0, 2, 2, 2, durable=False)  # offsets 2-3
    t.mark_durable(2)  # the flush covered only the first batch
    assert t.get(1).durable_highwater == 1  # type: ignore[union-attr]
    assert t.check_append(1, 0, 0, 2).outcome is Outcome.DUPLICATE
    assert t.check_append(1, 0, 2, 2).outcome is Outcome.SEQUENCE_UNKNOWN


# -- monotonic: a refusal leaves no hole (docs/protocol.md, PRODUCE) ---------------------------
def test_monotonic_refusal_blocks_later_batches_until_the_resend() -> None:
    t = table("monotonic")
    append(t, 1, 0, 0, 10, 0)
    assert t.check_append(1, 0, 10, 5).outcome is Outcome.APPEND
    t.note_refused(1, 0, 10, 5)  # e.g. the disk was full
    for base, count in ((15, 5), (40, 1), (11, 2)):  # already in flight behind it
        d = t.check_append(1, 0, base, count)
        assert (d.outcome, d.expected_sequence) == (Outcome.SEQUENCE_UNKNOWN, 10)
        assert "from sequence 10" in d.detail
    t.note_refused(1, 0, 20, 1)  # a later refusal keeps the lowest blocked base
    assert t.blocked_from(1) == 10
    # what the rules decide before the block still does
    assert t.check_append(1, 0, 0, 10).outcome is Outcome.DUPLICATE
    assert t.check_append(1, 0, 9, 3).outcome is Outcome.OUT_OF_ORDER
    # the resend (or any batch from at or below the blocked base) appends; the batches the
    # block refused are refused ranges too, and it lifts only once all are resent (issue
    # 23 item 5: it used to lift here, and 40 was appended above the never-resent 15..20)
    append(t, 1, 0, 10, 5, 10)
    d = t.check_append(1, 0, 40, 1)
    assert (d.outcome, d.expected_sequence) == (Outcome.SEQUENCE_UNKNOWN, 15)
    append(t, 1, 0, 15, 5, 15)
    append(t, 1, 0, 20, 1, 20)
    assert t.blocked_from(1) == 40
    append(t, 1, 0, 40, 1, 21)
    assert t.blocked_from(1) is None
    d = t.check_append(1, 0, 10, 5)
    assert (d.outcome, d.base_offset, d.last_offset) == (Outcome.DUPLICATE, 10, 14)


def test_monotonic_refusal_of_a_new_pid_blocks_it_too() -> None:
    t = table("monotonic")
    t.note_refused(7, 3, 100, 4)  # TOO_MANY_PIDS for a PID with no state yet
    d = t.check_append(7, 3, 104, 4)  # room appeared meanwhile: still not before 100
    assert (d.outcome, d.expected_sequence) == (Outcome.SEQUENCE_UNKNOWN, 100)
    append(t, 7, 3, 100, 4, 0)
    assert t.blocked_from(7) == 104  # refused behind 100: waits for its own resend
    append(t, 7, 3, 104, 4, 4)
    assert t.blocked_from(7) is None


def test_takeover_clears_the_block_and_the_given_up_range_is_never_duplicate() -> None:
    t = table("monotonic", k=2)
    append(t, 1, 0, 0, 10, 0)
    t.note_refused(1, 0, 10, 5)
    t.apply_fence(1, 0, 0)  # the same generation (a no-op fence) gives nothing up
    assert t.blocked_from(1) == 10
    t.apply_fence(1, 1, 0)  # takeover: the new holder resumes after the highwater (9)
    assert t.blocked_from(1) is None
    for i in range(3):  # ... at 50: 10..49 were given up, never written
        append(t, 1, 1, 50 + 10 * i, 10, 10 + 10 * i)
    # [0..9] and [10..14] are both older than every kept batch ([60..69], [70..79]), but
    # only [0..9] was written
    d = t.check_append(1, 1, 10, 5)
    assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 80)
    assert t.check_append(1, 1, 5, 10).outcome is Outcome.OUT_OF_ORDER  # reaches into it
    d = t.check_append(1, 1, 0, 10)  # a source replaying everything after the takeover
    assert (d.outcome, d.base_offset) == (Outcome.DUPLICATE, -1)
    assert t.check_append(1, 1, 50, 10).outcome is Outcome.DUPLICATE  # the new holder's
    d = t.check_append(1, 1, 60, 10)  # a kept batch
    assert (d.outcome, d.base_offset) == (Outcome.DUPLICATE, 20)


def test_a_new_holder_resuming_at_the_refused_base_gives_nothing_up() -> None:
    t = table("monotonic", k=1)
    append(t, 1, 0, 0, 10, 0)
    t.note_refused(1, 0, 10, 5)
    t.apply_fence(1, 1, 0)
    append(t, 1, 1, 10, 5, 10)  # resent by the new holder after all
    append(t, 1, 1, 20, 5, 15)
    assert t.check_append(1, 1, 10, 5).outcome is Outcome.DUPLICATE


def test_ranges_given_up_are_bounded_per_pid() -> None:
    t = table("monotonic", k=1)
    append(t, 1, 0, 0, 1, 0)
    for g in range(1, 8):  # seven takeovers, each after a refusal at 100 g
        t.note_refused(1, g - 1, 100 * g, 1)
        t.apply_fence(1, g, 0)
        append(t, 1, g, 100 * g + 50, 1, g)
    append(t, 1, 7, 10_000, 1, 8)
    # the oldest ranges were merged: more refused, never one more DUPLICATE
    for g in range(1, 8):
        assert t.check_append(1, 7, 100 * g, 1).outcome is Outcome.OUT_OF_ORDER
    assert t.check_append(1, 7, 0, 1).outcome is Outcome.DUPLICATE
    assert t.check_append(1, 7, 750, 1).outcome is Outcome.DUPLICATE


def test_monotonic_range_never_written_is_not_duplicate() -> None:
    t = table("monotonic")
    append(t, 1, 0, 0, 10, 0)
    append(t, 1, 0, 20, 10, 10)
    d = t.check_append(1, 0, 10, 6)  # at or below the durable highwater, but a hole
    assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 30)
    d = t.check_append(1, 0, 5, 3)  # inside a written batch: a different split of it
    assert (d.outcome, d.base_offset) == (Outcome.DUPLICATE, -1)
    d = t.check_append(1, 0, 5, 10)  # from a written batch into the hole after it
    assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 30)
    d = t.check_append(1, 0, 20, 10)
    assert (d.outcome, d.base_offset, d.last_offset) == (Outcome.DUPLICATE, 10, 19)
    append(t, 1, 0, 40, 5, 20, durable=False)
    d = t.check_append(1, 0, 40, 5)  # kept but not yet durable
    assert d.outcome is Outcome.SEQUENCE_UNKNOWN
    d = t.check_append(1, 0, 32, 3)  # in flight as far as the rows say: decided once durable
    assert d.outcome is Outcome.SEQUENCE_UNKNOWN
    t.mark_durable(25)
    assert t.check_append(1, 0, 32, 3).outcome is Outcome.OUT_OF_ORDER


def test_note_refused_is_harmless_on_strict_and_off_topics() -> None:
    for mode in ("strict", "off"):
        t = table(mode)
        append(t, 1, 0, 0, 5, 0)
        t.note_refused(1, 0, 5, 5)
        t.note_refused(2, 0, 0, 1)
        assert t.blocked_from(1) is None and t.blocked_from(2) is None
    t = table("monotonic")
    t.note_refused(0, 0, 5, 5)  # pid 0 is never checked
    assert t.blocked_from(0) is None
    # strict: the batch after a refused one is out of order anyway
    s = table("strict")
    append(s, 1, 0, 0, 5, 0)
    d = s.check_append(1, 0, 10, 5)
    assert (d.outcome, d.expected_sequence) == (Outcome.OUT_OF_ORDER, 5)


def test_blocks_of_untracked_pids_are_bounded() -> None:
    from partition_server import producer_state

    t = table("monotonic")
    n = producer_state.BLOCKED_UNTRACKED_MAX
    for pid in range(1, n + 3):
        t.note_refused(pid, 0, 5, 1)
    assert t.blocked_from(1) is None and t.blocked_from(2) is None
    assert t.blocked_from(3) == 5 and t.blocked_from(n + 2) == 5
    assert t.blocks_dropped_total == 2
    t.note_refused(3, 0, 4, 1)  # refused again: the youngest now, lowest base kept
    append(t, 4, 0, 5, 1, 0)  # created: its block is gone, and it no longer counts
    for pid in range(n + 3, n + 5):
        t.note_refused(pid, 0, 5, 1)
    assert t.blocked_from(3) == 4 and t.blocks_dropped_total == 3


def test_removing_a_pid_drops_its_block() -> None:
    t = table("monotonic")
    append(t, 1, 0, 0, 1, 0, now_ms=0)
    t.note_refused(1, 0, 1, 1)
    assert t.expire(now_ms=100, expire_ms=10) == 1
    assert t.blocked_from(1) is None
    append(t, 1, 0, 5, 1, 1, now_ms=200)  # an expired PID starts afresh (the expiry rule)


# -- the tracked-PID limit (docs/reliability.md, Tracked-PID limit; Kafka's KIP-936)
IDLE = 1_000


def limited_table(
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
    """Tracked-PID limit (docs/reliability.md, after Kafka's KIP-936): a full table refuses a
    new PID with TOO_MANY_PIDS instead of silently forgetting a live one."""

    t = limited_table()
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
    """Tracked-PID limit (docs/reliability.md, after Kafka's KIP-936): a full table refuses a
    new PID with TOO_MANY_PIDS instead of silently forgetting a live one."""

    t = limited_table()
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
    """Tracked-PID limit (docs/reliability.md, after Kafka's KIP-936): a full table refuses a
    new PID with TOO_MANY_PIDS instead of silently forgetting a live one."""

    t = limited_table()
    t.apply_append(1, 1, 0, 1, 5, now_ms=0)  # at offset 5, not durable yet
    write(t, 2, 0, 1, 0, now=5 * IDLE)  # durable up to offset 1 only
    assert t.check_append(3, 1, 0, 1, now_ms=5 * IDLE).outcome is Outcome.TOO_MANY_PIDS
    t.mark_durable(6)
    assert t.check_append(3, 1, 0, 1, now_ms=5 * IDLE).outcome is Outcome.APPEND
    write(t, 3, 0, 1, 6, now=5 * IDLE)
    assert t.pids() == [2, 3]


def test_eviction_follows_last_use_not_creation() -> None:
    """Tracked-PID limit (docs/reliability.md, after Kafka's KIP-936): a full table refuses a
    new PID with TOO_MANY_PIDS instead of silently forgetting a live one."""

    t = limited_table(pids_max=3)
    for pid in (1, 2, 3):
        write(t, pid, 0, 1, pid, now=pid)
    t.touch(1, 50)  # PRODUCER_STATE (a lease renewal) refreshes PID 1
    write(t, 4, 0, 1, 10, now=IDLE + 10)
    assert t.pids() == [3, 1, 4]  # 2 was the least recently used
    write(t, 5, 0, 1, 11, now=IDLE + 10)
    assert t.pids() == [1, 4, 5] and t.evicted_total == 2


def test_monotonic_never_evicts_a_live_pid() -> None:
    """Tracked-PID limit (docs/reliability.md, after Kafka's KIP-936): a full table refuses a
    new PID with TOO_MANY_PIDS instead of silently forgetting a live one."""

    t = limited_table("monotonic", expire_ms=10 * IDLE)
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
    u = limited_table("monotonic")
    write(u, 1, 0, 1, 0, now=0)
    write(u, 2, 0, 1, 1, now=0)
    assert u.check_append(3, 1, 0, 1, now_ms=10**12).outcome is Outcome.TOO_MANY_PIDS


def test_replay_and_fences_never_refuse() -> None:
    """Tracked-PID limit (docs/reliability.md, after Kafka's KIP-936): a full table refuses a
    new PID with TOO_MANY_PIDS instead of silently forgetting a live one."""

    t = limited_table(pids_max=1)
    for pid in (1, 2, 3):
        replay_batch(t, BatchHeader(pid, 0, 0, 0, pid, 1, 0, 1, 0), 0)
    assert len(t) == 3  # nothing idle long enough: over the limit, nothing lost
    assert t.check_fence(9, 1, True) is FenceOutcome.APPEND
    t.apply_fence(9, 1, 0)
    assert len(t) == 4 and t.get(9) is not None


# -- the column storage of the producer-state table
@pytest.mark.parametrize("k", [1, 2, 5])
def test_compact_and_flat_batch_forms_round_trip(k: int) -> None:
    """Producer-state column storage (docs/reliability.md, Tracked-PID limit): the compact and
    flat batch forms answer DUPLICATE alike.

    Batches kept in the compact form (contiguous sequences) and in flat triples (a hole,
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
    """Producer-state column storage (docs/reliability.md, Tracked-PID limit): slots and rings
    are reused."""

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
    """Producer-state column storage (docs/reliability.md, Tracked-PID limit): refresh is touch
    without the copy."""

    t = limited_table(pids_max=10)
    write(t, 1, 0, 1, 0, now=5)
    write(t, 2, 0, 1, 1, now=6)
    assert t.refresh(1, 9) and not t.refresh(3, 9)
    assert t.pids() == [2, 1] and t.get(1).last_use_ms == 9  # type: ignore[union-attr]
    assert t.refresh(1, 7) and t.get(1).last_use_ms == 9  # type: ignore[union-attr]


# -- rebuilding producer state (issue 23 items 2 and 4)
def header(pid: int, offset: int, control: bool) -> BatchHeader:
    flags = FLAG_CONTROL if control else 0
    return BatchHeader(offset, 60, 0, flags, pid, 1, -1 if control else 0, 1, 0)


def test_a_fence_is_not_a_data_batch() -> None:
    """Issue 23 items 2 and 4: the rules of rebuilding producer state (pids_with_data, cut_row,
    adopt_rows, row_below) against a reference model that knows a PID's whole history, not
    only the K batches its row keeps."""

    hs = [header(7, 10, True), header(8, 11, False), header(9, 30, False)]
    assert all(h.is_control == (h.pid == 7) for h in hs)
    assert pids_with_data(hs, 20) == {8}  # 7 only fenced, 9 at or above the end


@settings(max_examples=400, deadline=None)
@given(
    committed=st.lists(st.integers(1, 4), max_size=8),
    cut=st.lists(st.integers(1, 4), max_size=8),
    k=st.integers(1, 5),
    gap=st.integers(0, 3),
)
def test_cut_row_gives_the_committed_state_whatever_k_kept(
    committed: list[int], cut: list[int], k: int, gap: int
) -> None:
    """Issue 23 items 2 and 4: the rules of rebuilding producer state (pids_with_data, cut_row,
    adopt_rows, row_below) against a reference model that knows a PID's whole history, not
    only the K batches its row keeps.

    A PID's committed batches (below the log start ``end``: retention deleted them) and
    its batches above the high watermark (at or after ``end``: a cut drops them). Whatever
    K kept, the rewound row is the committed state: highwater the last committed sequence,
    batches only committed ones, and the PID gone when nothing was committed."""
    t = ProducerStateTable(batches_kept=k)
    seq = off = 0
    batches: list[tuple[int, int, int]] = []
    for n in committed:
        t.apply_append(7, 0, seq, n, off, 1, durable=True)
        batches.append((seq, seq + n - 1, off))
        seq, off = seq + n, off + n
    end = off + gap  # other producers' batches in between
    off = end
    for n in cut:
        t.apply_append(7, 0, seq, n, off, 1, durable=False)
        seq, off = seq + n, off + n
    if 7 not in t:
        assert not committed and not cut
        return
    [row] = t.export_rows([7])
    dhw = t.durable_lags([7]).get(7, row[2])
    got = cut_row(row, end, dhw)
    if not committed:
        assert got is None
        return
    assert got is not None
    pid, gen, hw, _, flat = got
    assert (pid, gen, hw) == (7, 0, batches[-1][1])
    kept = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
    assert kept == batches[len(batches) - len(kept) :]  # a suffix of the committed ones
    again = ProducerStateTable(batches_kept=k)
    again.load_rows([got])
    assert again.check_append(7, 0, hw + 1, 1).outcome is Outcome.APPEND
    assert again.check_append(7, 0, hw, 1).outcome is Outcome.DUPLICATE
    # Without the durable highwater (a snapshot from before PLSNAP05) the row is dropped
    # only when its kept batches were all cut; else it is rewound the same way.
    old = cut_row(row, end, None)
    assert old is None if not kept else old == got


@given(
    mine=st.dictionaries(st.integers(1, 6), st.tuples(st.integers(0, 5), st.integers(0, 9))),
    theirs=st.dictionaries(st.integers(1, 6), st.tuples(st.integers(0, 5), st.integers(0, 9))),
)
def test_adopted_rows_win_but_never_lower_a_generation_or_a_last_use(
    mine: dict[int, tuple[int, int]], theirs: dict[int, tuple[int, int]]
) -> None:
    """Issue 23 items 2 and 4: the rules of rebuilding producer state (pids_with_data, cut_row,
    adopt_rows, row_below) against a reference model that knows a PID's whole history, not
    only the K batches its row keeps."""

    def rows(d: dict[int, tuple[int, int]], hw: int) -> list:  # type: ignore[type-arg]
        return [(pid, gen, hw, lu, array("q")) for pid, (gen, lu) in d.items()]

    out = {r[0]: r for r in adopt_rows(rows(mine, 1), rows(theirs, 2))}
    assert set(out) == set(mine) | set(theirs)
    for pid, (_, gen, hw, lu, _) in out.items():
        if pid in theirs:
            assert hw == 2
            assert gen == max(theirs[pid][0], mine.get(pid, (0, 0))[0])
            assert lu == max(theirs[pid][1], mine.get(pid, (0, 0))[1])
        else:
            assert (gen, hw, lu) == (mine[pid][0], 1, mine[pid][1])


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3), max_size=10),
    start_at=st.integers(0, 10),
    held=st.integers(0, 10),
    k=st.integers(1, 5),
)
def test_a_start_over_with_the_leaders_rows_below_its_start_ends_as_the_leader(
    sizes: list[int], start_at: int, held: int, k: int
) -> None:
    """Issue 23 items 2 and 4: the rules of rebuilding producer state (pids_with_data, cut_row,
    adopt_rows, row_below) against a reference model that knows a PID's whole history, not
    only the K batches its row keeps.

    A PID wrote batches of ``sizes`` records; the leader's log starts at the batch
    ``start_at`` (retention deleted those below, all committed). A follower that held the
    first ``held`` batches below it starts over there: it adopts the leader's row as of
    the start (``row_below``) and replays the batches from it. Whatever K, it then keeps
    the leader's row (simulation seed 500201: it skipped from its own batches to the
    fetched ones)."""
    offs, seq, off = [], 0, 0
    for n in sizes:
        offs.append((seq, n, off))
        seq, off = seq + n, off + n + 1  # another producer's batch after each
    start_at = min(start_at, len(offs))
    start = offs[start_at][2] if start_at < len(offs) else off
    lead = ProducerStateTable(batches_kept=k)
    for b, n, o in offs:
        lead.apply_append(7, 0, b, n, o, 1, durable=True)
    fol = ProducerStateTable(batches_kept=k)
    for b, n, o in offs[: min(held, start_at)]:
        fol.apply_append(7, 0, b, n, o, 1, durable=True)
    theirs = [r for r in (row_below(r, start) for r in lead.export_rows()) if r is not None]
    fol.load_rows(adopt_rows(fol.export_rows(), theirs))
    for b, n, o in offs[start_at:]:
        fol.apply_append(7, 0, b, n, o, 1, durable=True)
    assert [r[2:5:2] for r in fol.export_rows()] == [r[2:5:2] for r in lead.export_rows()]
    if 7 in lead:
        [(_, _, hw, _, flat)] = lead.export_rows([7])
        for b in {flat[i] for i in range(0, len(flat), 3)}:
            assert fol.check_append(7, 0, b, 1).outcome is Outcome.DUPLICATE
        assert fol.check_append(7, 0, hw + 1, 1).outcome is Outcome.APPEND


# -- who may drop producer state, and the horizon a drop leaves (findings 6 and 7)
EXPIRE_MS = 10_000


def test_raise_last_use_keeps_lru_order_and_later_times() -> None:
    """docs/reliability.md finding 7 (review 7): renewals touch a PID's last use on the leader
    only, so followers never expire or evict and a new leader gives every PID a full expiry
    period."""

    t = ProducerStateTable(mode="strict")
    for pid, lu in ((1, 100), (2, 200), (3, 900)):
        t.apply_append(pid, 0, 0, 1, pid, lu, durable=True)
    t.raise_last_use(500)
    assert [(pid, t.get(pid).last_use_ms) for pid in t.pids()] == [  # type: ignore[union-attr]
        (1, 500),
        (2, 500),
        (3, 900),
    ]
    assert t.expire(500 + EXPIRE_MS, EXPIRE_MS) == 2 and t.pids() == [3]
    empty = ProducerStateTable()
    empty.raise_last_use(5)  # nothing to do, no error
    assert len(empty) == 0


def test_raise_last_use_of_a_million_pids_is_one_column_fill() -> None:
    """docs/reliability.md finding 7 (review 7): renewals touch a PID's last use on the leader
    only, so followers never expire or evict and a new leader gives every PID a full expiry
    period."""

    n = 1_000_000
    t = ProducerStateTable(mode="strict")
    t.load_rows([(pid, 0, 0, pid, array("q", (0, 0, pid))) for pid in range(1, n + 1)])
    started = time.perf_counter()
    t.raise_last_use(2 * n)
    took = time.perf_counter() - started
    assert min(t._lu) == max(t._lu) == 2 * n
    print(f"raise_last_use of {n} PIDs: {took * 1000:.1f} ms")  # shown with -s


# -- finding 6: the horizon ---------------------------------------------------------------
def test_drops_raise_the_horizon_and_a_rebuild_keeps_it() -> None:
    """docs/reliability.md finding 6 (review 6): a partition remembers the newest last use of
    any PID it dropped, and a takeover's FENCE creates a fresh entry only for a PID leased
    after it."""

    t = ProducerStateTable(mode="strict", pids_max=1, evict_idle_min_ms=100)
    t.apply_append(1, 0, 0, 1, 0, 1_000, durable=True)
    t.apply_append(2, 0, 0, 1, 1, 1_050, durable=True)  # 1 is not idle enough to go
    assert len(t) == 2 and t.dropped_last_use_max_ms == 0
    assert t.expire(1_000 + EXPIRE_MS, EXPIRE_MS) == 1
    assert t.dropped_last_use_max_ms == 1_000
    t.apply_append(3, 0, 0, 1, 2, 1_200, durable=True)  # room for 3: 2 (idle 150 ms) goes
    assert 2 not in t and t.dropped_last_use_max_ms == 1_050
    t.clear()  # a rebuild from the log: drops stay dropped
    assert t.dropped_last_use_max_ms == 1_050
    t.note_dropped(900)
    assert t.dropped_last_use_max_ms == 1_050
    assert not t.may_create(1_050) and t.may_create(1_051)
    assert t.may_create(0), "0: the coordinator did not say (an older one): create as before"


# -- the rules as properties ----------------------------------------------------------------
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 12), st.integers(0, 40)),
        st.tuples(st.just("expire"), st.just(0), st.integers(0, 40)),
        st.tuples(st.just("lead"), st.just(0), st.integers(0, 40)),
        st.tuples(st.just("follow"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@given(_OPS, st.integers(1, 6), st.sampled_from(["strict", "monotonic"]))
@settings(max_examples=300, deadline=None)
def test_only_a_leader_drops_and_the_horizon_is_the_newest_dropped_last_use(
    ops: list[tuple[str, int, int]], pids_max: int, mode: str
) -> None:
    """docs/reliability.md finding 6 (review 6): a partition remembers the newest last use of
    any PID it dropped, and a takeover's FENCE creates a fresh entry only for a PID leased
    after it. Followers drop nothing (finding 7).

    A reference model written from the rules, not the table: a PID's last use is the
    latest time it was applied (or the time its replica became leader); a follower never
    loses a PID; the horizon is the largest last use any lost PID had when it went."""
    t = ProducerStateTable(mode=mode, pids_max=pids_max, evict_idle_min_ms=30, expire_ms=50)
    now = 0
    last_use: dict[int, int] = {}
    seq: dict[int, int] = {}
    horizon = 0
    for op, pid, dt in ops:
        now += dt
        before = set(last_use)
        if op == "append":
            s = seq.get(pid, -1) + 1
            t.apply_append(pid, 0, s, 1, now, now, durable=True)
            seq[pid] = s
            last_use[pid] = max(last_use.get(pid, now), now)
        elif op == "expire":
            t.expire(now, 50)
        elif op == "lead" and not t.drops_allowed:
            t.drops_allowed = True
            t.raise_last_use(now)
            last_use = {p: max(lu, now) for p, lu in last_use.items()}
        elif op == "follow":
            t.drops_allowed = False
        gone = before - set(t.pids()) - ({pid} if op == "append" else set())
        if not t.drops_allowed:
            assert not gone, "a follower dropped producer state"
        for p in gone:
            horizon = max(horizon, last_use.pop(p))
            seq.pop(p)
        assert set(t.pids()) == set(last_use)
        assert t.dropped_last_use_max_ms == horizon
        for p, lu in last_use.items():
            assert t.get(p).last_use_ms == lu  # type: ignore[union-attr]
        if t.drops_allowed and op == "expire":
            assert all(lu + 50 > now for lu in last_use.values()), "expiry missed one"
