"""Leadership handed over by a live leader, on a real cluster (ZooKeeper, a coordinator,
three partition-server processes; partition_server/handoff.py, issue 27):

- a controlled shutdown: SIGTERM to the leader under load hands its partitions to in-sync
  followers (compare-and-set, epoch + 1, the leaving server out of the in-sync set) before
  the process exits; the producer sees a pause far below the ZooKeeper session timeout
  (what a SIGKILL costs), no error, and every acked record is in the log once;
- the preferred-leader election: after the preferred replica restarts, leadership returns
  to it once it is in sync, without an error reaching the SDK; with the setting off it
  stays where it is.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from typing import Any

import pytest

from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import wait_for

TOPIC = "handoff"
SESSION_MS = 8000  # a SIGKILL's failover waits this out; a handover must not
ENV = {
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": str(SESSION_MS),
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
    "PIDLEASE_PREFERRED_LEADER_SETTLE_MS": "1000",
}


def states(cluster: LocalCluster) -> list[dict[str, Any]]:
    status, body = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}")
    assert status == 200, body
    return list(body["partition_states"])


class Paced(threading.Thread):
    """One SDK producer sending ``rate`` records a second round-robin over ``partitions``
    until stopped; keeps every future and the time of every ack."""

    def __init__(
        self, cluster: LocalCluster, partitions: int, rate: int = 1000, topic: str = TOPIC
    ) -> None:
        super().__init__(daemon=True)
        self.cluster, self.partitions, self.rate, self.topic = cluster, partitions, rate, topic
        self.stop = threading.Event()
        self.futures: list[Any] = []
        self.ack_times: list[float] = []
        self.pid = -1
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def _acked(self, f: Any) -> None:
        if f.exception() is None:
            with self._lock:
                self.ack_times.append(time.monotonic())

    def run(self) -> None:
        try:
            with Producer(
                self.cluster.coordinator_url, topic=self.topic, producer_name="handoff"
            ) as p:
                self.pid = p.pid
                t0, i = time.monotonic(), 0
                while not self.stop.is_set() and i < 1_000_000:
                    f = p.send(b"r-%d" % i, partition=i % self.partitions)
                    f.add_done_callback(self._acked)
                    self.futures.append(f)
                    i += 1
                    if i % 20 == 0:
                        time.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))
                p.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def acks_after(self, t: float) -> int:
        with self._lock:
            times = sorted(self.ack_times)
        return len(times) - bisect.bisect_right(times, t)

    def longest_gap(self, start: float, end: float) -> float:
        with self._lock:
            times = sorted(x for x in self.ack_times if start <= x <= end)
        return max((b - a for a, b in itertools.pairwise(times)), default=float("nan"))

    def finish(self, cluster: LocalCluster) -> None:
        """Stop, then: no future failed (an error reaching the SDK), and the audit."""
        self.stop.set()
        self.join(120)
        assert not self.is_alive() and self.error is None, self.error
        failed = [f.exception() for f in self.futures if f.exception() is not None]
        assert not failed, failed[:3]
        acked = [
            (m.partition, self.pid, m.sequence_id)
            for m in (f.result(timeout=0) for f in self.futures)
        ]
        report = verify_topic(cluster.coordinator_url, self.topic, acked=acked)
        print(report.summary())
        assert report.ok, report.summary()
        assert report.total("records") == len(acked)


@pytest.mark.slow
def test_sigterm_hands_leadership_over_before_leaving(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, env=ENV)
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3)
    wait_for(lambda: all(s["high_watermark"] >= 0 for s in states(cluster)), 30, "leaders")
    prod = Paced(cluster, partitions=3)
    prod.start()
    wait_for(lambda: len(prod.ack_times) > 2000, 60, "the producer running")
    before = {s["partition"]: s for s in states(cluster)}
    victim = before[0]["leader"]
    led = [p for p, s in before.items() if s["leader"] == victim]
    t0 = time.monotonic()
    cluster.stop_service(cluster.server(victim))  # SIGTERM, waits for the exit
    stopped_s = time.monotonic() - t0
    wait_for(lambda t=t0: prod.acks_after(t) > 2000, 60, "acks after the SIGTERM")
    pause = prod.longest_gap(t0 - 1.0, time.monotonic())
    after = {s["partition"]: s for s in states(cluster)}
    print(
        f"SIGTERM of leader {victim} (led {led}): exit after {stopped_s:.2f} s, pause {pause:.3f} s"
    )
    for p in led:
        assert after[p]["leader"] != victim
        assert after[p]["leader_epoch"] == before[p]["leader_epoch"] + 1
        assert victim not in after[p]["isr"]
    # A SIGKILL's failover waits for the session to end (SESSION_MS); a handover does not.
    assert pause < SESSION_MS / 1000 / 2, pause
    log_text = cluster.server(victim).log_path.read_text()
    assert f"{len(led)} partition(s) handed over, 0 kept" in log_text, log_text[-3000:]
    prod.finish(cluster)


@pytest.mark.slow
def test_leadership_returns_to_the_preferred_replica(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, env=ENV)
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3)
    wait_for(lambda: all(s["high_watermark"] >= 0 for s in states(cluster)), 30, "leaders")
    prod = Paced(cluster, partitions=3)
    prod.start()
    wait_for(lambda: len(prod.ack_times) > 1000, 60, "the producer running")
    first = {s["partition"]: s for s in states(cluster)}
    assert all(s["leader"] == s["replicas"][0] for s in first.values()), first
    victim = first[0]["leader"]
    cluster.kill(cluster.server(victim))
    wait_for(
        lambda: all(s["leader"] != victim for s in states(cluster)),
        60,
        f"every partition led by another server than {victim}",
    )
    cluster.start_service(cluster.server(victim))

    def back() -> bool:
        return all(s["leader"] == s["replicas"][0] for s in states(cluster))

    wait_for(back, 60, "leadership back on every preferred replica")
    final = {s["partition"]: s for s in states(cluster)}
    for p, s in final.items():
        if first[p]["leader"] == victim:
            assert s["leader"] == victim and s["leader_epoch"] >= first[p]["leader_epoch"] + 2
    t_back = time.monotonic()
    wait_for(lambda: prod.acks_after(t_back) > 1000, 60, "acks after the return")
    prod.finish(cluster)


@pytest.mark.slow
def test_preferred_leader_election_can_be_turned_off(make_cluster) -> None:  # type: ignore[no-untyped-def]
    env = {**ENV, "PIDLEASE_PREFERRED_LEADER_ELECTION": "false"}
    cluster: LocalCluster = make_cluster(servers=3, env=env)
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    wait_for(lambda: states(cluster)[0]["high_watermark"] >= 0, 30, "a leader")
    victim = states(cluster)[0]["leader"]
    cluster.kill(cluster.server(victim))
    wait_for(lambda: states(cluster)[0]["leader"] != victim, 60, "another leader")
    cluster.start_service(cluster.server(victim))
    wait_for(lambda: victim in states(cluster)[0]["isr"], 60, f"server {victim} back in sync")
    time.sleep(3.0)  # settle (1 s) plus two maintenance ticks, and more
    assert states(cluster)[0]["leader"] != victim
