"""Replica moves on a real cluster (ZooKeeper, a coordinator, partition-server processes;
coordinator/moves.py, rebalance.py; issue 27): a fourth server added under load and
`pidlease cluster rebalance` run (replicas and leaders within one of even), then
`pidlease server drain 2` and the server stopped, with an SDK producer writing all along:
no error reaches it and `verify` finds every acked record once. A move whose new replica
is SIGKILLed while it catches up: rolled back when it stays down, resumed when it comes
back. And a move with the moving replica SIGKILLed after each of its steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from coordinator.rebalance import leader_loads, replica_loads, spread
from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import wait_for
from tests.integration.test_handoff_cluster import Paced

TOPIC = "moves"
ENV = {
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
    "PIDLEASE_PREFERRED_LEADER_SETTLE_MS": "1000",
}


def states(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    status, body = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}?offsets=false")
    assert status == 200, body
    return {s["partition"]: s for s in body["partition_states"]}


def cli(cluster: LocalCluster, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "pidlease.cli", *args, "--coordinator", cluster.coordinator_url],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
        check=False,
    )
    print(out.stdout[-4000:], out.stderr[-2000:])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
def test_rebalance_onto_a_new_server_then_drain_one_under_load(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, env=ENV)
    cluster.create_topic(TOPIC, partitions=12, replication_factor=3)
    wait_for(lambda: all(len(s["isr"]) == 3 for s in states(cluster).values()), 30, "in sync")
    prod = Paced(cluster, partitions=12, rate=800, topic=TOPIC)
    prod.start()
    wait_for(lambda: len(prod.ack_times) > 1500, 60, "the producer running")
    cluster.add_server(4, extra_env=ENV)
    plan = cli(cluster, "cluster", "rebalance", "--dry-run")
    assert "dry run: nothing moved" in plan
    assert all(3 in s["replicas"] and 4 not in s["replicas"] for s in states(cluster).values())
    t0 = time.monotonic()
    out = cli(cluster, "cluster", "rebalance", "--timeout", "240")
    took = time.monotonic() - t0
    assert "rebalance done" in out
    st = states(cluster)
    assign = {("t", p): s["replicas"] for p, s in st.items()}
    assert replica_loads(assign, [1, 2, 3, 4]) == {1: 9, 2: 9, 3: 9, 4: 9}
    led = {("t", p): [s["leader"]] for p, s in st.items()}
    assert spread(leader_loads(led, [1, 2, 3, 4])) <= 1, led
    assert all(sorted(s["isr"]) == sorted(s["replicas"]) for s in st.values()), st
    pause = prod.longest_gap(t0, time.monotonic())
    print(f"rebalance onto server 4: {took:.1f} s, longest gap between acks {pause:.3f} s")

    out = cli(cluster, "server", "drain", "2", "--timeout", "240")
    assert "drain of server 2 done" in out
    st = states(cluster)
    assert all(2 not in s["replicas"] for s in st.values()), st
    assign = {("t", p): s["replicas"] for p, s in st.items()}
    assert replica_loads(assign, [1, 3, 4]) == {1: 12, 3: 12, 4: 12}
    led = {("t", p): [s["leader"]] for p, s in st.items()}
    assert spread(leader_loads(led, [1, 3, 4])) <= 1, led
    cluster.stop_service(cluster.server(2))  # removed: it holds nothing any more
    t_after = time.monotonic()
    wait_for(lambda: prod.acks_after(t_after) > 1000, 60, "acks after the removal")
    prod.finish(cluster)


def drain_4(cluster: LocalCluster, rollback_after_s: float, *, dry_run: bool = False) -> list[int]:
    """Start draining server 4 (or only plan it); the servers that gain a replica."""
    url = f"{cluster.coordinator_url}/v1/servers/4/drain"
    body_in = {"rollback_after_s": rollback_after_s, "dry_run": dry_run}
    status, body = http_json("POST", url, body_in)
    assert status == 200, body
    return sorted({r for m in body["moves"] for r in m["to"] if r not in m["from"]})


def drain_ended(cluster: LocalCluster) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        _, st = http_json("GET", f"{cluster.coordinator_url}/v1/cluster/moves")
        return None if st["running"] else st

    st: dict[str, Any] = wait_for(finished, 180, "the drain to end")
    print("\n".join(st["lines"]))
    assert st["error"] == "NONE" and not st["failure"], st
    return st


def healthy(cluster: LocalCluster) -> None:
    for s in states(cluster).values():
        assert s["leader"] in s["isr"] and len(s["replicas"]) == 2 and len(s["isr"]) >= 1


@pytest.mark.slow
def test_a_move_whose_new_replica_is_killed_rolls_back_or_resumes(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=4, env=ENV)
    status, _ = http_json(
        "POST",
        f"{cluster.coordinator_url}/v1/topics",
        {"name": TOPIC, "partitions": 4, "replication_factor": 2},
    )
    assert status == 200
    wait_for(lambda: all(len(s["isr"]) == 2 for s in states(cluster).values()), 30, "in sync")
    prod = Paced(cluster, partitions=4, rate=800, topic=TOPIC)
    prod.start()
    wait_for(lambda: len(prod.ack_times) > 3000, 60, "some log to catch up on")
    # 1. The gaining server is SIGKILLed and stays down past the grace: its moves roll back
    # (the original replicas never left), the others finish.
    # Stopped (SIGSTOP) before the drain starts, so its new replica cannot catch up first;
    # the plan is the dry run's (same state), so the victim gains a replica.
    victim = drain_4(cluster, rollback_after_s=3.0, dry_run=True)[0]
    cluster.signal_service(cluster.server(victim), signal.SIGSTOP)
    assert victim in drain_4(cluster, rollback_after_s=3.0)
    cluster.kill(cluster.server(victim))
    st = drain_ended(cluster)
    states_ = [m["state"] for m in st["moves"]]
    assert "rolled back" in states_ and set(states_) <= {"done", "rolled back"}, st["moves"]
    healthy(cluster)
    assert any(4 in s["replicas"] for s in states(cluster).values())
    # 2. It comes back; drained again, and SIGKILLed mid-move for two seconds: the move
    # waits for it and resumes (no rollback within the 60 s grace).
    cluster.start_service(cluster.server(victim))
    wait_for(
        lambda: all(sorted(s["isr"]) == sorted(s["replicas"]) for s in states(cluster).values()),
        60,
        "every replica back in sync",
    )
    again = drain_4(cluster, rollback_after_s=60.0)
    assert again
    cluster.kill(cluster.server(again[0]))
    time.sleep(2.0)
    cluster.start_service(cluster.server(again[0]))
    st = drain_ended(cluster)
    assert all(m["state"] == "done" for m in st["moves"]), st["moves"]
    healthy(cluster)
    assert all(4 not in s["replicas"] for s in states(cluster).values())
    wait_for(
        lambda: all(sorted(s["isr"]) == sorted(s["replicas"]) for s in states(cluster).values()),
        60,
        "every replica in sync",
    )
    prod.finish(cluster)


@pytest.mark.slow
def test_a_move_survives_a_sigkill_of_the_moving_replica_after_each_step(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """The coordinator's own steps (``MoveRunner``) driven one at a time; after step k
    (k = 1: the new replica added, 2: leadership moved to it, 3: the old replica removed)
    the new replica's server is SIGKILLed and restarted; the move then runs to its end.
    Each partition stays led by an in-sync replica throughout, and the producer's acked
    records are all there once."""
    from kazoo.client import KazooClient

    from coordinator.moves import Move, MoveRunner

    cluster: LocalCluster = make_cluster(servers=4, env=ENV)
    status, _ = http_json(
        "POST",
        f"{cluster.coordinator_url}/v1/topics",
        {"name": TOPIC, "partitions": 3, "replication_factor": 2},
    )
    assert status == 200
    wait_for(lambda: all(len(s["isr"]) == 2 for s in states(cluster).values()), 30, "in sync")
    prod = Paced(cluster, partitions=3, rate=600, topic=TOPIC)
    prod.start()
    wait_for(lambda: len(prod.ack_times) > 1500, 60, "the producer running")
    zk = KazooClient(hosts=cluster.zk_hosts)
    zk.start(timeout=30)
    try:
        runner = MoveRunner(zk, progress=print, rollback_after_s=120.0)
        for p, kill_after in ((0, 1), (1, 2), (2, 3)):
            st = states(cluster)[p]
            gaining = next(s for s in (1, 2, 3, 4) if s not in st["replicas"])
            target = [gaining, st["leader"]]  # leadership moves to the new replica
            m = Move((TOPIC, p), list(st["replicas"]), target)
            runner.record(m.key, m.original, m.target)

            def step_until(steps: int, m: Move = m) -> bool:
                return runner.step(m) or m.steps >= steps

            wait_for(lambda k=kill_after: step_until(k), 90, f"{TOPIC}-{p}: step {kill_after}")
            print(f"{TOPIC}-{p}: SIGKILL of server {gaining} after step {kill_after}")
            cluster.kill(cluster.server(gaining))
            time.sleep(1.0)
            cluster.start_service(cluster.server(gaining))
            wait_for(lambda m=m: runner.step(m), 120, f"{TOPIC}-{p}: the move's end")
            assert m.state == "done", m.to_json()
            s = states(cluster)[p]
            assert s["replicas"] == target and s["leader"] in s["isr"], s
    finally:
        zk.stop()
        zk.close()
    wait_for(
        lambda: all(sorted(s["isr"]) == sorted(s["replicas"]) for s in states(cluster).values()),
        60,
        "every replica in sync",
    )
    t_end = time.monotonic()
    wait_for(lambda: prod.acks_after(t_end) > 500, 60, "acks after the moves")
    prod.finish(cluster)
