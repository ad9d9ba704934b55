"""The coordinator's lease caches and write batching against real ZooKeeper, two real
coordinators and a real partition server: a record cached by one coordinator that another
coordinator changed or deleted never decides a lease on its own, and concurrent renewals
and new leases through the group-committed writes keep every rule (distinct PIDs, one
winner per generation)."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from typing import Any

from kazoo.client import KazooClient

from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.http import run_many
from pidlease.wire import cluster as cluster_layout
from tests.helpers import lease_pid


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    m = re.search(rf"^{name} (\S+)", text, re.MULTILINE)
    assert m, name
    return float(m.group(1))


def test_stale_cached_record_is_rechecked(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(
        servers=1,
        coordinators=2,
    )
    cluster.create_topic("orders", 2)
    a, b = (c.url for c in cluster.coordinators)

    status, first = lease_pid(a, expire_ms=60_000)  # cached by A
    assert status == 200
    pid, g0 = first["pid"], first["generation"]
    status, renewed = lease_pid(a, pid=pid, generation=g0)  # A renews from its cache
    assert status == 200 and renewed["kind"] == "renew"
    assert metric(a, "pidlease_pid_record_cache_hits_total") >= 1

    status, took = lease_pid(b, pid=pid)  # B takes over: generation g0+1
    assert status == 200 and took["generation"] == g0 + 1

    # A still caches generation g0. A renewal with g0 must be FENCED (the CAS on A's stale
    # version fails, the fresh read says g0+1), never a renewal.
    status, zombie = lease_pid(a, pid=pid, generation=g0)
    assert status == 409 and zombie["error"] == "FENCED", zombie
    # A renewal with the new generation through A works although A cached the old one.
    status, ok = lease_pid(a, pid=pid, generation=g0 + 1)
    assert status == 200 and ok["kind"] == "renew" and ok["generation"] == g0 + 1
    # Partition 1 added through A (cached) then renewed through B: both see one record.
    status, p1 = lease_pid(a, pid=pid, generation=g0 + 1, partition=1)
    assert status == 200 and p1["generation"] == g0 + 1
    status, p1b = lease_pid(b, pid=pid, generation=g0 + 1, partition=1)
    assert status == 200 and p1b["kind"] == "renew"

    # Deleted behind A's back (as another coordinator's sweeper does): A's cached record
    # must not renew it.
    status, other = lease_pid(a, expire_ms=60_000)
    assert status == 200
    zk = KazooClient(hosts=cluster.zk_hosts)
    zk.start(timeout=10)
    try:
        zk.delete(cluster_layout.pid_path(other["pid"]))
    finally:
        zk.stop()
        zk.close()
    status, late = lease_pid(a, pid=other["pid"], generation=other["generation"])
    assert status == 404 and late["error"] == "UNKNOWN_PID", late


def test_concurrent_new_and_renew_through_batched_writes(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1, coordinators=2)
    cluster.create_topic("orders", 4)
    urls = [c.url for c in cluster.coordinators]
    bodies = [{"topic": "orders", "partition": i % 4, "pid": -1} for i in range(600)]
    replies = [r for u in urls for r in asyncio.run(run_many(u, bodies[:300], connections=32))]
    assert all(r.status == 200 for r in replies), [r.body for r in replies if r.status != 200][:3]
    pids = [r.body["pid"] for r in replies]
    assert len(set(pids)) == len(pids) == 600
    # Each PID renewed through the other coordinator than the one that created it, all at
    # once, then once more through the creator (whose cache is now stale by one version).
    for flip in (1, 0):
        for k in range(len(urls)):
            mine = replies[k * 300 : (k + 1) * 300]
            target = urls[(k + flip) % 2]
            renew = [
                {
                    "topic": "orders",
                    "partition": i % 4,
                    "pid": r.body["pid"],
                    "generation": r.body["generation"],
                }
                for i, r in enumerate(mine)
            ]
            got = asyncio.run(run_many(target, renew, connections=32))
            assert all(r.status == 200 and r.body["kind"] == "renew" for r in got), [
                r.body for r in got if r.status != 200
            ][:3]
    # The writes really were group-committed (fewer ZooKeeper requests than writes).
    batches = sum(metric(u, "pidlease_zk_write_batches_total") for u in urls)
    batched = sum(metric(u, "pidlease_zk_batched_writes_total") for u in urls)
    assert batched > batches >= 1


def test_a_renewal_round_is_one_zookeeper_write_whatever_the_partitions(
    make_cluster: Any,
) -> None:
    """Issue 30, item 6: the lease keeper renews every partition of its PID in one batch;
    the coordinator writes the PID record once for it (it wrote it once per partition:
    ~45 MB per round for 1000 partitions). Counted by the coordinator itself."""
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("wide", 60)
    url = cluster.coordinator_url
    status, first = lease_pid(url, topic="wide", expire_ms=60_000)
    assert status == 200
    reqs = [
        {"topic": "wide", "partition": p, "pid": first["pid"], "generation": first["generation"]}
        for p in range(60)
    ]
    for _ in range(3):
        before = metric(url, "pidlease_zk_write_requests_total")
        status, body = http_json("POST", url + "/v1/lease_pid/batch", {"requests": reqs})
        after = metric(url, "pidlease_zk_write_requests_total")
        assert status == 200 and [r["error"] for r in body["responses"]] == ["NONE"] * 60
        assert after - before == 1, f"{after - before} ZooKeeper writes for one renewal round"
    status, view = http_json("GET", url + f"/v1/pids/{first['pid']}")
    assert status == 200 and len(view["partitions"]) == 60
