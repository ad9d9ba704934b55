"""One rebalance or drain job cluster-wide (coordinator/moves.py ``MoveJobs``; issue 27),
with two real coordinator processes on one ZooKeeper and real partition servers: a drain
asked of the second coordinator while the first runs one is refused with 409 naming the
running job and its owner, the second shows the first's progress; the owner SIGKILLed
mid-job, the other coordinator takes the job over and finishes it; an SDK producer writes
all along and every acked record is there once."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import wait_for
from tests.integration.test_handoff_cluster import Paced

TOPIC = "jobs"
ENV = {
    # Both services read it: a SIGKILLed coordinator's owner node goes within ~4 s.
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
    "PIDLEASE_PREFERRED_LEADER_SETTLE_MS": "1000",
}


def states(url: str) -> dict[int, dict[str, Any]]:
    status, body = http_json("GET", f"{url}/v1/topics/{TOPIC}?offsets=false")
    assert status == 200, body
    return {s["partition"]: s for s in body["partition_states"]}


def moves(url: str) -> dict[str, Any]:
    status, body = http_json("GET", f"{url}/v1/cluster/moves")
    assert status == 200, body
    return body


@pytest.mark.slow
def test_one_job_across_two_coordinators_taken_over_when_its_owner_dies(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=4, coordinators=2, env=ENV)
    c1, c2 = (c.url for c in cluster.coordinators)
    status, _ = http_json(
        "POST", f"{c1}/v1/topics", {"name": TOPIC, "partitions": 4, "replication_factor": 2}
    )
    assert status == 200
    wait_for(lambda: all(len(s["isr"]) == 2 for s in states(c1).values()), 30, "in sync")
    prod = Paced(cluster, partitions=4, rate=600, topic=TOPIC)  # through coordinator 1
    prod.start()
    wait_for(lambda: len(prod.ack_times) > 1500, 60, "the producer running")

    # The servers that gain a replica are stopped (SIGSTOP) before the drain, so its moves
    # wait for them to catch up: the job is still running when its owner is killed.
    _, plan = http_json("POST", f"{c2}/v1/servers/4/drain", {"dry_run": True})
    gaining = sorted({r for m in plan["moves"] for r in m["to"] if r not in m["from"]})
    assert gaining, plan
    for g in gaining:
        cluster.signal_service(cluster.server(g), signal.SIGSTOP)
    status, started = http_json("POST", f"{c2}/v1/servers/4/drain", {"rollback_after_s": 300})
    assert status == 200 and started["owner"] == "coordinator-2", started

    # The other coordinator refuses a second job, rebalance or drain, and says why.
    for path in ("/v1/cluster/rebalance", "/v1/servers/3/drain"):
        status, body = http_json("POST", f"{c1}{path}", {})
        assert status == 409, body
        assert "running, on coordinator coordinator-2" in body["detail"], body
        assert "GET /v1/cluster/moves" in body["detail"], body
        assert body["job"]["kind"] == "drain of server 4", body
    # A dry run is still answered (it changes nothing).
    status, body = http_json("POST", f"{c1}/v1/cluster/rebalance", {"dry_run": True})
    assert status == 200, body
    # ... and it shows the owner's progress.
    wait_for(lambda: any("move" in ln for ln in moves(c1)["lines"]), 20, "progress on c1")
    seen = moves(c1)
    assert seen["running"] and seen["owner"] == "coordinator-2", seen

    # The owner dies mid-job; the gaining servers come back (SIGKILL + restart: a stopped
    # process past its session is not what this test is about).
    cluster.kill(cluster.coordinators[1])
    for g in gaining:
        cluster.kill(cluster.server(g))
        cluster.start_service(cluster.server(g))

    def taken_over() -> bool:
        st = moves(c1)
        return st["owner"] == "coordinator-1" and any("takes over" in ln for ln in st["lines"])

    wait_for(taken_over, 30, "coordinator-1 to take the job over")

    def ended() -> dict[str, Any] | None:
        st = moves(c1)
        return None if st["running"] else st

    st: dict[str, Any] = wait_for(ended, 180, "the taken-over drain to end")
    print("\n".join(st["lines"]))
    assert not st["failure"], st
    assert st["lines"][-1] == "drain of server 4 done", st["lines"][-5:]
    assert all(m["state"] == "done" for m in st["moves"]), st["moves"]
    final = states(c1)
    assert all(4 not in s["replicas"] and s["leader"] in s["isr"] for s in final.values()), final
    # The job is over: a new one may start, on any coordinator.
    status, body = http_json("POST", f"{c1}/v1/cluster/rebalance", {"dry_run": False})
    assert status == 200, body
    wait_for(lambda: not moves(c1)["running"], 120, "the rebalance to end")
    t_end = time.monotonic()
    wait_for(lambda: prod.acks_after(t_end) > 500, 60, "acks after the moves")
    prod.finish(cluster)
