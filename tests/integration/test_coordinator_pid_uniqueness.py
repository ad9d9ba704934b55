"""Two coordinator processes on one ZooKeeper hand out 10,000 PIDs at once, and one of them
is SIGKILLed in the middle of the run and restarted: every PID ever returned is distinct
(the restarted coordinator wastes the rest of its block and never reuses a PID)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.http import Reply, run_many
from pidlease.wire.cluster import PID_BLOCK, connect_zk

PER_COORDINATOR = 5_000
CONNECTIONS = 250  # concurrent keep-alive connections per coordinator
KILL_AFTER = 1_500  # answers from the victim before it is killed
RUN_TIMEOUT_S = 600
LEASE = {"topic": "orders", "partition": 0, "pid": -1}


async def _lease_all(cluster: LocalCluster) -> dict[str, Any]:
    victim = cluster.coordinators[1]
    answered = [0]
    killed = asyncio.Event()
    facts: dict[str, Any] = {}

    def victim_replied(reply: Reply) -> None:
        answered[0] += 1
        if answered[0] >= KILL_AFTER:
            killed.set()

    async def chaos() -> None:
        await killed.wait()
        facts["victim_answers_before_kill"] = answered[0]
        await asyncio.to_thread(cluster.kill, victim)
        await asyncio.to_thread(cluster.start_service, victim)
        facts["restarted"] = True

    chaos_task = asyncio.create_task(chaos())
    started = time.monotonic()
    # A request that dies with the victim is resent on a new connection until the
    # restarted process answers: the client sees every one of its 5,000 leases through.
    survivor, restarted = await asyncio.gather(
        run_many(
            cluster.coordinators[0].url,
            [LEASE] * PER_COORDINATOR,
            connections=CONNECTIONS,
            attempts_max=400,
        ),
        run_many(
            victim.url,
            [LEASE] * PER_COORDINATOR,
            connections=CONNECTIONS,
            attempts_max=400,
            on_reply=victim_replied,
        ),
    )
    facts["elapsed_s"] = time.monotonic() - started
    await asyncio.wait_for(chaos_task, 120)
    return {"replies": survivor + restarted, **facts}


def test_two_coordinators_10000_leases_with_a_sigkill_all_distinct(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1, coordinators=2)
    cluster.create_topic("orders", 1)
    victim_pid_before = cluster.coordinators[1].proc.pid  # type: ignore[union-attr]

    out = asyncio.run(asyncio.wait_for(_lease_all(cluster), RUN_TIMEOUT_S))

    replies: list[Reply] = out["replies"]
    bad = [(r.status, r.body) for r in replies if r.status != 200 or r.body.get("kind") != "new"]
    assert bad == []
    assert out.get("restarted"), "the victim was killed and restarted during the run"
    assert cluster.coordinators[1].proc.pid != victim_pid_before  # type: ignore[union-attr]
    pids = [r.body["pid"] for r in replies]
    assert len(pids) == 2 * PER_COORDINATOR
    assert len(set(pids)) == len(pids), "a PID was handed out twice"
    assert min(pids) >= 1

    # Every PID came from a block reserved on the shared counter, and the restarted
    # coordinator still serves: one more lease is new and unlike any seen.
    zk = connect_zk(cluster.zk_hosts)
    try:
        counter = int(zk.get(PID_BLOCK)[0])
    finally:
        zk.stop()
        zk.close()
    assert max(pids) < counter
    status, body = http_json("POST", cluster.coordinators[1].url + "/v1/lease_pid", LEASE)
    assert status == 200 and body["pid"] not in set(pids)
    print(
        f"10,000 leases on 2 coordinators with a SIGKILL after "
        f"{out['victim_answers_before_kill']} answers: {out['elapsed_s']:.1f} s"
    )
