"""Leader-epoch history: the EPOCH_END answer, the truncation point a follower derives from
it (checked against the true common prefix of two logs, over generated histories), and
the history file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.epochs import FILE_NAME, EpochHistory, truncation_step


def history_of(epochs_by_offset: list[int], extra: tuple[int, int] | None = None) -> EpochHistory:
    """The history a replica keeps for a log whose record at offset i was written in epoch
    ``epochs_by_offset[i]``."""
    h = EpochHistory()
    for i, e in enumerate(epochs_by_offset):
        if h.latest_epoch != e:
            h.assign(e, i)
    if extra is not None:
        h.assign(*extra)
    return h


def reconcile(follower: list[int], leader: list[int], leader_epoch: int) -> int:
    """Run the follower's EPOCH_END rounds against a leader; returns where it cuts."""
    fh = history_of(follower)
    lh = history_of(leader, (leader_epoch, len(leader)))
    end = len(follower)
    for _ in range(len(fh.entries) + 2):
        asked = fh.latest_epoch
        if asked is None:
            return end
        e, e_end = lh.end_offset_for(asked, len(leader))
        cut, final = truncation_step(fh, end, asked, e, e_end)
        if cut < end:
            end = cut
            fh.truncate_to(cut)
        if final:
            return end
    raise AssertionError("did not settle")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_end_offset_for_answers_the_largest_epoch_at_or_below() -> None:
    h = history_of([0] * 10 + [2] * 5 + [5] * 3)
    assert h.end_offset_for(0, 18) == (0, 10)
    assert h.end_offset_for(1, 18) == (0, 10)  # epoch 1 unknown: epoch 0 ends at 10
    assert h.end_offset_for(2, 18) == (2, 15)
    assert h.end_offset_for(4, 18) == (2, 15)
    assert h.end_offset_for(5, 18) == (5, 18)  # the current epoch ends at the log end
    assert h.end_offset_for(9, 18) == (5, 18)
    assert EpochHistory([(3, 0)]).end_offset_for(2, 7) == (-1, -1)


def test_follower_with_a_longer_tail_of_the_same_epoch_is_cut_where_the_leader_ended_it() -> None:
    # leader took over at 10 (epoch 2); the follower got 4 more records of epoch 1
    assert reconcile([0] * 5 + [1] * 9, [0] * 5 + [1] * 5 + [2] * 3, 2) == 10


def test_follower_epochs_unknown_to_the_leader_are_dropped_over_several_rounds() -> None:
    # the follower led epoch 3 and followed epoch 5, neither of which the leader ever saw
    follower = [0] * 4 + [2] * 4 + [3] * 2 + [5] * 3
    leader = [0] * 4 + [2] * 6 + [4] * 2
    assert reconcile(follower, leader, 6) == 8


def test_an_empty_leader_or_follower() -> None:
    assert reconcile([], [0] * 3, 1) == 0
    assert reconcile([0] * 3, [], 1) == 0


def test_assign_refuses_to_go_backwards_and_drops_empty_epochs() -> None:
    h = EpochHistory()
    assert h.assign(0, 0) and not h.assign(0, 5)
    h.assign(3, 10)
    with pytest.raises(ValueError, match="epoch 2 is older than the latest 3"):
        h.assign(2, 20)
    with pytest.raises(ValueError, match="epoch 4 would start at 9, before epoch 3's start 10"):
        h.assign(4, 9)
    h.assign(4, 10)  # epoch 3 wrote nothing
    assert h.entries == [(0, 0), (4, 10)]
    h.truncate_to(10)
    assert h.entries == [(0, 0)]
    assert h.entries_from(3) == [(0, 0)]


@st.composite
def two_logs(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    """A leader's log and a follower's that share a prefix and then diverge the ways a
    real one can: same offsets in one epoch always hold the same records, the follower may
    hold more of the last shared epoch, and epochs only the follower saw (odd numbers)."""
    runs = draw(st.lists(st.integers(1, 4), min_size=0, max_size=5))
    leader: list[int] = []
    for i, n in enumerate(runs):
        leader += [2 * i] * n
    c = draw(st.integers(0, len(leader)))
    follower = leader[:c]
    if c and (c == len(leader) or leader[c] != leader[c - 1]):
        follower += [leader[c - 1]] * draw(st.integers(0, 3))
    top = 2 * len(runs)
    last = follower[-1] if follower else 0
    for e in sorted(draw(st.sets(st.integers(0, top), max_size=3))):
        odd = 2 * e + 1
        if odd > last and odd < 2 * top + 2:
            follower += [odd] * draw(st.integers(1, 3))
            last = odd
    return leader, follower, 2 * top + 2


@given(two_logs())
@settings(max_examples=400)
def test_reconciliation_cuts_exactly_at_the_common_prefix(
    logs: tuple[list[int], list[int], int],
) -> None:
    leader, follower, leader_epoch = logs
    assert reconcile(follower, leader, leader_epoch) == common_prefix(follower, leader)


def test_file_round_trip_and_damage(tmp_path: Path) -> None:
    h = EpochHistory([(0, 0), (3, 40)], 2, tmp_path / FILE_NAME)
    h.save()
    got = EpochHistory.load(tmp_path)
    got.settle(100)
    assert (got.entries, got.truncations) == ([(0, 0), (3, 40)], 2)
    got = EpochHistory.load(tmp_path)
    got.settle(30)  # the log is shorter than the file says: entries past it go
    assert got.entries == [(0, 0)]
    raw = (tmp_path / FILE_NAME).read_text()
    (tmp_path / FILE_NAME).write_text(raw.replace("3 40", "3 41"))
    damaged = EpochHistory.load(tmp_path)
    assert damaged.entries == [(0, 0)] and damaged.truncations != 2


def test_missing_file_means_epoch_zero_for_an_old_log(tmp_path: Path) -> None:
    h = EpochHistory.load(tmp_path)
    h.settle(12)
    assert h.entries == [(0, 0)]
    h = EpochHistory.load(tmp_path)
    h.settle(0)
    assert h.entries == []
