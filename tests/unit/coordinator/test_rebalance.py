"""The rebalance planner (coordinator/rebalance.py), checked over generated clusters against
what the contract asks (CONTRACT.md, command line: every live server holds an even share,
replicas and leaders within one of the mean) and what a move may do."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.rebalance import PlanError, leader_loads, plan, replica_loads, spread


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[tuple[str, int], list[int]], list[int], set[int]]:
    """Any placement over old servers (some of them gone or drained), then new servers."""
    n_old = draw(st.integers(2, 6))
    old = list(range(1, n_old + 1))
    r = draw(st.integers(2, min(3, n_old)))
    parts = draw(st.integers(1, 40))
    current = {}
    for p in range(parts):
        reps = draw(st.permutations(old))[:r]
        current[("t", p)] = list(reps)
    n_new = draw(st.integers(0, 3))
    servers = old + list(range(n_old + 1, n_old + 1 + n_new))
    drain = set(draw(st.lists(st.sampled_from(servers), max_size=2, unique=True)))
    if len(set(servers) - drain) < r:
        drain = set()
    gone = draw(st.sets(st.sampled_from(old), max_size=1))
    live = [s for s in servers if s not in gone or len(set(servers) - gone - drain) < r]
    return current, live, drain


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_plan_is_even_and_keeps_every_partition_whole(got) -> None:  # type: ignore[no-untyped-def]
    current, live, drain = got
    eligible = sorted(set(live) - drain)
    out = plan(current, live, drain)
    assert set(out) == set(current)
    for k, reps in out.items():
        assert len(reps) == len(set(reps)) == len(set(current[k]))  # R kept, no repeats
        assert set(reps) <= set(eligible)  # nothing on a drained or gone server
    assert spread(replica_loads(out, eligible)) <= 1, replica_loads(out, eligible)
    assert spread(leader_loads(out, eligible)) <= 1, leader_loads(out, eligible)


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_a_balanced_plan_moves_nothing(got) -> None:  # type: ignore[no-untyped-def]
    current, live, drain = got
    first = plan(current, live, drain)
    again = plan(first, live, drain)
    assert again == first


def test_adding_a_server_moves_only_its_share() -> None:
    # 3 servers, 60 partitions R=3, round robin (every server holds all 60): a 4th server
    # must end with 45 replicas each, 15 leaders each, and only 45 replicas move.
    current = {("t", p): [(p + i) % 3 + 1 for i in range(3)] for p in range(60)}
    out = plan(current, [1, 2, 3, 4])
    assert replica_loads(out, [1, 2, 3, 4]) == {1: 45, 2: 45, 3: 45, 4: 45}
    assert leader_loads(out, [1, 2, 3, 4]) == {1: 15, 2: 15, 3: 15, 4: 15}
    moved = sum(len(set(out[k]) - set(current[k])) for k in current)
    assert moved == 45


def test_drain_and_impossible_plans() -> None:
    current = {("t", p): [(p + i) % 4 + 1 for i in range(2)] for p in range(8)}
    out = plan(current, [1, 2, 3, 4], drain=[2])
    assert all(2 not in reps for reps in out.values())
    with pytest.raises(PlanError, match="only 2 servers"):
        plan({("t", 0): [1, 2, 3]}, [1, 2, 3], drain=[3])
    with pytest.raises(PlanError, match="single replica is not moved"):
        plan({("t", 0): [2]}, [1, 2], drain=[2])
