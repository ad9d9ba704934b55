"""What replication costs an idle server, and the failover pause, against the partition
count (issue 24 items 2 and 3): one topic of P partitions, R=3 on three partition servers.

A fresh real cluster per P (``LocalCluster``: ZooKeeper, a coordinator, three servers as
processes). For each P, once every partition has a leader and a full in-sync set:

- **idle**: nothing produced; each server's CPU over ``--idle-s`` seconds (from /proc, all
  threads) and its open sockets (``socket:`` links in /proc/<pid>/fd);
- **failover** (``--failover``, needs a producer that starts on P partitions): one SDK
  producer writes one 100 B record to every partition, then the server leading most
  partitions is SIGKILLed and one record is sent to each partition it led; the first and
  the last ack after the kill.

    python bench/bench_idle_replication.py [--partitions 300,1000] [--idle-s 10]
        [--failover] [--session-timeout-ms N] [--json out.json]

The servers run the code of the current directory's tree (``python -m`` puts it first on
their path): to measure another tree, copy this file and ``procstats.py`` into it and run
it from there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procstats import cpu_seconds
from pidlease.testing.devcluster import LocalCluster, http_json

TOPIC = "wide"
VALUE = b"v" * 100


def wait_for(pred: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached within {timeout_s}s")


def states(cluster: LocalCluster) -> list[dict[str, Any]]:
    status, body = http_json(
        "GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}?offsets=false", timeout_s=60
    )
    return list(body["partition_states"]) if status == 200 else []


def settled(cluster: LocalCluster, n: int) -> bool:
    s = states(cluster)
    return len(s) == n and all(x["leader"] is not None and len(x.get("isr") or []) == 3 for x in s)


def sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return n


class Acks:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()

    def done(self, fut: Any) -> None:
        exc = fut.exception()
        with self._lock:
            (self.errors.append(exc) if exc is not None else self.times.append(time.monotonic()))

    def count(self) -> int:
        with self._lock:
            return len(self.times) + len(self.errors)


def send_all(p: Any, partitions: list[int], timeout_s: float) -> Acks:
    acks = Acks()
    for part in partitions:
        p.send(VALUE, partition=part).add_done_callback(acks.done)
    wait_for(lambda: acks.count() >= len(partitions), timeout_s, "every ack")
    return acks


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"partitions": n}
    work = Path(tempfile.mkdtemp(prefix=f"pidlease-bench-idle-{n}-"))
    env = {}
    if args.session_timeout_ms:
        env["PIDLEASE_ZK_SESSION_TIMEOUT_MS"] = str(args.session_timeout_ms)
    with LocalCluster(work, servers=3, kafka=False, env=env) as cluster:
        t = time.monotonic()
        cluster.create_topic(TOPIC, partitions=n, replication_factor=3)
        wait_for(lambda: settled(cluster, n), args.settle_timeout_s, "every in-sync set full")
        out["settle_s"] = round(time.monotonic() - t, 1)
        time.sleep(args.settle_s)
        procs = {s.ident: s.proc.pid for s in cluster.servers if s.proc is not None}
        cpu0 = {i: cpu_seconds(pid) for i, pid in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.idle_s)
        dt = time.monotonic() - t0
        out["idle_cpu_pct"] = {
            i: round(100 * (cpu_seconds(pid) - cpu0[i]) / dt, 1) for i, pid in procs.items()
        }
        out["sockets"] = {i: sockets(pid) for i, pid in procs.items()}
        out["load"] = [round(x, 1) for x in os.getloadavg()]
        if args.failover:
            try:
                out.update(failover(cluster, n, args))
            except Exception as exc:  # noqa: BLE001 - reported next to the idle figures
                out["failover_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def failover(cluster: LocalCluster, n: int, args: argparse.Namespace) -> dict[str, Any]:
    from pidlease.client.producer import Producer

    p = Producer(
        cluster.coordinator_url,
        topic=TOPIC,
        producer_name="bench-idle",
        start_timeout_ms=args.start_timeout_s * 1000,
    )
    try:
        send_all(p, list(range(n)), args.write_timeout_s)
        led: dict[int, list[int]] = {}
        for s in states(cluster):
            led.setdefault(int(s["leader"]), []).append(int(s["partition"]))
        victim = max(led, key=lambda k: len(led[k]))
        parts = led[victim]
        t_kill = time.monotonic()
        cluster.kill(cluster.server(victim))
        acks = send_all(p, parts, args.write_timeout_s)
        times = sorted(acks.times)
        res: dict[str, Any] = {"killed_led": len(parts), "failover_acked": len(times)}
        res["failover_errors"] = len(acks.errors)
        if times:
            res["failover_first_ack_s"] = round(times[0] - t_kill, 3)
            res["failover_last_ack_s"] = round(times[-1] - t_kill, 3)
        return res
    finally:
        p.close()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", default="300,1000")
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--settle-s", type=float, default=3.0, help="wait before the idle window")
    ap.add_argument("--settle-timeout-s", type=float, default=600.0)
    ap.add_argument("--failover", action="store_true")
    ap.add_argument("--start-timeout-s", type=int, default=120)
    ap.add_argument("--write-timeout-s", type=float, default=300.0)
    ap.add_argument(
        "--session-timeout-ms",
        type=int,
        default=0,
        help="PIDLEASE_ZK_SESSION_TIMEOUT_MS of the servers (0: their default, 1200); longer "
        "on a loaded machine, where late heartbeats end leases and leaderships churn",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.partitions.split(",")):
        try:
            r = measure(n, args)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            r = {"partitions": n, "error": f"{type(exc).__name__}: {exc}"[:300]}
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
