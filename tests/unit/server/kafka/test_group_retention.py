"""Offset retention of a consumer group (``Group.expired``), from Kafka's rule
(``offsets.retention.minutes`` as since KIP-211), not from the module's code:

- an empty group keeps its offsets while it has been empty, or committed, within the
  retention; past it, every offset goes and the group with them;
- a commit (from an ``assign()`` consumer of an empty group) starts the wait over;
- a group with members never loses the offsets of topics its members subscribe to; those
  of other topics go once their commit is older than the retention;
- a member id handed out (a member on its way in), a commit being written and a deleted
  group expire nothing;
- after a reload the wait starts from the group record's time, not from the reload.
"""

from __future__ import annotations

from partition_server.kafka import group_state as G
from partition_server.kafka.group_log import (
    apply_record,
    group_key,
    group_value,
    offset_key,
    offset_value,
)
from partition_server.kafka.group_state import Group, OffsetEntry, State
from pidlease.wire import kafka_errors as E
from tests.unit.server.kafka.test_group_state import SESSION, join, new_member, stable_group

RET = 60_000


def commit(g: Group, topic: str, p: int, offset: int, now: int) -> None:
    g.offsets[(topic, p)] = OffsetEntry(offset, -1, "", now)


def emptied(at: int) -> Group:
    """A group whose only member left at ``at`` with offsets committed before."""
    g, (a, b), now = stable_group()
    commit(g, "orders", 0, 10, now)
    commit(g, "orders", 1, 20, now)
    g.leave(at, a)
    g.leave(at, b)
    assert g.state is State.EMPTY
    return g


def test_an_empty_group_expires_whole_only_after_the_retention() -> None:
    g = emptied(5_000)
    assert g.expired(5_000 + RET, RET) == ([], False)
    assert g.expired(5_000 + RET + 1, RET) == ([("orders", 0), ("orders", 1)], True)


def test_a_commit_to_an_empty_group_starts_the_wait_over() -> None:
    g = emptied(5_000)
    assert g.commit_check("", -1) == E.NONE  # an assign() consumer may commit
    commit(g, "orders", 0, 11, 50_000)
    assert g.expired(5_000 + RET + 1, RET) == ([], False)
    assert g.expired(50_000 + RET + 1, RET)[1]


def test_an_empty_group_without_offsets_goes_too() -> None:
    g, (a,), _ = stable_group(1)
    g.leave(2_000, a)
    assert g.expired(2_000 + RET + 1, RET) == ([], True)


def test_members_keep_what_they_subscribe_to_and_lose_the_rest() -> None:
    g, _, now = stable_group()  # members subscribe to "orders"
    commit(g, "orders", 0, 1, now)
    commit(g, "old", 0, 1, now)
    commit(g, "old", 1, 1, now + 30_000)
    much_later = now + 10 * RET
    for m in g.members.values():
        m.last_seen_ms = much_later  # alive all along
    assert g.expired(now + RET, RET) == ([], False)
    assert g.expired(now + RET + 1, RET) == ([("old", 0)], False)
    assert g.expired(much_later, RET) == ([("old", 0), ("old", 1)], False)


def test_a_member_on_its_way_in_or_a_deleted_group_expire_nothing() -> None:
    g = emptied(0)
    new_member(g, RET)  # MEMBER_ID_REQUIRED handed out: it will join with it
    assert g.pending
    assert g.expired(10 * RET, RET) == ([], False)
    g2 = emptied(0)
    g2.state = State.DEAD
    assert g2.expired(10 * RET, RET) == ([], False)


def test_a_reloaded_group_waits_from_its_record_not_from_the_reload() -> None:
    g = emptied(7_000)
    groups: dict[str, Group] = {}
    for (t, p), e in g.offsets.items():
        apply_record(groups, offset_key("g", t, p), offset_value(e))
    apply_record(groups, group_key("g"), group_value(g, g.empty_since_ms))
    back = groups["g"]
    assert back.state is State.EMPTY and not back.members
    assert back.expired(7_000 + RET, RET) == ([], False)
    assert back.expired(7_000 + RET + 1, RET)[1]
    # A record of an older format (no time): the offsets' own commit times count.
    old: dict[str, Group] = {}
    apply_record(old, offset_key("g", "orders", 0), offset_value(OffsetEntry(1, -1, "", 9_000)))
    apply_record(old, group_key("g"), b'{"gen": 3, "pt": "consumer", "pn": null, "members": 0}')
    assert old["g"].expired(9_000 + RET, RET) == ([], False)
    assert old["g"].expired(9_000 + RET + 1, RET)[1]


def test_a_rejoined_group_is_not_expired() -> None:
    g = emptied(0)
    mid = new_member(g, RET + 5)
    join(g, RET + 5, mid)
    g.tick(RET + 5 + G.INITIAL_REBALANCE_DELAY_MS)
    assert g.state is State.COMPLETING_REBALANCE
    # Its topic is subscribed: nothing goes, however late.
    assert g.expired(100 * RET, RET) == ([], False)
    assert SESSION < RET


def test_nothing_expires_while_a_commit_is_being_written() -> None:
    # A group created by its first commit (an assign() consumer): the commit is in flight,
    # not yet in ``offsets``. Expiring then would write a group tombstone after the commit
    # and take the acknowledged commit with it (seen: the dashboard test's group vanished).
    g = Group("g")
    g.empty_since_ms = 1_000
    g.writes_in_flight = 1
    assert g.expired(1_000 + 10 * RET, RET) == ([], False)
    g.writes_in_flight = 0
    commit(g, "orders", 0, 5, 2_000)
    assert g.expired(2_000 + RET, RET) == ([], False)
    assert g.expired(2_000 + RET + 1, RET) == ([("orders", 0)], True)
