"""The chaos checker must catch what it claims to catch: synthetic logs with one violation
each, and a clean one."""

from __future__ import annotations

from dataclasses import dataclass

from checker import ZOMBIE_MARK, Acked, Fence, check


@dataclass
class Rec:
    offset: int
    pid: int
    generation: int
    sequence_id: int
    value: bytes = b"v"


def log(*seqs: int, pid: int = 7, gen: int = 1) -> list[Rec]:
    return [Rec(i, pid, gen, s) for i, s in enumerate(seqs)]


def acks(*seqs: int, pid: int = 7) -> list[Acked]:
    return [Acked(0, pid, s, s) for s in seqs]


def test_clean_log_passes() -> None:
    rep = check({0: log(0, 1, 2, 3)}, acks(0, 1, 2, 3))
    assert rep.ok, rep.summary()
    assert (rep.records, rep.acked) == (4, 4)


def test_duplicate_is_caught() -> None:
    rep = check({0: log(0, 1, 1, 2)}, [])
    assert rep.duplicated == 1 and not rep.ok


def test_gap_and_acked_missing_are_caught() -> None:
    rep = check({0: log(0, 1, 3)}, acks(0, 1, 2))
    assert rep.gaps == 1 and rep.acked_missing == 1 and not rep.ok


def test_gap_allowed_when_not_strict() -> None:
    assert check({0: log(0, 5, 9)}, [], strict=False).ok


def test_out_of_order_is_caught() -> None:
    rep = check({0: log(0, 2, 1)}, [])
    assert rep.out_of_order == 1 and not rep.ok


def test_ack_at_wrong_offset_is_caught() -> None:
    rep = check({0: log(0, 1)}, [Acked(0, 7, 1, 0)])
    assert rep.acked_missing == 1


def test_zombie_mark_and_old_generation_after_fence_are_caught() -> None:
    recs = [
        *log(0, 1, gen=1),
        Rec(2, 7, 2, 2),
        Rec(3, 7, 1, 3),
        Rec(4, 9, 5, 0, ZOMBIE_MARK + b"x"),
    ]
    rep = check({0: recs}, [], [Fence(7, 2, {0: 2})])
    assert rep.zombie_writes == 2, rep.summary()
    # the same old-generation records before the fence offset are fine
    assert check({0: log(0, 1, gen=1)}, [], [Fence(7, 2, {0: 2})]).ok


def test_pid_zero_is_not_checked() -> None:
    assert check({0: [Rec(0, 0, 0, 0), Rec(1, 0, 0, 0)]}, []).ok
