"""What a topic of many partitions costs (issue 24): one topic of P partitions, R=3 on three
partition servers, one SDK producer, measured as a new user would see it.

A fresh real cluster per P (``LocalCluster``: ZooKeeper, one coordinator, three partition
servers as processes). For each P:

- **create**: ``POST /v1/topics`` until every partition has a leader in ZooKeeper;
- **first write to all**: from constructing one ``Producer`` (which leases the PID on every
  partition) until one 100 B record sent to every partition is acked; ``lease`` is the
  constructor's share;
- **idle**: with the producer still open and sending nothing, each server's CPU over
  ``--idle-s`` seconds (from /proc, all threads), its resident memory (VmRSS) and open
  sockets (``socket:`` links in /proc/<pid>/fd); ZooKeeper's packets received per second
  over the same window (``mntr``'s ``zk_packets_received``, the four-letter words are on in
  the project's ZooKeeper);
- **takeover**: the producer closed and a new one started with the same name (a takeover:
  every partition fenced before the lease answers), until a record sent to every partition
  is acked (``takeover_lease_s`` is the constructor's share; ``--no-takeover`` skips it);
- **failover**: SIGKILL the server leading most partitions, send one record to each
  partition it led with the same producer; the first and the last ack after the kill
  (``--no-failover`` skips it).

    python bench/bench_partitions.py [--partitions 10,100,1000] [--idle-s 5] [--json out.json]

P in {10, 100, 1000, 3000, 10000}: ``--partitions 10,100,1000,3000,10000`` (the default is
the short form 10,100,1000). A P whose producer does not start is reported with its error
and the run goes on to the next P; so is one whose cluster does not settle (a leader for every
partition within 300 s).
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
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.zkserver import four_letter

TOPIC = "wide"
VALUE = b"v" * 100


def wait_for(pred: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(f"{what} not reached within {timeout_s}s")


def states(cluster: LocalCluster) -> list[dict[str, Any]]:
    status, body = http_json(
        "GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}?offsets=false", timeout_s=60
    )
    if status != 200:
        return []
    return list(body["partition_states"])


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            continue
    return n


def zk_packets_received(cluster: LocalCluster) -> int | None:
    if cluster.zk is None:
        return None
    try:
        out = four_letter("127.0.0.1", cluster.zk.nodes[0].client_port, "mntr")
    except OSError:
        return None
    for line in out.splitlines():
        k, _, v = line.partition("\t")
        if k == "zk_packets_received":
            return int(v)
    return None


class Acks:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()

    def done(self, fut: Any) -> None:
        exc = fut.exception()
        with self._lock:
            if exc is None:
                self.times.append(time.monotonic())
            else:
                self.errors.append(exc)

    def count(self) -> int:
        with self._lock:
            return len(self.times) + len(self.errors)


def send_all(p: Producer, partitions: list[int], timeout_s: float) -> Acks:
    acks = Acks()
    for part in partitions:
        p.send(VALUE, partition=part).add_done_callback(acks.done)
    wait_for(lambda: acks.count() >= len(partitions), timeout_s, "every ack")
    return acks


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"partitions": n}
    work = Path(tempfile.mkdtemp(prefix=f"pidlease-bench-partitions-{n}-"))
    with LocalCluster(work, servers=3, kafka=False) as cluster:
        t = time.monotonic()
        # (not cluster.create_topic: its HTTP timeout is too short for 10,000 partitions
        # on a loaded machine, where the P=10,000 run stopped before it began)
        status, body = http_json(
            "POST",
            cluster.coordinator_url + "/v1/topics",
            {"name": TOPIC, "partitions": n, "replication_factor": 3},
            timeout_s=args.start_timeout_s,
        )
        if status != 200:
            raise RuntimeError(f"create topic: {status} {body}")
        wait_for(
            lambda: (s := states(cluster)) and all(x["leader"] is not None for x in s),
            300,
            "a leader for every partition",
        )
        out["create_s"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        try:
            p = Producer(
                cluster.coordinator_url,
                topic=TOPIC,
                producer_name="bench-partitions",
                start_timeout_ms=args.start_timeout_s * 1000,
            )
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out["error"] = f"producer did not start: {type(exc).__name__}: {exc}"[:300]
            print(f"P={n}: {out['error']}", flush=True)
            return out
        try:
            out["lease_s"] = round(time.monotonic() - t, 3)
            acks = send_all(p, list(range(n)), args.write_timeout_s)
            out["first_write_all_s"] = round(time.monotonic() - t, 3)
            out["first_write_errors"] = len(acks.errors)
            time.sleep(args.settle_s)
            procs = {s.ident: s.proc.pid for s in cluster.servers if s.proc is not None}
            cpu0 = {i: cpu_seconds(pid) for i, pid in procs.items()}
            zk0, z0 = zk_packets_received(cluster), time.monotonic()
            time.sleep(args.idle_s)
            zk1, z1 = zk_packets_received(cluster), time.monotonic()
            out["idle_cpu_pct"] = {
                i: round(100 * (cpu_seconds(pid) - cpu0[i]) / (z1 - z0), 1)
                for i, pid in procs.items()
            }
            out["rss_mb"] = {i: round(rss_bytes(pid) / 2**20, 1) for i, pid in procs.items()}
            out["sockets"] = {i: sockets(pid) for i, pid in procs.items()}
            if zk0 is not None and zk1 is not None:
                out["zk_packets_per_s"] = round((zk1 - zk0) / (z1 - z0), 1)
            if not args.no_takeover:
                p.close()
                t = time.monotonic()
                p = Producer(
                    cluster.coordinator_url,
                    topic=TOPIC,
                    producer_name="bench-partitions",
                    start_timeout_ms=args.start_timeout_s * 1000,
                )
                out["takeover_lease_s"] = round(time.monotonic() - t, 3)
                send_all(p, list(range(n)), args.write_timeout_s)
                out["takeover_write_all_s"] = round(time.monotonic() - t, 3)
            if not args.no_failover:
                out.update(failover(cluster, p, args))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out["error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"P={n}: {out['error']}", flush=True)
        finally:
            p.close()
    return out


def failover(cluster: LocalCluster, p: Producer, args: argparse.Namespace) -> dict[str, Any]:
    led: dict[int, list[int]] = {}
    for s in states(cluster):
        led.setdefault(int(s["leader"]), []).append(int(s["partition"]))
    victim = max(led, key=lambda k: len(led[k]))
    parts = led[victim]
    t_kill = time.monotonic()
    cluster.kill(cluster.server(victim))
    acks = send_all(p, parts, args.write_timeout_s)
    times = sorted(acks.times)
    res: dict[str, Any] = {
        "killed_led": len(parts),
        "failover_acked": len(times),
        "failover_errors": len(acks.errors),
    }
    if times:
        res["failover_first_ack_s"] = round(times[0] - t_kill, 3)
        res["failover_last_ack_s"] = round(times[-1] - t_kill, 3)
    return res


def show(r: dict[str, Any]) -> str:
    if "first_write_all_s" not in r:
        return f"| {r['partitions']} | {r.get('create_s', '')} | {r.get('error')} |"

    def spread(d: dict[int, Any]) -> str:
        return " / ".join(str(d[k]) for k in sorted(d))

    tk = (
        f"{r['takeover_write_all_s']} s (lease {r['takeover_lease_s']} s)"
        if "takeover_write_all_s" in r
        else "-"
    )
    fo = (
        f"{r['failover_acked']} of {r['killed_led']}: first {r['failover_first_ack_s']} s, "
        f"last {r['failover_last_ack_s']} s"
        if "failover_last_ack_s" in r
        else "-"
    )
    return (
        f"| {r['partitions']} | {r['create_s']} s | {r['first_write_all_s']} s "
        f"(lease {r['lease_s']} s) | {spread(r['idle_cpu_pct'])} % | "
        f"{spread(r['rss_mb'])} MB | {spread(r['sockets'])} | "
        f"{r.get('zk_packets_per_s', '-')} | {tk} | {fo} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", default="10,100,1000", help="comma-separated P values")
    ap.add_argument("--idle-s", type=float, default=5.0, help="idle measuring window")
    ap.add_argument("--settle-s", type=float, default=2.0, help="wait before the idle window")
    ap.add_argument("--start-timeout-s", type=int, default=120, help="producer start timeout")
    ap.add_argument("--write-timeout-s", type=float, default=300.0)
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument(
        "--no-takeover", action="store_true", help="skip the restart of the producer by name"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.partitions.split(",")):
        try:
            r = measure(n, args)
        except Exception as exc:  # noqa: BLE001 - e.g. the cluster never settled: reported
            r = {"partitions": n, "error": f"{type(exc).__name__}: {exc}"[:300]}
        results.append(r)
        print(json.dumps(r), flush=True)
    print(
        "\n| P | create | first write to all | idle CPU per server | RSS per server | "
        "sockets per server | ZooKeeper packets/s idle | takeover: write to all | killed "
        "leader's partitions acked again (after the kill) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(show(r))
    print(f"\nload average at the end: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
