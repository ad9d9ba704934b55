"""The connection refusal guard's rules (partition_server/refusal_guard.py), without a server."""

from __future__ import annotations

from partition_server.refusal_guard import RefusalGuard
from pidlease import errors

K = ("t", 0, 7)
NL = errors.NotLeader.code


def test_later_batches_wait_for_the_resend_of_the_refused_one() -> None:
    g = RefusalGuard()
    assert not g and g.blocking(K, 1, 10) is None
    g.note(K, 1, 10, 14, NL)
    r = g.blocking(K, 1, 15)
    assert r is not None and (r.base_sequence, r.last_sequence, r.code) == (10, 14, NL)
    assert g.blocking(K, 1, 15) is not None  # still held: refusing does not clear
    assert g.blocking(("t", 1, 7), 1, 15) is None  # another partition
    assert g.blocking(("t", 0, 8), 1, 15) is None  # another producer
    assert g.blocking(K, 1, 10) is None  # the resend clears it ...
    assert not g and g.blocking(K, 1, 15) is None  # ... and what follows passes


def test_a_resend_from_below_the_refused_base_clears_too() -> None:
    g = RefusalGuard()
    g.note(K, 1, 10, 14, NL)
    assert g.blocking(K, 1, 5) is None and not g


def test_the_lowest_refused_base_is_kept() -> None:
    g = RefusalGuard()
    g.note(K, 1, 10, 14, NL)
    g.note(K, 1, 15, 19, errors.ServerUnavailable.code)  # a later refusal keeps base 10
    r = g.get(K)
    assert r is not None and (r.base_sequence, r.code) == (10, NL)
    g.note(K, 1, 5, 9, errors.TooManyPids.code)  # a lower one replaces it
    r = g.get(K)
    assert r is not None and (r.base_sequence, r.code) == (5, errors.TooManyPids.code)


def test_generations() -> None:
    g = RefusalGuard()
    g.note(K, 3, 10, 14, NL)
    assert g.blocking(K, 2, 20) is None and g  # an older one passes (fenced), entry stays
    g.note(K, 2, 1, 1, NL)  # nor does an older generation's refusal replace it
    assert g.get(K) is not None and g.get(K).generation == 3  # type: ignore[union-attr]
    assert g.blocking(K, 4, 20) is None and not g  # a takeover clears it


def test_bounded_then_overflowed() -> None:
    g = RefusalGuard(keys_max=2)
    g.note(("a", 0, 1), 0, 0, 0, NL)
    g.note(("a", 0, 2), 0, 0, 0, NL)
    assert not g.overflowed
    g.note(("a", 0, 1), 0, 0, 0, NL)  # an existing key: no growth
    assert not g.overflowed
    g.note(("a", 0, 3), 0, 0, 0, NL)
    assert g.overflowed and len(g) == 2


def test_the_refused_range_grows_with_every_batch_held_back() -> None:
    """Sim seed 3030 (monotonic, R=2): batches 5..9 resent to a new leader whose log held
    5 and 6 of an earlier attempt, not 7. 5 was refused (NOT_LEADER, a transition), the
    guard held back 6 and 7; 8 came after the leader was ready, and since the partition
    held 5 the guard let it through: 7 became a hole, and its resend was refused for good
    (OUT_OF_ORDER_SEQUENCE, the producer failed). The range the producer must resend runs
    to the last batch held back, so a later batch passes only once all of it is written."""
    g = RefusalGuard()
    g.note(K, 1, 5, 5, NL)  # refused at dispatch
    g.note(K, 1, 6, 6, NL)  # held back by the guard (the server notes it)
    g.note(K, 1, 7, 7, NL)
    r = g.get(K)
    assert r is not None and (r.base_sequence, r.last_sequence, r.code) == (5, 7, NL)
    g.note(K, 1, 3, 4, errors.ServerUnavailable.code)  # a lower refusal keeps the range's end
    r = g.get(K)
    assert r is not None and (r.base_sequence, r.last_sequence) == (3, 7)
    g.note(K, 2, 9, 9, NL)  # a newer generation's refusal starts over
    r = g.get(K)
    assert r is not None and (r.generation, r.base_sequence, r.last_sequence) == (2, 9, 9)


def test_the_entry_lifts_only_when_the_resends_reach_the_last_refused_batch() -> None:
    """Issue 23 item 5, at the connection: 10..14 refused (NOT_LEADER), 20..24 held back
    behind it (a hole at 15..19: monotonic ids). The resend of 10..14 used to clear the
    entry, so a batch newer than 20..24 passed before 20..24 was resent; on a monotonic
    topic it was appended above them, and 20..24's resend later answered DUPLICATE."""
    g = RefusalGuard()
    g.note(K, 1, 10, 14, NL)  # refused at dispatch
    assert g.blocking(K, 1, 20, 24) is not None
    g.note(K, 1, 20, 24, NL)  # held back: the server notes it
    assert g.blocking(K, 1, 10, 14) is None  # the resend of the first passes ...
    r = g.blocking(K, 1, 30, 34)  # ... a newer batch still waits for 20..24
    assert r is not None and (r.base_sequence, r.last_sequence) == (20, 24)
    g.note(K, 1, 30, 34, NL)
    assert g.blocking(K, 1, 20, 24) is None
    assert g.blocking(K, 1, 30, 34) is None and not g  # every refused range resent
    # A resend refused again is noted again and holds what follows.
    g.note(K, 1, 40, 44, NL)
    g.note(K, 1, 45, 49, NL)
    assert g.blocking(K, 1, 40, 44) is None
    g.note(K, 1, 40, 44, errors.ServerUnavailable.code)  # refused at dispatch again
    r = g.blocking(K, 1, 45, 49)
    assert r is not None and (r.base_sequence, r.code) == (40, errors.ServerUnavailable.code)
    # Without the batch's last sequence a resend covers the lowest range.
    assert g.blocking(K, 1, 40) is None
    assert g.blocking(K, 1, 45) is None and not g


def test_too_many_refused_ranges_close_the_connection() -> None:
    from partition_server.refusal_guard import GUARD_RANGES_MAX

    g = RefusalGuard()
    for i in range(GUARD_RANGES_MAX):
        g.note(K, 1, 10 * i, 10 * i + 4, NL)  # holes between: one range each
    assert not g.overflowed
    g.note(K, 1, 10 * GUARD_RANGES_MAX, 10 * GUARD_RANGES_MAX + 4, NL)
    assert g.overflowed
