"""The steps of a replica move (coordinator/moves.py ``next_step``), driven against a
model of the partition (followers catch up, leaders die and are elected, the coordinator
crashes and a later one resumes from the record) over generated runs. Checked at every
write, from docs/operations.md and the issue: the new leader is an in-sync replica; the
in-sync set loses only replicas leaving the replica list, and only once every target
replica is in it (never fewer in-sync copies than the target's length, so never below the
minimum, because of a move); the epoch goes up; a move whose target server is gone rolls
back; a move that the world lets finish ends at its target."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.moves import needs_rollback, next_step
from pidlease.wire.cluster import PartitionState

SERVERS = [1, 2, 3, 4, 5]


def check_write(old: PartitionState, new: PartitionState, target: list[int], mi: int) -> None:
    assert new.leader_epoch == old.leader_epoch + 1
    assert new.leader in old.isr  # only an in-sync replica leads
    assert new.leader in new.replicas and set(new.isr) <= set(new.replicas)
    lost = set(old.isr) - set(new.isr)
    if lost:
        assert not (lost & set(new.replicas))  # only leaving replicas leave the set
        assert set(target) <= set(old.isr)  # and only once the whole target is in sync
        assert len(new.isr) >= max(mi, len(target))


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_move_is_safe_at_every_step_and_ends_at_its_target(data: st.DataObject) -> None:
    r = data.draw(st.integers(2, 3))
    original = data.draw(st.permutations(SERVERS))[:r]
    target = data.draw(st.permutations(SERVERS))[:r]
    mi = data.draw(st.integers(1, r))
    ps = PartitionState(
        replicas=list(original), leader=original[0], leader_epoch=0, isr=list(original)
    )
    live = set(SERVERS)
    goal = list(target)
    for _ in range(200):
        event = data.draw(st.sampled_from(["step", "step", "step", "catch up", "kill", "revive"]))
        if event == "catch up":
            behind = [x for x in ps.replicas if x not in ps.isr and x in live]
            if behind:  # the leader's own in-sync write (same epoch)
                who = data.draw(st.sampled_from(behind))
                ps = PartitionState(ps.replicas, ps.leader, ps.leader_epoch, [*ps.isr, who])
        elif event == "kill":
            victim = data.draw(st.sampled_from(SERVERS))
            live.discard(victim)
            if victim != ps.leader:  # the leader drops a departed follower
                if victim in ps.isr and len(ps.isr) > 1:
                    ps = PartitionState(
                        ps.replicas, ps.leader, ps.leader_epoch, [x for x in ps.isr if x != victim]
                    )
            else:  # an election among the live in-sync replicas
                cands = [x for x in ps.isr if x in live and x != victim]
                if cands:
                    ps = PartitionState(
                        ps.replicas,
                        cands[0],
                        ps.leader_epoch + 1,
                        [x for x in ps.isr if x != victim],
                    )
        elif event == "revive":
            live = set(SERVERS)
        else:
            if needs_rollback(goal, list(original), live):
                goal = list(original)
            s = next_step(ps, goal, live, mi)
            if s.kind == "write":
                assert s.state is not None
                check_write(ps, s.state, goal, mi)
                ps = s.state
            elif s.kind == "done":
                assert ps.replicas == goal and ps.leader in goal
                break
    # The world now cooperates: every server up, followers catch up; the move ends.
    live = set(SERVERS)
    for _ in range(50):
        s = next_step(ps, goal, live, mi)
        if s.kind == "done":
            break
        if s.kind == "write":
            assert s.state is not None
            check_write(ps, s.state, goal, mi)
            ps = s.state
        else:
            behind = [x for x in ps.replicas if x not in ps.isr]
            if not behind:
                # a leader that died with nobody else in sync: the partition waits for it
                assert ps.leader in live, s.why
            ps = PartitionState(ps.replicas, ps.leader, ps.leader_epoch, [*ps.isr, *behind])
    assert s.kind == "done", s.why
    assert ps.replicas == goal and ps.leader == goal[0]
    assert sorted(ps.isr) == sorted(goal)


def test_the_order_of_steps() -> None:
    ps = PartitionState(replicas=[1, 2, 3], leader=1, leader_epoch=5, isr=[1, 2, 3])
    live = {1, 2, 3, 4}
    s = next_step(ps, [4, 2, 3], live, 2)
    assert s.kind == "write" and s.state is not None
    assert s.state.replicas == [1, 2, 3, 4] and s.state.isr == [1, 2, 3]
    ps = s.state
    assert next_step(ps, [4, 2, 3], live, 2).kind == "wait"  # 4 catching up
    ps = PartitionState(ps.replicas, 1, 6, [1, 2, 3, 4])
    s = next_step(ps, [4, 2, 3], live, 2)
    assert s.state is not None and s.state.leader == 4 and s.state.leader_epoch == 7
    s = next_step(s.state, [4, 2, 3], live, 2)
    assert s.state is not None and s.state.replicas == [4, 2, 3] and s.state.isr == [4, 2, 3]
    assert next_step(s.state, [4, 2, 3], live, 2).kind == "done"
    dead = PartitionState(replicas=[1, 2, 3], leader=1, leader_epoch=5, isr=[1, 2, 3])
    assert next_step(dead, [4, 2, 3], {2, 3, 4}, 2).kind == "wait"  # leader 1 not live


def _zk_with(parts: dict[int, list[int]], live: list[int]) -> object:
    """The simulation's in-memory ZooKeeper (kazoo's surface) with topic t."""
    import random

    from pidlease.wire.cluster import TopicSpec, partition_path, server_path, topic_path
    from tests.sim.zk import FakeZk

    zk = FakeZk(random.Random(0), lambda *_: None)
    zk.create("/servers", b"", makepath=True)
    zk.create(topic_path("t"), TopicSpec("t", len(parts), 2, "strict").to_bytes(), makepath=True)
    for p, reps in parts.items():
        ps = PartitionState(replicas=reps, leader=reps[0], leader_epoch=0, isr=list(reps))
        zk.create(partition_path("t", p), ps.to_bytes(), makepath=True)
    for s in live:
        zk.create(server_path(s), b"", makepath=True)
    return zk.client("coordinator")


def test_a_dead_server_can_be_drained_an_unknown_one_cannot() -> None:
    import pytest

    from coordinator.moves import MoveJobs
    from pidlease.errors import InvalidRequest

    zkc = _zk_with({0: [1, 2], 1: [2, 3], 2: [3, 1]}, live=[1, 3])
    plan = MoveJobs(zkc).plan(drain=[2])  # server 2 is down and holds replicas
    targets = plan["_targets"]
    assert all(2 not in reps and len(reps) == 2 for reps in targets.values())
    with pytest.raises(InvalidRequest, match="neither live nor hold a replica"):
        MoveJobs(zkc).plan(drain=[7])


def test_a_jobs_dropped_lines_are_counted_so_a_follower_prints_each_line_once() -> None:
    """The job keeps its last 2000 lines here and its last 500 in ZooKeeper; both say how
    many came before (the CLI's `seen` index counts them), across a takeover too."""
    from coordinator.moves import JOB_LINES_MAX, MoveJobs

    jobs = MoveJobs(_zk_with({0: [1, 2]}, live=[1, 2]))
    for i in range(2100):
        jobs._note(f"line {i}")
    assert jobs.status()["lines_dropped"] == 100 and jobs.status()["lines"][0] == "line 100"
    published = jobs._job_json(running=True)
    assert len(published["lines"]) == JOB_LINES_MAX
    assert published["lines_dropped"] + len(published["lines"]) == 2100
    assert published["lines"][0] == f"line {2100 - JOB_LINES_MAX}"
