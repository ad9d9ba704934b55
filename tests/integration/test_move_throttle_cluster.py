"""The move throttle on a real cluster (partition_server/move_throttle.py; issue 27): with
``PIDLEASE_MOVE_FETCH_BYTES_PER_S`` at 256 KiB/s, a drain that moves a partition of about
3 MiB to a new server takes at least the time that budget allows, every byte the new
replica fetched went through the throttle (the leader's counter), and a producer writing
to the partition meanwhile keeps getting acks (its in-sync follower is not throttled)."""

from __future__ import annotations

import os
import time
import urllib.request
from typing import Any

import pytest

from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import wait_for
from tests.integration.test_handoff_cluster import Paced

TOPIC = "throttled"
RATE = 256 * 1024
ENV = {
    "PIDLEASE_MOVE_FETCH_BYTES_PER_S": str(RATE),
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
}


def state(cluster: LocalCluster) -> dict[str, Any]:
    _, body = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}?offsets=false")
    return dict(body["partition_states"][0])


def throttled(cluster: LocalCluster, server: int) -> int:
    with urllib.request.urlopen(cluster.server(server).metrics_url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("pidlease_server_move_throttled_bytes_total "):
                return int(float(line.split()[1]))
    raise AssertionError("no pidlease_server_move_throttled_bytes_total")


def log_bytes(cluster: LocalCluster, server: int) -> int:
    d = cluster.data_dir / f"server-{server}" / "data" / f"{TOPIC}-0"
    return sum(f.stat().st_size for f in d.glob("*.log"))


@pytest.mark.slow
def test_a_move_is_throttled_by_bytes_and_producers_keep_their_acks(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, env=ENV)
    status, _ = http_json(
        "POST",
        f"{cluster.coordinator_url}/v1/topics",
        {"name": TOPIC, "partitions": 1, "replication_factor": 2},
    )
    assert status == 200
    wait_for(lambda: len(state(cluster)["isr"]) == 2, 30, "in sync")
    with Producer(cluster.coordinator_url, topic=TOPIC, producer_name="fill") as p:
        # ~3 MiB of random bytes (compression gains nothing)
        fill = [p.send(b"%d-" % i + os.urandom(1024), partition=0) for i in range(3000)]
        p.flush()
        filled = [(0, p.pid, f.result(timeout=0).sequence_id) for f in fill]
    st = state(cluster)
    leader, size = st["leader"], log_bytes(cluster, st["leader"])
    assert size > 3_000_000, size
    drained = next(r for r in st["replicas"] if r != leader)
    gaining = next(s for s in (1, 2, 3) if s not in st["replicas"])
    before = throttled(cluster, leader)

    prod = Paced(cluster, partitions=1, rate=200, topic=TOPIC)
    prod.start()
    wait_for(lambda: len(prod.ack_times) > 200, 60, "the producer running")
    t0 = time.monotonic()
    status, body = http_json(
        "POST", f"{cluster.coordinator_url}/v1/servers/{drained}/drain", {"rollback_after_s": 300}
    )
    assert status == 200, body
    wait_for(
        lambda: not http_json("GET", f"{cluster.coordinator_url}/v1/cluster/moves")[1]["running"],
        120,
        "the drain to end",
    )
    took = time.monotonic() - t0
    st = state(cluster)
    assert gaining in st["replicas"] and drained not in st["replicas"], st
    sent = throttled(cluster, leader) - before
    print(f"moved {size:,} bytes in {took:.1f} s; {sent:,} bytes through the throttle")
    # All of the new replica's catch-up went through the throttle, and no faster than the
    # rate allows (its bucket holds one second's worth at the start).
    assert sent >= size, (sent, size)
    assert took >= (size - RATE) / RATE, (took, size)
    # Acks kept coming: the in-sync follower was never throttled.
    assert prod.longest_gap(t0, time.monotonic()) < 3.0
    prod.stop.set()
    prod.join(120)
    assert prod.error is None and not [f for f in prod.futures if f.exception() is not None]
    acked = filled + [(0, prod.pid, f.result(timeout=0).sequence_id) for f in prod.futures]
    report = verify_topic(cluster.coordinator_url, TOPIC, acked=acked)
    assert report.ok and report.total("records") == len(acked), report.summary()
