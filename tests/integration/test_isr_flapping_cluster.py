"""No in-sync set flapping on real servers (issue 16): a follower of an idle, replicated
topic is stopped (SIGSTOP: alive for ZooKeeper, silent to its leaders, "unreachable"), and
the ZooKeeper writes to the partition state znodes are counted over ~10 s by their
versions. Before the fix every partition was written about once a maintenance tick (the
follower removed, then re-added on its old fetch); now once, when it leaves. SIGCONT: it
fetches again and rejoins everywhere."""

from __future__ import annotations

import signal
import time
from typing import Any

from partition_server.metrics import sample
from pidlease.testing.devcluster import LocalCluster
from pidlease.wire.cluster import PartitionState, connect_zk, partition_path
from tests.helpers import scrape_metrics, wait_for

TOPIC = "idle"
PARTITIONS = 6
WINDOW_S = 10.0
ENV = {
    # A session far longer than the test: the stopped server stays registered, so no
    # election writes mix with the in-sync set's.
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "60000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "1000",  # a 250 ms maintenance tick
}


def states(zk: Any) -> dict[int, tuple[PartitionState, int]]:
    out = {}
    for p in range(PARTITIONS):
        raw, stat = zk.get(partition_path(TOPIC, p))
        out[p] = (PartitionState.from_bytes(raw), stat.version)
    return out


def isr_counter(cluster: LocalCluster, sid: int, kind: str, partition: int) -> float:
    got = scrape_metrics(cluster.server(sid).metrics_url)
    return sample(got, f"pidlease_server_isr_{kind}_total", topic=TOPIC, partition=str(partition))


def test_a_stopped_follower_of_an_idle_topic_leaves_each_in_sync_set_once(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, env=ENV)
    cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
    zk = connect_zk(cluster.zk_hosts)
    try:
        wait_for(
            lambda: all(len(ps.isr) == 3 for ps, _ in states(zk).values()),
            30,
            "every partition fully in sync",
        )
        leaders = {p: ps.leader for p, (ps, _) in states(zk).items()}
        # The follower to stop: the server leading fewest partitions; the ones it leads
        # are left out (their followers cannot fetch from it, a different story).
        victim = min((1, 2, 3), key=lambda sid: (list(leaders.values()).count(sid), -sid))
        watched = [p for p, leader in leaders.items() if leader != victim]
        assert len(watched) >= PARTITIONS // 3
        time.sleep(2)  # settled: no change left in flight
        before = states(zk)
        cluster.signal_service(cluster.server(victim), signal.SIGSTOP)
        try:
            time.sleep(WINDOW_S)
            after = states(zk)
            writes = {p: after[p][1] - before[p][1] for p in watched}
            print(f"ISR writes in {WINDOW_S:.0f} s with server {victim} stopped: {writes}")
            for p in watched:
                assert victim not in after[p][0].isr, f"partition {p} still names {victim}"
            assert all(n <= 2 for n in writes.values()), f"in-sync sets flapping: {writes}"
            for p in watched:
                assert isr_counter(cluster, leaders[p], "shrinks", p) == 1
                assert isr_counter(cluster, leaders[p], "expands", p) == 0
        finally:
            cluster.signal_service(cluster.server(victim), signal.SIGCONT)
        wait_for(
            lambda: all(len(ps.isr) == 3 for ps, _ in states(zk).values()),
            30,
            "the follower back in every in-sync set",
        )
        for p in watched:
            assert isr_counter(cluster, leaders[p], "expands", p) >= 1
    finally:
        zk.stop()
        zk.close()
