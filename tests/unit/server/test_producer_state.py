"""One test per row of the append rules table (docs/protocol.md, PRODUCE) (the rows the
partition's pure producer state decides; NOT_LEADER and UNAUTHORIZED are the server's and are
tested over the wire), plus fences, durability, expiry and the snapshot round trip."""

from __future__ import annotations

import pytest

from partition_server.producer_state import FenceOutcome, Outcome, ProducerStateTable


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
    t.evict_idle_min_ms = 0  # every idle PID may go (the limit's rules: server/test_pid_limit.py)
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
