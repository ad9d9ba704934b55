"""A rebalance onto a new server and a drain, under load (issue 27's "must show").

A real local cluster (ZooKeeper, a coordinator, three partition servers as processes), one
topic of ``--partitions`` partitions with R=3, an SDK producer and a Kafka idempotent
producer (confluent-kafka, acks=all) each sending ``--rate`` records a second round-robin
over the partitions. Then:

1. a fourth server starts and ``POST /v1/cluster/rebalance`` runs (what ``pidlease cluster
   rebalance`` sends) until done;
2. ``POST /v1/servers/2/drain`` runs until done and server 2 is stopped (SIGTERM).

Printed per phase: replicas and leaders per server after it, its length, the ack latency
p50 / p99 / max of the records sent during it against the steady phase before (the
produce pause moves cause), the longest gap between two SDK acks; at the end the
exactly-once audit of the whole topic (``verify``: every SDK-acked record once, no
duplicate from either producer) and the record count against what both were acked.

The catch-up fetches of the moving replicas are throttled by the servers'
``PIDLEASE_MOVE_FETCH_BYTES_PER_S`` (``--move-throttle``; 0: none): run it with and without
to see what the throttle buys the producers' p99 (``--record-bytes`` and ``--prefill-s``
give the moves a log worth throttling; ``--no-drain`` stops after the rebalance).

    PYTHONPATH=. python bench/bench_rebalance.py [--partitions 60] [--rate 500]
        [--record-bytes 16] [--prefill-s 8] [--move-throttle BYTES_PER_S] [--no-drain]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare import KAFKA_PRODUCER_SETTINGS
from coordinator.rebalance import leader_loads, replica_loads
from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json

TOPIC = "elastic"


class Load(threading.Thread):
    """One producer at ``rate`` records/s; (send time, ack time) of every acked record."""

    def __init__(
        self, kind: str, cluster: LocalCluster, partitions: int, rate: int, pad: int = 0
    ) -> None:
        super().__init__(daemon=True)
        self.kind, self.cluster, self.partitions, self.rate = kind, cluster, partitions, rate
        self.pad = pad  # random bytes: a compressed batch stays this big
        self.stop = threading.Event()
        self.acks: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.sent = 0
        self.pid = -1
        self.futures: list[Any] = []
        self._lock = threading.Lock()

    def _ack(self, t0: float) -> None:
        with self._lock:
            self.acks.append((t0, time.monotonic()))

    def run(self) -> None:
        try:
            self._run_sdk() if self.kind == "sdk" else self._run_kafka()
        except BaseException as exc:  # noqa: BLE001 - reported by main
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _pace(self, t0: float, i: int) -> None:
        if i % 20 == 0:
            time.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))

    def _run_sdk(self) -> None:
        with Producer(self.cluster.coordinator_url, topic=TOPIC, producer_name="bench-sdk") as p:
            self.pid = p.pid
            t0, i = time.monotonic(), 0
            while not self.stop.is_set():
                ts = time.monotonic()
                f = p.send(b"sdk-%d" % i + os.urandom(self.pad), partition=i % self.partitions)
                f.add_done_callback(
                    lambda f, ts=ts: self._ack(ts) if f.exception() is None else None
                )
                self.futures.append(f)
                i += 1
                self.sent = i
                self._pace(t0, i)
            p.flush()

    def _run_kafka(self) -> None:
        from confluent_kafka import Producer as KafkaProducer

        p = KafkaProducer(
            {"bootstrap.servers": self.cluster.kafka_bootstrap, **KAFKA_PRODUCER_SETTINGS}
        )
        p.list_topics(TOPIC, timeout=60)
        t0, i = time.monotonic(), 0
        while not self.stop.is_set():
            ts = time.monotonic()

            def done(err: Any, _msg: Any, ts: float = ts) -> None:
                if err is None:
                    self._ack(ts)
                else:
                    self.errors.append(str(err))

            p.produce(
                TOPIC,
                b"kafka-%d" % i + os.urandom(self.pad),
                partition=i % self.partitions,
                on_delivery=done,
            )
            p.poll(0)
            i += 1
            self.sent = i
            self._pace(t0, i)
        left = p.flush(120)
        if left:
            self.errors.append(f"{left} records never delivered")

    def window(self, start: float, end: float) -> list[float]:
        with self._lock:
            return [b - a for a, b in self.acks if start <= a < end]

    def longest_gap(self, start: float, end: float) -> float:
        with self._lock:
            times = sorted(b for _, b in self.acks if start <= b <= end)
        return max((b - a for a, b in itertools.pairwise(times)), default=float("nan"))


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_job(cluster: LocalCluster, path: str) -> None:
    status, body = http_json("POST", cluster.coordinator_url + path, {})
    if status != 200:
        raise RuntimeError(f"{path}: {status} {body}")
    print(f"  {len(body['moves'])} moves planned", flush=True)
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        _, st = http_json("GET", cluster.coordinator_url + "/v1/cluster/moves")
        if not st["running"]:
            bad = [m for m in st["moves"] if m["state"] != "done"]
            if st["failure"] or bad:
                raise RuntimeError(f"{path}: {st['failure']} {bad[:3]}")
            return
        time.sleep(0.5)
    raise TimeoutError(path)


def throttled_bytes(cluster: LocalCluster) -> int:
    """Bytes the servers sent under the move throttle (their counters, summed)."""
    import urllib.request

    total = 0
    for svc in cluster.servers:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(svc.metrics_url + "/metrics", timeout=5) as r,
        ):
            for line in r.read().decode().splitlines():
                if line.startswith("pidlease_server_move_throttled_bytes_total "):
                    total += int(float(line.split()[1]))
    return total


def loads(cluster: LocalCluster, servers: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    _, body = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}?offsets=false")
    sts = body["partition_states"]
    reps = {("t", s["partition"]): s["replicas"] for s in sts}
    leads = {("t", s["partition"]): [s["leader"]] for s in sts}
    return replica_loads(reps, servers), leader_loads(leads, servers)


def report(
    name: str,
    loadz: list[Load],
    start: float,
    end: float,
    steady: list[float],
    steady_window: tuple[float, float],
) -> None:
    lat = [x for ld in loadz for x in ld.window(start, end)]
    gap = max(ld.longest_gap(start, end) for ld in loadz)
    print(
        f"  {name}: {end - start:.1f} s, {len(lat):,} records acked; ack latency p50 "
        f"{pct(lat, 0.5) * 1000:.0f} ms, p99 {pct(lat, 0.99) * 1000:.0f} ms, max "
        f"{max(lat, default=float('nan')) * 1000:.0f} ms (steady before: p50 "
        f"{pct(steady, 0.5) * 1000:.0f} ms, p99 {pct(steady, 0.99) * 1000:.0f} ms); longest "
        f"gap between acks {gap:.2f} s",
        flush=True,
    )
    for ld in loadz:
        mine = ld.window(start, end)
        base = ld.window(*steady_window)
        print(
            f"    {ld.kind}: p50 {pct(mine, 0.5) * 1000:.0f} ms, p99 {pct(mine, 0.99) * 1000:.0f} "
            f"ms, max {max(mine, default=float('nan')) * 1000:.0f} ms (steady: p50 "
            f"{pct(base, 0.5) * 1000:.0f} ms, p99 {pct(base, 0.99) * 1000:.0f} ms)",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", type=int, default=60)
    ap.add_argument("--rate", type=int, default=500, help="records/s per producer")
    ap.add_argument("--trace", action="store_true", help="log the SDK (DEBUG) to sdk.log")
    ap.add_argument("--record-bytes", type=int, default=16, help="about this many bytes each")
    ap.add_argument("--prefill-s", type=float, default=8.0, help="load before the steady phase")
    ap.add_argument(
        "--move-throttle",
        type=int,
        default=None,
        metavar="BYTES_PER_S",
        help="the servers' PIDLEASE_MOVE_FETCH_BYTES_PER_S (default: theirs; 0: none)",
    )
    ap.add_argument("--no-drain", action="store_true", help="stop after the rebalance")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-rebalance-"))
    if args.trace:
        import logging

        handler = logging.FileHandler(work / "sdk.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        sdk_log = logging.getLogger("pidlease.client")
        sdk_log.addHandler(handler)
        sdk_log.setLevel(logging.DEBUG)
        print(f"logs in {work}", flush=True)
    env = {"PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "10000"}
    if args.move_throttle is not None:
        env["PIDLEASE_MOVE_FETCH_BYTES_PER_S"] = str(args.move_throttle)
    pad = max(0, args.record_bytes - 10)
    print(
        f"partitions {args.partitions}, {args.rate} records/s per producer of ~"
        f"{args.record_bytes} bytes, move throttle "
        f"{'server default' if args.move_throttle is None else args.move_throttle} bytes/s",
        flush=True,
    )
    with LocalCluster(work, servers=3, env=env) as cluster:
        cluster.create_topic(TOPIC, partitions=args.partitions, replication_factor=3)
        time.sleep(2.0)
        loadz = [Load(k, cluster, args.partitions, args.rate, pad) for k in ("sdk", "kafka")]
        for ld in loadz:
            ld.start()
        time.sleep(args.prefill_s)
        t_steady = time.monotonic()
        time.sleep(5.0)
        steady_window = (t_steady, time.monotonic())
        steady = [x for ld in loadz for x in ld.window(*steady_window)]
        cluster.add_server(4, extra_env=env)
        print("rebalance onto server 4:", flush=True)
        t0 = time.monotonic()
        run_job(cluster, "/v1/cluster/rebalance")
        t1 = time.monotonic()
        report("rebalance", loadz, t0, t1, steady, steady_window)
        print(f"  sent under the move throttle: {throttled_bytes(cluster):,} bytes", flush=True)
        reps, leads = loads(cluster, [1, 2, 3, 4])
        print(f"  replicas per server {reps}, leaders {leads}", flush=True)
        if not args.no_drain:
            print("drain of server 2:", flush=True)
            run_job(cluster, "/v1/servers/2/drain")
            t2 = time.monotonic()
            report("drain", loadz, t1, t2, steady, steady_window)
            cluster.stop_service(cluster.server(2))
            reps, leads = loads(cluster, [1, 3, 4])
            print(f"  replicas per server {reps}, leaders {leads}; server 2 stopped", flush=True)
        time.sleep(3.0)
        for ld in loadz:
            ld.stop.set()
        for ld in loadz:
            ld.join(180)
        errors = [e for ld in loadz for e in ld.errors]
        sdk = loadz[0]
        unresolved = [f for f in sdk.futures if not f.done()]
        if unresolved:
            errors.append(f"{len(unresolved)} SDK sends never answered")
        acked = [
            (m.partition, sdk.pid, m.sequence_id)
            for m in (f.result(timeout=0) for f in sdk.futures if f.done() and not f.exception())
        ]
        audit = verify_topic(cluster.coordinator_url, TOPIC, acked=acked)
        total_acked = sum(len(ld.acks) for ld in loadz)
        print(audit.summary().splitlines()[-2] if audit.ok else audit.summary())
        print(
            f"records in the topic {audit.total('records'):,}, acked to the producers "
            f"{total_acked:,} (SDK {len(sdk.acks):,}, Kafka {len(loadz[1].acks):,}); "
            f"errors reaching a producer: {len(errors)} {errors[:3]}; steady p50 "
            f"{statistics.median(steady) * 1000:.0f} ms"
        )
        ok = audit.ok and not errors and audit.total("records") == total_acked
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
