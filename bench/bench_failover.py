"""The pause a producer sees when the leader of its partition dies (``--mode kill``, SIGKILL)
or is stopped (``--mode term``, SIGTERM: a controlled shutdown hands its leadership to an
in-sync follower first, partition_server/handoff.py), over ``--kills`` rounds.

A real local cluster (ZooKeeper, a coordinator, three partition servers as processes), one
partition with R=3, one producer sending ``--rate`` records a second without pause. Each
round SIGKILLs whichever server leads, restarts it, and waits until it is back in the
in-sync set before the next round, so every kill meets the same three-replica setup.

The pause of one kill is the longest gap between two consecutive acknowledgements the
producer sees from a second before the SIGKILL until it has had another second's worth of
acks after it (acks already on their way when the leader died land just after the kill;
the gap is the time nothing could be acked). It is made of:
ZooKeeper noticing the dead server (its session timeout, ``--session-timeout-ms``, default
the server's, plus up to one ZooKeeper tick), the election (one compare-and-set), the
producer's retry backoff (at most 250 ms after a lost leader) and metadata refresh, and the
new leader's first high watermark (its followers fetch once). At the end every acked
record is audited (present exactly once).

With ``--mode term`` the pause is the handover's: one compare-and-set, the new leader's
first high watermark, the producer's retry and metadata refresh; no session timeout.

    python bench/bench_failover.py [--kills 20] [--mode kill|term] [--session-timeout-ms N]
        [--rate 2000] [--json out.json] [--trace]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json

TOPIC = "failover"


def partition_state(cluster: LocalCluster) -> dict[str, Any]:
    _, body = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}")
    return dict(body["partition_states"][0])


def wait_for(pred: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(f"{what} not reached within {timeout_s}s")


class PacedProducer(threading.Thread):
    def __init__(self, url: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.url, self.rate = url, rate
        self.stop = threading.Event()
        self.ack_times: list[float] = []
        self.futures: list[Any] = []
        self.pid = -1
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def _acked(self, _f: Any) -> None:
        with self._lock:
            self.ack_times.append(time.monotonic())

    def run(self) -> None:
        try:
            with Producer(self.url, topic=TOPIC, producer_name="failover-bench") as p:
                self.pid = p.pid
                t0 = time.monotonic()
                i = 0
                while not self.stop.is_set():
                    f = p.send(b"record-%d" % i, partition=0)
                    f.add_done_callback(self._acked)
                    self.futures.append(f)
                    i += 1
                    if i % 20 == 0:
                        time.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))
                p.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by main
            self.error = exc

    def acks_after(self, t: float) -> int:
        with self._lock:
            times = sorted(self.ack_times)
        return len(times) - bisect.bisect_right(times, t)

    def longest_gap(self, start: float, end: float) -> tuple[float, float]:
        """The longest gap between two acks in [start, end], and the time it ended."""
        with self._lock:
            times = sorted(x for x in self.ack_times if start <= x <= end)
        gaps = [(b - a, b) for a, b in itertools.pairwise(times)]
        return max(gaps, default=(float("nan"), float("nan")))


def trace_sdk(path: Path) -> None:
    """The SDK's retries and lookups, with wall-clock times to line up with the servers'
    logs (the timeline of a failover: kill, election, role taken, first ack)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    sdk = logging.getLogger("pidlease.client")
    sdk.addHandler(handler)
    sdk.setLevel(logging.DEBUG)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kills", type=int, default=20, help="leader kills (rounds)")
    ap.add_argument(
        "--session-timeout-ms",
        type=int,
        default=None,
        help="PIDLEASE_ZK_SESSION_TIMEOUT_MS of the servers (default: the servers' default)",
    )
    ap.add_argument(
        "--mode",
        choices=("kill", "term"),
        default="kill",
        help="kill: SIGKILL the leader; term: SIGTERM it (controlled shutdown)",
    )
    ap.add_argument("--lag-time-ms", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--trace", action="store_true", help="log the SDK (DEBUG) to sdk.log beside the servers'"
    )
    args = ap.parse_args()
    env = {"PIDLEASE_REPLICA_LAG_TIME_MAX_MS": str(args.lag_time_ms)}
    if args.session_timeout_ms is not None:
        env["PIDLEASE_ZK_SESSION_TIMEOUT_MS"] = str(args.session_timeout_ms)
    session = args.session_timeout_ms or "(server default)"
    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-failover-"))
    pauses: list[float] = []
    kills: list[dict[str, Any]] = []
    if args.trace:
        trace_sdk(work / "sdk.log")
        print(f"logs in {work} (sdk.log, server-*/server.log)", flush=True)
    with LocalCluster(work, servers=3, env=env) as cluster:
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        wait_for(lambda: partition_state(cluster)["high_watermark"] >= 0, 30, "a leader")
        prod = PacedProducer(cluster.coordinator_url, args.rate)
        prod.start()
        wait_for(lambda: len(prod.ack_times) > args.rate, 60, "the producer running")
        for k in range(args.kills):
            st = partition_state(cluster)
            leader = st["leader"]
            time.sleep(1.0)  # a steady second before the kill
            t_kill, wall_kill = time.monotonic(), time.time()
            if args.mode == "term":
                cluster.stop_service(cluster.server(leader))  # SIGTERM, waits for the exit
            else:
                cluster.kill(cluster.server(leader))
            wait_for(lambda t=t_kill: prod.acks_after(t) > args.rate, 120, "acks after the kill")
            pause, gap_end = prod.longest_gap(t_kill - 1.0, time.monotonic())
            new = partition_state(cluster)
            pauses.append(pause)
            kills.append(
                {
                    "killed": leader,
                    "new_leader": new["leader"],
                    "epoch": new["leader_epoch"],
                    "pause_s": round(pause, 3),
                    # Wall clock, to line up with the logs: the kill, and the first ack
                    # after the longest gap (its end, relative to the kill).
                    "kill_wall": round(wall_kill, 3),
                    "first_ack_after_s": round(gap_end - t_kill, 3),
                }
            )
            print(
                f"{args.mode} {k + 1}: server {leader} -> leader {new['leader']} (epoch "
                f"{new['leader_epoch']}), pause {pause:.2f} s",
                flush=True,
            )
            cluster.start_service(cluster.server(leader))
            wait_for(
                lambda sid=leader: sid in partition_state(cluster)["isr"],
                120,
                f"server {leader} back in sync",
            )
            # The preferred-leader election moves leadership back to the restarted server
            # (its pause is not this round's): let it land before the next round.
            with contextlib.suppress(TimeoutError):
                wait_for(
                    lambda: (st := partition_state(cluster))["leader"] == st["replicas"][0],
                    15,
                    "leadership back on the preferred replica",
                )
        prod.stop.set()
        prod.join(120)
        if prod.error is not None:
            raise prod.error
        acked = [(0, prod.pid, f.result(timeout=0).sequence_id) for f in prod.futures]
        audit = verify_topic(cluster.coordinator_url, TOPIC, acked=acked)
        print(audit.summary())
        if not audit.ok:
            return 1
    p50 = statistics.median(pauses)
    p90 = statistics.quantiles(pauses, n=10)[-1] if len(pauses) > 1 else pauses[0]
    print(
        f"\n{args.kills} leader {'SIGTERMs' if args.mode == 'term' else 'kills'}, "
        f"ZooKeeper session timeout {session} ms, "
        f"{args.rate} records/s: pause p50 {p50:.2f} s, p90 {p90:.2f} s, max "
        f"{max(pauses):.2f} s, min {min(pauses):.2f} s; {len(acked):,} records acked, audit OK"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "kills": kills,
                    "p50_s": p50,
                    "p90_s": p90,
                    "min_s": min(pauses),
                    "max_s": max(pauses),
                    "records": len(acked),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
