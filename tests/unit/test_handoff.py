"""The rules of a handover by a live leader (partition_server/handoff.py): who may take
over, the state written, when the preferred replica is due. A reference model written from
docs/replication.md ("Handing leadership over") checks them over generated states."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from partition_server.handoff import handed_over, preferred_due, successor
from pidlease.wire.cluster import PartitionState


@st.composite
def states(draw: st.DrawFn) -> tuple[PartitionState, set[int], dict[int, int]]:
    n = draw(st.integers(1, 5))
    replicas = draw(st.permutations(list(range(1, 7))))[:n]
    leader = draw(st.sampled_from(replicas))
    isr = [r for r in replicas if r == leader or draw(st.booleans())]
    live = {r for r in range(1, 7) if draw(st.booleans())} | {leader}
    ends = {r: draw(st.integers(-1, 20)) for r in replicas if draw(st.booleans())}
    ps = PartitionState(
        replicas=list(replicas), leader=leader, leader_epoch=draw(st.integers(0, 9)), isr=isr
    )
    return ps, live, ends


@given(states(), st.booleans())
def test_successor_is_a_live_in_sync_other_replica_or_none(got, leave: bool) -> None:  # type: ignore[no-untyped-def]
    ps, live, ends = got
    me = ps.leader
    candidates = [r for r in ps.replicas if r != me and r in ps.isr and r in live]
    to = successor(ps, me, live, ends)
    if not candidates:
        assert to is None
        return
    assert to in candidates
    best = max(ends.get(r, -1) for r in candidates)
    assert ends.get(to, -1) == best  # the furthest fetched
    ties = [r for r in candidates if ends.get(r, -1) == best]
    assert to == ties[0]  # then the assignment's order
    new = handed_over(ps, me, to, leave_isr=leave)
    assert new.leader == to and new.leader_epoch == ps.leader_epoch + 1
    assert new.replicas == ps.replicas
    assert (me in new.isr) == (not leave)
    assert set(new.isr) - {me} == set(ps.isr) - {me}
    assert to in new.isr  # the new leader holds every acked record


@given(states())
def test_only_the_leader_hands_over(got) -> None:  # type: ignore[no-untyped-def]
    ps, live, ends = got
    for other in ps.replicas:
        if other != ps.leader:
            assert successor(ps, other, live, ends) is None


def test_a_named_target_must_be_live_and_in_sync() -> None:
    ps = PartitionState(replicas=[1, 2, 3], leader=2, leader_epoch=4, isr=[1, 2])
    assert successor(ps, 2, {1, 2, 3}, to=1) == 1
    assert successor(ps, 2, {1, 2, 3}, to=3) is None  # not in sync
    assert successor(ps, 2, {2, 3}, to=1) is None  # not live
    assert successor(ps, 2, {1, 2, 3}, to=2) is None  # itself


def test_preferred_due() -> None:
    ps = PartitionState(replicas=[1, 2, 3], leader=2, leader_epoch=4, isr=[1, 2, 3])
    kw = {"high_watermark": 10, "follower_end": 10, "led_for_ms": 5000.0, "settle_ms": 1000.0}
    assert preferred_due(ps, 2, {1, 2, 3}, **kw)  # type: ignore[arg-type]
    assert not preferred_due(ps, 1, {1, 2, 3}, **kw)  # type: ignore[arg-type] - not the leader
    assert not preferred_due(ps, 2, {2, 3}, **kw)  # type: ignore[arg-type] - preferred is down
    behind = {**kw, "follower_end": 9}
    assert not preferred_due(ps, 2, {1, 2, 3}, **behind)  # type: ignore[arg-type]
    young = {**kw, "led_for_ms": 10.0}
    assert not preferred_due(ps, 2, {1, 2, 3}, **young)  # type: ignore[arg-type]
    out = PartitionState(replicas=[1, 2, 3], leader=2, leader_epoch=4, isr=[2, 3])
    assert not preferred_due(out, 2, {1, 2, 3}, **kw)  # type: ignore[arg-type] - not in sync
    pref = PartitionState(replicas=[2, 1, 3], leader=2, leader_epoch=4, isr=[1, 2, 3])
    assert not preferred_due(pref, 2, {1, 2, 3}, **kw)  # type: ignore[arg-type] - already
