"""The cluster's one moves job (coordinator/moves.py ``MoveJobs``) on a real ZooKeeper, two
job runners on two ZooKeeper sessions (the coordinators' parts that decide who runs the
job), the partition servers played by hand (their ``/servers`` nodes and the leader's
in-sync write): the claim is one transaction, so of two claims from the same read only
one wins; a second job is refused with 409 naming the first and its owner; the other
runner shows the owner's progress; when the owner node goes (its session expired), the
other takes the job over and finishes it for the same drain, and the old owner stops
driving moves at once and writes nothing over the new owner's job."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from coordinator.moves import JOB, JOB_OWNER, JobRunning, MoveJobs
from pidlease.wire.cluster import PartitionState, TopicSpec, partition_path, server_path, topic_path
from tests.helpers import wait_for


@pytest.fixture
def clients(zk_hosts: str) -> Iterator[list[KazooClient]]:
    server, _, chroot = zk_hosts.partition("/")
    root = KazooClient(hosts=server, timeout=10.0)
    root.start(timeout=30)
    root.ensure_path("/" + chroot)
    root.stop()
    root.close()
    made = []
    for _ in range(3):
        c = KazooClient(hosts=zk_hosts, timeout=10.0)
        c.start(timeout=30)
        made.append(c)
    yield made
    for c in made:
        c.stop()
        c.close()


def test_one_job_claimed_refused_shown_taken_over_and_finished(clients: list[KazooClient]) -> None:
    za, zb, zt = clients  # coordinator a, coordinator b, the test (the servers' part)
    zt.create(topic_path("t"), TopicSpec("t", 1, 2, "strict").to_bytes(), makepath=True)
    ps = PartitionState(replicas=[1, 2], leader=1, leader_epoch=0, isr=[1, 2])
    zt.create(partition_path("t", 0), ps.to_bytes(), makepath=True)
    for s in (1, 2, 3):
        zt.create(server_path(s), b"{}", makepath=True, ephemeral=True)
    a = MoveJobs(za, coordinator_id="a")
    b = MoveJobs(zb, coordinator_id="b")

    started = a.start("drain of server 2", [2], dry_run=False, rollback_after_s=600)
    assert started["owner"] == "a" and started["moves"][0]["to"] == [1, 3], started
    # The move adds 3 and waits for it to catch up (nobody plays the leader yet).
    wait_for(lambda: 3 in PartitionState.from_bytes(zt.get(partition_path("t", 0))[0]).replicas)

    with pytest.raises(JobRunning, match="running, on coordinator a") as got:
        b.start("rebalance", dry_run=False)
    assert got.value.http_status == 409
    assert got.value.extra["job"]["kind"] == "drain of server 2"
    assert b.start("rebalance", dry_run=True)["dry_run"] is True  # a plan is still answered
    # Two claims from the same read: the second's transaction fails, nothing changes.
    _, stat = zt.get(JOB)
    assert not b._claim({"kind": "rebalance", "running": True}, stat.version - 1)
    assert zt.get(JOB_OWNER)[0] == b"a"

    a.tick()  # the owner publishes its progress; b shows it
    shown = b.status()
    assert shown["running"] and shown["owner"] == "a", shown
    assert any("add [3] as followers" in ln for ln in shown["lines"]), shown["lines"]

    # a's session "expires": its owner node is gone. b takes the job over; a stops.
    zt.delete(JOB_OWNER)
    assert b.take_over()
    assert zt.get(JOB_OWNER)[0] == b"b"
    a.tick()
    wait_for(lambda: not a.running, 10, "the old owner to stop")
    assert any("a no longer owns the drain of server 2" in ln for ln in a.lines), a.lines
    assert json.loads(zt.get(JOB)[0])["owner"] == "b"  # a wrote nothing over it

    # The leader (played here) takes 3 into the in-sync set: b's move goes on and ends.
    raw, st = zt.get(partition_path("t", 0))
    cur = PartitionState.from_bytes(raw)
    caught_up = PartitionState(cur.replicas, cur.leader, cur.leader_epoch, [*cur.isr, 3])
    zt.set(partition_path("t", 0), caught_up.to_bytes(), version=st.version)
    wait_for(lambda: not b.running, 30, "the taken-over drain to end")
    final = a.status()  # any coordinator shows the end
    assert not final["running"] and final["owner"] == "b", final
    assert final["lines"][-1] == "drain of server 2 done", final["lines"]
    assert any("b takes over the drain of server 2 of a" in ln for ln in final["lines"])
    assert PartitionState.from_bytes(zt.get(partition_path("t", 0))[0]).replicas == [1, 3]
    assert not zt.exists(JOB_OWNER)
    # Over: a new job may start anywhere.
    assert a.start("rebalance", dry_run=False)["owner"] == "a"
    wait_for(lambda: not a.running, 30, "the empty rebalance to end")


def test_a_watcher_tick_while_the_job_is_being_claimed_does_not_strand_it(
    clients: list[KazooClient],
) -> None:
    """``start`` marks the job running before its claim (the owner node) lands; the
    watcher's tick in that window found no owner node, took the job for lost and stopped
    it, while ZooKeeper kept it running and owned: nothing moved and every new job was
    refused (the netns moves suite's long form hung on it; helper moves, session 25).
    Before the fix: the drain never moved the replica (``TimeoutError`` here)."""
    za, _zb, zt = clients
    zt.create(topic_path("t"), TopicSpec("t", 1, 2, "strict").to_bytes(), makepath=True)
    ps = PartitionState(replicas=[1, 2], leader=1, leader_epoch=0, isr=[1, 2])
    zt.create(partition_path("t", 0), ps.to_bytes(), makepath=True)
    for s in (1, 2, 3):
        zt.create(server_path(s), b"{}", makepath=True, ephemeral=True)
    a = MoveJobs(za, coordinator_id="a")
    real = a._read_job
    ticked: list[int] = []

    def read_job_after_a_tick() -> object:
        if a.running and not ticked:
            ticked.append(1)
            a.tick()  # the watcher thread's look, landing between running=True and the claim
        return real()

    a._read_job = read_job_after_a_tick  # type: ignore[method-assign]
    a.start("drain of server 2", [2], dry_run=False, rollback_after_s=600)
    a._read_job = real  # type: ignore[method-assign]
    assert ticked == [1]
    for _ in range(3):
        a.tick()
    # The move adds server 3 and waits for it to catch up (nobody plays the leader here):
    # the job runs and still owns itself.
    wait_for(
        lambda: 3 in PartitionState.from_bytes(zt.get(partition_path("t", 0))[0]).replicas,
        30,
        "the drain to add a replica on server 3",
    )
    assert a.running and a.claimed and not a._lost.is_set()
    assert zt.get(JOB_OWNER)[0] == b"a"
    assert not any("no longer owns" in line for line in a.status()["lines"])
