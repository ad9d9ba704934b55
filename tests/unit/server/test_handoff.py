"""The rules of a handover by a live leader (partition_server/handoff.py): who may take
over, the state written, when the preferred replica is due. A reference model written from
docs/replication.md ("Handing leadership over") checks them over generated states."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from partition_server.handoff import preferred_due
from partition_server.leadership import handed_over, successor
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


# -- the controlled shutdown on a replica manager (a real partition, a fake ZooKeeper) ------
def _shutdown(tmp_path: Path, isr: list[int]) -> tuple[dict[str, int], Any, Any, Any]:
    from partition_server.handoff import controlled_shutdown
    from partition_server.partition import Role
    from partition_server.registry import Assignment
    from pidlease.wire.cluster import ServerInfo
    from tests.unit.server._replicas import KEY
    from tests.unit.server._replicas import leased_setup as setup

    async def go() -> tuple[dict[str, int], Any, Any, Any]:
        ps = PartitionState([1, 2, 3], 1, 1, isr)
        part, mgr, registry, _clock, zk = setup(tmp_path, ps, [1, 2, 3])
        assert registry.lease is not None
        registry.lease.confirm(5, 1_000)
        a = Assignment(partitions={KEY: ps}, servers={s: ServerInfo(s, "h", 1) for s in (1, 2, 3)})
        registry.assignment = a
        mgr.apply(KEY, part, ps, a)
        assert part.role is Role.LEADER

        def refresh() -> Any:
            fut = asyncio.get_running_loop().create_future()
            registry.assignment = Assignment(partitions={KEY: zk.state}, servers=a.servers)
            fut.set_result(registry.assignment)
            return fut

        registry.refresh = refresh  # type: ignore[method-assign]
        out = await controlled_shutdown(mgr, 1.0)
        if zk.state.leader == 1:
            mgr.apply(KEY, part, zk.state, registry.assignment)  # a re-read meanwhile
        role = part.role
        part.close()
        return out, zk, role, mgr

    return asyncio.run(go())


def test_a_controlled_shutdown_hands_over_to_an_in_sync_follower(tmp_path: Path) -> None:
    from partition_server.partition import Role

    out, zk, role, _ = _shutdown(tmp_path, [1, 2, 3])
    assert out == {"handed_over": 1, "kept": 0}
    st = zk.state
    assert st.leader in (2, 3) and st.leader_epoch == 2 and 1 not in st.isr
    assert role is Role.FOLLOWER  # it stopped leading before the write


def test_a_partition_nobody_can_take_is_kept_and_served(tmp_path: Path) -> None:
    from partition_server.partition import Role

    out, zk, role, _ = _shutdown(tmp_path, [1])
    assert out == {"handed_over": 0, "kept": 1}
    assert zk.sets == 0 and zk.state.leader == 1 and zk.state.leader_epoch == 1
    assert role is Role.LEADER  # still serving its producers until the server stops
