"""What many partitions cost (issue 24): P partitions, R=3 on three partition servers, in one
topic or spread over ``--topics`` N topics of P/N partitions each, measured as a new user of
the SDK would see it.

A fresh real cluster per P (``LocalCluster``: ZooKeeper, one coordinator, three partition
servers as processes, no Kafka listener). For each P:

- **create**: the N topics created (``POST /v1/topics``, at most ``--workers`` at once from a
  thread pool) until every partition of every topic has a leader in ZooKeeper;
- **first write to all**: from constructing the producers until one 100 B record sent to
  every partition is acked; ``lease`` is the constructors' share (until the last producer
  has leased its PID on all of its partitions). The SDK's ``Producer`` writes to one topic,
  so there is one ``Producer`` per topic (N of them, each with its own event-loop thread and
  connections, as N applications' producers would have), constructed at most ``--workers``
  at once from a thread pool; each worker sends its topic's records as soon as its producer
  has started, so leases and writes of different topics overlap;
- **idle**: with the producers still open and sending nothing, each server's CPU over
  ``--idle-s`` seconds (from /proc, all threads), its resident memory (VmRSS) and open
  sockets (``socket:`` links in /proc/<pid>/fd); ZooKeeper's packets received per second
  over the same window (``mntr``'s ``zk_packets_received``, the four-letter words are on in
  the project's ZooKeeper);
- **takeover**: the producers closed and new ones started with the same names (a takeover:
  every partition fenced before the lease answers), until a record sent to every partition
  is acked (``takeover_lease_s`` is the constructors' share; ``--no-takeover`` skips it);
- **failover**: SIGKILL the server leading most partitions, send one record to each
  partition it led with the same producers; the first and the last ack after the kill
  (``--no-failover`` skips it);
- **controlled shutdown**: after the failover the killed server is restarted and, once it is
  back in every partition's in-sync set and the preferred-leader election has moved its
  leaderships back (or ``--catchup-timeout-s`` passed: noted), the server leading most partitions
  gets a SIGTERM (partition_server/handoff.py hands what it leads to in-sync followers
  before it leaves); one record is sent to each partition it led with the same producers;
  the first and last ack after the SIGTERM, how long the server took to exit, and how many
  partitions it handed over and kept (its log line "controlled shutdown: N partition(s)
  handed over, K kept", the only place the count is published). Without the failover the
  SIGTERM meets the cluster as it is. ``--no-shutdown`` skips it.

    python bench/bench_partitions.py [--partitions 10,100,1000] [--topics 1] [--idle-s 5]
        [--json out.json]
    python bench/bench_partitions.py --partitions 3000 --topics 1000   # 1000 topics x 3

P in {10, 100, 1000, 3000, 10000}: ``--partitions 10,100,1000,3000,10000`` (the default is
the short form 10,100,1000). Each P must be a multiple of ``--topics``. A P whose producers
do not start is reported with its error and the run goes on to the next P; so is one whose
cluster does not settle (a leader for every partition within ``--settle-timeout-s``).
``bench/plot_partitions.py`` draws the ``--json`` output against P.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procstats import cpu_seconds
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, Service, http_json
from pidlease.testing.zkserver import four_letter

TOPIC = "wide"
VALUE = b"v" * 100
Key = tuple[str, int]  # (topic, partition)


def layout(partitions: int, topics: int) -> list[tuple[str, int]]:
    """The topics of one run, (name, partitions): one topic ``wide`` of P partitions, or N
    topics ``wide-0000``... of P/N partitions each."""
    if topics < 1 or partitions < 1:
        raise ValueError("partitions and topics must be at least 1")
    if partitions % topics:
        raise ValueError(f"{partitions} partitions do not split evenly over {topics} topics")
    if topics == 1:
        return [(TOPIC, partitions)]
    width = len(str(topics - 1))
    return [(f"{TOPIC}-{i:0{width}d}", partitions // topics) for i in range(topics)]


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(f"{what} not reached within {timeout_s}s")


def topic_states(cluster: LocalCluster, topic: str) -> list[dict[str, Any]]:
    status, body = http_json(
        "GET", f"{cluster.coordinator_url}/v1/topics/{topic}?offsets=false", timeout_s=60
    )
    if status != 200:
        return []
    return list(body["partition_states"])


def states(
    cluster: LocalCluster, topics: Iterable[str], pool: concurrent.futures.Executor
) -> dict[str, list[dict[str, Any]]]:
    """Every topic's partition states from ZooKeeper (one describe per topic, from the
    pool): topic -> its partitions' states ([] when the describe failed)."""
    names = list(topics)
    return dict(zip(names, pool.map(lambda t: topic_states(cluster, t), names), strict=True))


def wait_all(
    cluster: LocalCluster,
    topics: list[tuple[str, int]],
    pool: concurrent.futures.Executor,
    ok: Callable[[dict[str, Any]], bool],
    timeout_s: float,
    what: str,
) -> None:
    """Until ``ok`` holds for every partition of every topic; topics found done are not
    asked again."""
    left = dict(topics)
    deadline = time.monotonic() + timeout_s
    while left:
        for t, st in states(cluster, left, pool).items():
            if len(st) == left[t] and all(ok(s) for s in st):
                del left[t]
        if not left:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {len(left)} topic(s) not there within {timeout_s}s")
        time.sleep(0.2)


def leaders(
    cluster: LocalCluster, topics: list[tuple[str, int]], pool: concurrent.futures.Executor
) -> dict[int, list[Key]]:
    """Server -> the partitions it leads."""
    led: dict[int, list[Key]] = {}
    for t, st in states(cluster, (t for t, _ in topics), pool).items():
        for s in st:
            if s["leader"] is not None:
                led.setdefault(int(s["leader"]), []).append((t, int(s["partition"])))
    return led


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


HANDED_OVER = re.compile(
    r"controlled shutdown: (\d+) partition\(s\) handed over, (\d+) kept", re.MULTILINE
)


def handed_over(log_text: str) -> tuple[int, int] | None:
    """The last "controlled shutdown: N partition(s) handed over, K kept" in a server's
    log: (N, K), or None when it has none."""
    found = HANDED_OVER.findall(log_text)
    if not found:
        return None
    n, k = found[-1]
    return int(n), int(k)


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


def send(producers: dict[str, Producer], parts: Iterable[Key], acks: Acks) -> int:
    n = 0
    for topic, part in parts:
        producers[topic].send(VALUE, partition=part).add_done_callback(acks.done)
        n += 1
    return n


def send_all(producers: dict[str, Producer], parts: list[Key], timeout_s: float) -> Acks:
    acks = Acks()
    n = send(producers, parts, acks)
    wait_for(lambda: acks.count() >= n, timeout_s, "every ack")
    return acks


def start_and_write(
    cluster: LocalCluster,
    topics: list[tuple[str, int]],
    pool: concurrent.futures.Executor,
    args: argparse.Namespace,
) -> tuple[dict[str, Producer], float, Acks]:
    """Construct one producer per topic (from the pool), each sending one record to every
    partition of its topic once it has started; returns the producers, the time the last
    one started (from the call) and the acks (not waited for). A producer that does not
    start: the others are closed and the error raised."""
    acks = Acks()
    t0 = time.monotonic()

    def one(topic: str, n: int) -> tuple[str, Producer, float]:
        p = Producer(
            cluster.coordinator_url,
            topic=topic,
            producer_name=f"bench-partitions-{topic}",
            start_timeout_ms=args.start_timeout_s * 1000,
        )
        started = time.monotonic()
        send({topic: p}, ((topic, i) for i in range(n)), acks)
        return topic, p, started

    futs = [pool.submit(one, t, n) for t, n in topics]
    producers: dict[str, Producer] = {}
    last = t0
    error: BaseException | None = None
    for f in futs:
        try:
            topic, p, started = f.result()
        except Exception as exc:  # noqa: BLE001 - the first is raised below, after cleanup
            error = error or exc
            continue
        producers[topic] = p
        last = max(last, started)
    if error is not None:
        close_all(producers, pool)
        raise error
    return producers, last - t0, acks


def close_all(producers: dict[str, Producer], pool: concurrent.futures.Executor) -> None:
    for f in [pool.submit(p.close) for p in producers.values()]:
        with contextlib.suppress(Exception):
            f.result()
    producers.clear()


def first_last(acks: Acks, t: float) -> dict[str, Any]:
    times = sorted(acks.times)
    if not times:
        return {}
    return {"first_ack_s": round(times[0] - t, 3), "last_ack_s": round(times[-1] - t, 3)}


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    topics = layout(n, args.topics)
    out: dict[str, Any] = {"partitions": n, "topics": len(topics)}
    work = Path(tempfile.mkdtemp(prefix=f"pidlease-bench-partitions-{n}-"))
    env = {}
    if args.controlled_shutdown_timeout_ms is not None:
        env["PIDLEASE_CONTROLLED_SHUTDOWN_TIMEOUT_MS"] = str(args.controlled_shutdown_timeout_ms)
    with (
        LocalCluster(work, servers=3, kafka=False, env=env) as cluster,
        concurrent.futures.ThreadPoolExecutor(args.workers) as pool,
    ):
        t = time.monotonic()

        # (not cluster.create_topic: its HTTP timeout is too short for 10,000 partitions
        # on a loaded machine, where the P=10,000 run stopped before it began)
        def create(topic: str, parts: int) -> None:
            status, body = http_json(
                "POST",
                cluster.coordinator_url + "/v1/topics",
                {"name": topic, "partitions": parts, "replication_factor": 3},
                timeout_s=args.start_timeout_s,
            )
            if status != 200:
                raise RuntimeError(f"create topic {topic}: {status} {body}")

        for f in [pool.submit(create, tp, k) for tp, k in topics]:
            f.result()
        wait_all(
            cluster,
            topics,
            pool,
            lambda s: s["leader"] is not None,
            args.settle_timeout_s,
            "a leader for every partition",
        )
        out["create_s"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        try:
            producers, lease_s, acks = start_and_write(cluster, topics, pool, args)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out["error"] = f"producer did not start: {type(exc).__name__}: {exc}"[:300]
            print(f"P={n}: {out['error']}", flush=True)
            return out
        try:
            out["lease_s"] = round(lease_s, 3)
            wait_for(lambda: acks.count() >= n, args.write_timeout_s, "every ack")
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
                close_all(producers, pool)
                t = time.monotonic()
                producers, lease_s, acks = start_and_write(cluster, topics, pool, args)
                out["takeover_lease_s"] = round(lease_s, 3)
                wait_for(lambda: acks.count() >= n, args.write_timeout_s, "every ack")
                out["takeover_write_all_s"] = round(time.monotonic() - t, 3)
            killed = None
            if not args.no_failover:
                killed = failover(cluster, topics, producers, pool, args, out)
            if not args.no_shutdown:
                shutdown(cluster, topics, producers, pool, args, out, killed)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out["error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"P={n}: {out['error']}", flush=True)
        finally:
            close_all(producers, pool)
    return out


def failover(
    cluster: LocalCluster,
    topics: list[tuple[str, int]],
    producers: dict[str, Producer],
    pool: concurrent.futures.Executor,
    args: argparse.Namespace,
    out: dict[str, Any],
) -> Service:
    """SIGKILL the server leading most partitions; one record to each partition it led.
    Returns the killed server."""
    led = leaders(cluster, topics, pool)
    victim = max(led, key=lambda k: len(led[k]))
    parts = led[victim]
    svc = cluster.server(victim)
    t_kill = time.monotonic()
    cluster.kill(svc)
    acks = send_all(producers, parts, args.write_timeout_s)
    out["killed_led"] = len(parts)
    out["failover_acked"] = len(acks.times)
    out["failover_errors"] = len(acks.errors)
    out.update({f"failover_{k}": v for k, v in first_last(acks, t_kill).items()})
    return svc


def shutdown(
    cluster: LocalCluster,
    topics: list[tuple[str, int]],
    producers: dict[str, Producer],
    pool: concurrent.futures.Executor,
    args: argparse.Namespace,
    out: dict[str, Any],
    killed: Service | None,
) -> None:
    """SIGTERM the server leading most partitions (after restarting ``killed`` and letting
    it catch up); one record to each partition it led."""
    if killed is not None:
        t = time.monotonic()
        cluster.start_service(killed, timeout_s=args.start_timeout_s)
        # Not in sync in time: the SIGTERM still goes (each partition the victim leads has
        # its other follower in sync), the note says so.
        try:
            wait_all(
                cluster,
                topics,
                pool,
                lambda s: set(s["replicas"]) <= set(s["isr"]),
                args.catchup_timeout_s,
                "every replica back in sync",
            )
            out["restart_in_sync_s"] = round(time.monotonic() - t, 3)
        except TimeoutError as exc:
            out["shutdown_note"] = f"restarted server: {exc}"
        # The preferred-leader election hands the restarted server's leaderships back; let
        # that land (its pauses are not the shutdown's). Not reaching it is no failure.
        with contextlib.suppress(TimeoutError):
            wait_all(
                cluster,
                topics,
                pool,
                lambda s: s["leader"] == s["replicas"][0],
                args.catchup_timeout_s,
                "leadership back on the preferred replicas",
            )
        time.sleep(args.settle_s)
    led = leaders(cluster, topics, pool)
    victim = max(led, key=lambda k: len(led[k]))
    parts = led[victim]
    svc = cluster.server(victim)
    assert svc.proc is not None
    proc = svc.proc
    t_term = time.monotonic()
    cluster.signal_service(svc, signal.SIGTERM)
    acks = send_all(producers, parts, args.write_timeout_s)
    out["stopped_led"] = len(parts)
    out["shutdown_acked"] = len(acks.times)
    out["shutdown_errors"] = len(acks.errors)
    out.update({f"shutdown_{k}": v for k, v in first_last(acks, t_term).items()})
    with contextlib.suppress(Exception):
        proc.wait(args.write_timeout_s)
        out["shutdown_exit_s"] = round(time.monotonic() - t_term, 3)
    if proc.poll() is None:  # still there: do not leave it to the cluster's stop
        cluster.kill(svc)
    svc.proc = None
    counts = handed_over(svc.log_path.read_text(errors="replace"))
    if counts is not None:
        out["handed_over"], out["kept"] = counts


# -- the report -----------------------------------------------------------------------------

HEADER = (
    "| P | create | first write to all (lease) | idle CPU per server | RSS per server | "
    "sockets per server | ZooKeeper packets/s idle | takeover: write to all (lease) | "
    "killed leader's partitions acked again (after the kill) | "
    "SIGTERMed leader's partitions acked again (after the SIGTERM); handed over |\n"
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def p_label(r: dict[str, Any]) -> str:
    n, k = r["partitions"], r.get("topics", 1)
    return str(n) if k == 1 else f"{n} ({k} x {n // k})"


def show(r: dict[str, Any]) -> str:
    """One row of the table; a run that stopped early shows its error in place of the
    figures it did not reach."""
    if "first_write_all_s" not in r:
        return f"| {p_label(r)} | {r.get('create_s', '-')} | {r.get('error')} |"

    def spread(d: dict[Any, Any]) -> str:
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
    sd = "-"
    if "shutdown_last_ack_s" in r:
        sd = (
            f"{r['shutdown_acked']} of {r['stopped_led']}: first {r['shutdown_first_ack_s']} "
            f"s, last {r['shutdown_last_ack_s']} s; "
        )
        sd += (
            f"{r['handed_over']} handed over, {r['kept']} kept"
            if "handed_over" in r
            else "handed over: not logged"
        )
        if "shutdown_note" in r:
            sd += f" ({r['shutdown_note']})"
    row = (
        f"| {p_label(r)} | {r['create_s']} s | {r['first_write_all_s']} s "
        f"(lease {r['lease_s']} s) | {spread(r['idle_cpu_pct'])} % | "
        f"{spread(r['rss_mb'])} MB | {spread(r['sockets'])} | "
        f"{r.get('zk_packets_per_s', '-')} | {tk} | {fo} | {sd} |"
    )
    if "error" in r:
        row += f" error: {r['error']}"
    return row


def table(results: list[dict[str, Any]]) -> str:
    return "\n".join([HEADER, *(show(r) for r in results)])


def parse_partitions(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"partition counts must be >= 1: {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--partitions",
        type=parse_partitions,
        default=[10, 100, 1000],
        help="comma-separated P values, one fresh cluster each (default 10,100,1000)",
    )
    ap.add_argument(
        "--topics",
        type=int,
        default=1,
        help="spread each P over this many topics of P/N partitions (default 1; "
        "e.g. --partitions 3000 --topics 1000: 1000 topics x 3)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=16,
        help="threads creating topics, starting producers and describing topics at once "
        "(default 16)",
    )
    ap.add_argument(
        "--idle-s", type=float, default=5.0, help="idle measuring window, seconds (default 5)"
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=2.0,
        help="wait before the idle window and before the SIGTERM (default 2)",
    )
    ap.add_argument(
        "--settle-timeout-s",
        type=float,
        default=300.0,
        help="how long the new topics may take to have a leader everywhere (default 300)",
    )
    ap.add_argument(
        "--start-timeout-s",
        type=int,
        default=120,
        help="each producer's start timeout, the topic creation and server restart "
        "timeouts (default 120)",
    )
    ap.add_argument(
        "--write-timeout-s",
        type=float,
        default=300.0,
        help="how long a round of one record per partition may take to be acked (default 300)",
    )
    ap.add_argument(
        "--catchup-timeout-s",
        type=float,
        default=300.0,
        help="before the SIGTERM: how long the killed server, restarted, may take to be "
        "back in every in-sync set, then to get its leaderships back (default 300)",
    )
    ap.add_argument(
        "--controlled-shutdown-timeout-ms",
        type=int,
        default=None,
        help="the servers' PIDLEASE_CONTROLLED_SHUTDOWN_TIMEOUT_MS (default: the servers')",
    )
    ap.add_argument(
        "--no-takeover", action="store_true", help="skip the restart of the producers by name"
    )
    ap.add_argument("--no-failover", action="store_true", help="skip the SIGKILL of a leader")
    ap.add_argument(
        "--no-shutdown", action="store_true", help="skip the SIGTERM (controlled shutdown)"
    )
    ap.add_argument("--json", type=Path, help="write the results (a list, one dict per P) here")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.topics < 1 or args.workers < 1:
        ap.error("--topics and --workers must be at least 1")
    for n in args.partitions:
        if n % args.topics:
            ap.error(f"--partitions {n} is not a multiple of --topics {args.topics}")
    results = []
    for n in args.partitions:
        try:
            r = measure(n, args)
        except Exception as exc:  # noqa: BLE001 - e.g. the cluster never settled: reported
            r = {"partitions": n, "topics": args.topics}
            r["error"] = f"{type(exc).__name__}: {exc}"[:300]
        results.append(r)
        print(json.dumps(r), flush=True)
    print()
    print(table(results))
    print(f"\nload average at the end: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
