"""Lease throughput and latency of the coordinator, with one and with two coordinators.

Starts its own ZooKeeper, one partition server and the coordinators as real processes
(pidlease.testing.devcluster.LocalCluster) on 127.0.0.1, then for each setup:

- new:   N leases with pid -1 (a PID from the block, one ZooKeeper create each)
- renew: N renewals of already leased PIDs (a PRODUCER_STATE to the partition leader
         and one ZooKeeper compare-and-set each)

spread evenly over the coordinators through ``--connections`` keep-alive connections per
coordinator. Prints leases/s, client-side p50/p99 latency, and ZooKeeper write requests
per lease counted by the coordinators themselves (``pidlease_zk_write_requests_total``).

    python bench/bench_lease.py [--leases 5000] [--connections 1,64] [--block-size 100]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
import urllib.request
from typing import Any

import psutil

from pidlease.testing.devcluster import LocalCluster
from pidlease.testing.http import Reply, run_many


def zk_writes(url: str) -> int:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    m = re.search(r"^pidlease_zk_write_requests_total (\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else 0


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


async def _spread(urls: list[str], bodies: list[dict[str, Any]], connections: int) -> list[Reply]:
    parts = [bodies[i :: len(urls)] for i in range(len(urls))]
    results = await asyncio.gather(
        *(run_many(u, p, connections=connections) for u, p in zip(urls, parts, strict=True))
    )
    return [r for part in results for r in part]


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def measure(
    cluster: LocalCluster, kind: str, bodies: list[dict[str, Any]], connections: int
) -> dict[str, Any]:
    urls = [c.url for c in cluster.coordinators]
    coord_pids = [c.proc.pid for c in cluster.coordinators if c.proc is not None]
    zk_pids = [n.proc.pid for n in (cluster.zk.nodes if cluster.zk else []) if n.proc is not None]
    writes_before = sum(zk_writes(u) for u in urls)
    coord_cpu, zk_cpu = _cpu_s(coord_pids), _cpu_s(zk_pids)
    started = time.perf_counter()
    replies = asyncio.run(_spread(urls, bodies, connections))
    elapsed = time.perf_counter() - started
    coord_cpu, zk_cpu = _cpu_s(coord_pids) - coord_cpu, _cpu_s(zk_pids) - zk_cpu
    writes = sum(zk_writes(u) for u in urls) - writes_before
    bad = [r for r in replies if r.status != 200]
    if bad:
        raise SystemExit(f"{len(bad)} {kind} leases failed, e.g. {bad[0].status} {bad[0].body}")
    lat = [r.latency_s for r in replies]
    return {
        "kind": kind,
        "coordinators": len(urls),
        "connections": connections,
        "leases": len(replies),
        "leases_per_s": len(replies) / elapsed,
        "p50_ms": percentile(lat, 0.5) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "zk_writes_per_lease": writes / len(replies),
        "coordinator_cpu_us_per_lease": coord_cpu / len(replies) * 1e6,
        "zookeeper_cpu_us_per_lease": zk_cpu / len(replies) * 1e6,
        "replies": replies,
    }


def run_setup(
    coordinators: int, leases: int, connections: int, block_size: int
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-lease-") as tmp:
        cluster = LocalCluster(
            tmp,
            servers=1,
            coordinators=coordinators,
            env={"PIDLEASE_PID_BLOCK_SIZE": str(block_size)},
        )
        cluster.start()
        try:
            cluster.create_topic("bench", 8)
            new = measure(
                cluster,
                "new",
                [{"topic": "bench", "partition": i % 8, "pid": -1} for i in range(leases)],
                connections,
            )
            # Renew the PIDs just leased, each on the partition it was leased for.
            renew_bodies = [
                {
                    "topic": "bench",
                    "partition": i % 8,
                    "pid": r.body["pid"],
                    "generation": r.body["generation"],
                }
                for i, r in enumerate(new["replies"])
            ]
            renew = measure(cluster, "renew", renew_bodies, connections)
            pids = [r.body["pid"] for r in new["replies"]]
            if len(set(pids)) != len(pids):
                raise SystemExit("duplicate PIDs handed out")
            return [new, renew]
        finally:
            cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=5000)
    ap.add_argument(
        "--connections",
        default="1,64",
        help="comma-separated connections per coordinator, one set of rows each "
        "(1 = one request at a time: the latency a producer sees)",
    )
    ap.add_argument("--block-size", type=int, default=100)
    args = ap.parse_args()
    rows = []
    for connections in (int(c) for c in args.connections.split(",")):
        leases_n = args.leases if connections > 1 else max(200, args.leases // 5)
        for n in (1, 2):
            rows += run_setup(n, leases_n, connections, args.block_size)
    print(
        f"\nlease benchmark: {args.leases} leases per row ({max(200, args.leases // 5)} with one "
        f"connection), PID block {args.block_size}, 1 partition server, ZooKeeper standalone; "
        "CPU from the processes' own counters\n"
    )
    print(
        "| kind | coordinators | connections | leases/s | p50 ms | p99 ms | ZooKeeper write "
        "requests/lease | coordinator CPU us/lease | ZooKeeper CPU us/lease |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['kind']} | {r['coordinators']} | {r['connections']} | {r['leases_per_s']:.0f} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['zk_writes_per_lease']:.3f} "
            f"| {r['coordinator_cpu_us_per_lease']:.0f} | {r['zookeeper_cpu_us_per_lease']:.0f} |"
        )


if __name__ == "__main__":
    main()
