"""Recovery figures of the partition server.

1. replay rate: a partition log written on disk, reopened with no snapshot (every batch
   checksummed, validated and replayed into producer state): batches/s and MB/s.
2. recovery time vs snapshot interval: real servers (ZooKeeper + one partition server)
   with ``PIDLEASE_SNAPSHOT_INTERVAL_BATCHES`` set to each interval, fed the same load over
   the protocol, SIGKILLed, restarted; the server's own recovery figures (METADATA).
3. memory per tracked PID (tracemalloc) at 100k and 1M PIDs, with 1 and K=5 batches kept.
4. snapshots of 100k and 1M PIDs: chunked capture (total, longest event-loop stall),
   file size, and the load time a recovery pays (decode + rebuild the table).

    .venv/bin/python bench/bench_recovery.py [--skip-servers] [--replay-batches 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import struct
import sys
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

from partition_server.flusher import Flusher
from partition_server.log import PartitionLog
from partition_server.partition import Partition
from partition_server.producer_state import ProducerStateTable
from partition_server.snapshot import PartitionImage, Snapshot, decode, encode
from pidlease.testing.devcluster import DEV_SECRET, LocalCluster
from pidlease.testing.wire import WireClient, create_topic, token
from pidlease.wire import protocol as P

_TAIL = struct.Struct(">BQIqIq")


def make_batch(pid: int, gen: int, seq: int, body: bytes, count: int) -> bytes:
    tail = _TAIL.pack(0, pid, gen, seq, count, 1) + body
    return struct.pack(">qII", 0, len(tail) + 4, zlib.crc32(tail)) + tail


def body_of(count: int, value_bytes: int) -> bytes:
    return (struct.pack(">iI", -1, value_bytes) + b"v" * value_bytes) * count


# -- 1. replay rate ------------------------------------------------------------------------
def replay_rate(batches: int, records: int, pids: int) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="pidlease-bench-replay-"))
    lg, _ = PartitionLog.open(base / "t-0", 64 * 1024 * 1024)
    body = body_of(records, 100)
    seqs = [0] * pids
    for i in range(batches):
        pid = 1 + i % pids
        b = bytearray(make_batch(pid, 0, seqs[pid - 1], body, records))
        seqs[pid - 1] += records
        P.set_base_offset(b, lg.next_offset)
        lg.append(b, records)
    size = lg.size_bytes
    lg.close()

    async def recover() -> tuple[float, int, int]:
        t0 = time.perf_counter()
        part, _, replayed = Partition.recover(
            base,
            "t",
            0,
            mode="strict",
            segment_bytes_max=64 * 1024 * 1024,
            batches_kept=5,
            pids_max=10_000_000,
            flusher=Flusher(mode="interval", interval_ms=2),
            clock_ms=lambda: 0,
        )
        secs = time.perf_counter() - t0
        n = len(part.state)
        part.close()
        return secs, replayed, n

    secs, replayed, tracked = asyncio.run(recover())
    return {
        "batches": replayed,
        "records_per_batch": records,
        "log_mb": round(size / 1e6, 1),
        "pids": tracked,
        "seconds": round(secs, 3),
        "batches_per_s": round(replayed / secs),
        "mb_per_s": round(size / 1e6 / secs, 1),
    }


# -- 2. recovery time vs snapshot interval -------------------------------------------------
def feed(address: str, topic: str, batches: int, pids: int, records: int, window: int = 64) -> None:
    body = body_of(records, 100)
    toks = {pid: token(DEV_SECRET, pid, 0) for pid in range(1, pids + 1)}
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    sent = recvd = 0
    try:
        while recvd < batches:
            out = []
            while sent < batches and sent - recvd < window:
                pid = 1 + sent % pids
                seq = (sent // pids) * records
                out.append(
                    P.produce_request(
                        sent + 1, topic, 0, toks[pid], make_batch(pid, 0, seq, body, records)
                    )
                )
                sent += 1
            if out:
                sock.sendall(b"".join(out))
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed")
            buf += chunk
            while len(buf) >= 4:
                (n,) = struct.unpack_from(">I", buf)
                if len(buf) < 4 + n:
                    break
                code = struct.unpack_from(">H", buf, 8)[0]
                if code != 0:
                    raise RuntimeError(f"produce failed with code {code}")
                del buf[: 4 + n]
                recvd += 1
    finally:
        sock.close()


def recovery_vs_interval(
    intervals: list[int], batches: int, pids: int, records: int
) -> list[dict[str, object]]:
    out = []
    for interval in intervals:
        base = Path(tempfile.mkdtemp(prefix="pidlease-bench-recovery-"))
        env = {
            "PIDLEASE_SNAPSHOT_INTERVAL_BATCHES": str(interval),
            "PIDLEASE_SNAPSHOT_INTERVAL_MS": str(3_600_000),
        }
        with LocalCluster(base, servers=1, coordinators=0, env=env) as cluster:
            create_topic(cluster.zk_hosts, "rec")
            svc = cluster.servers[0]
            with WireClient(svc.address) as c:  # topic discovery
                c.metadata()
                c.produce(
                    "rec",
                    0,
                    P.encode_batch(
                        [(None, b"w")], pid=0, generation=0, base_sequence=0, timestamp_ms=1
                    ),
                )
            t0 = time.perf_counter()
            feed(svc.address, "rec", batches, pids, records)
            feed_s = time.perf_counter() - t0
            time.sleep(0.5)  # let a snapshot that is being written finish (or not: either is valid)
            cluster.kill(svc)
            t0 = time.perf_counter()
            cluster.start_service(svc)
            listen_s = time.perf_counter() - t0
            with WireClient(svc.address) as c:
                rec = c.metadata()["recovery"]
        row = {
            "snapshot_interval_batches": interval,
            "log_batches": rec["batches"],
            "batches_replayed": rec["batches_replayed"],
            "snapshot": rec["snapshot"],
            "tracked_pids": rec["tracked_pids"],
            "recovery_s": rec["seconds"],
            "snapshot_load_s": rec["snapshot_load_s"],
            "restart_to_listening_s": round(listen_s, 2),
            "feed_s": round(feed_s, 2),
        }
        print(
            f"  interval {interval:>7}: replayed {rec['batches_replayed']:>7} of "
            f"{rec['batches']} batches, recovery {rec['seconds']:.3f}s "
            f"(snapshot load {rec['snapshot_load_s']:.3f}s), restart to listening "
            f"{listen_s:.2f}s"
        )
        out.append(row)
    return out


# -- 3. memory per tracked PID -------------------------------------------------------------
def memory_per_pid(n: int, batches_each: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t = ProducerStateTable(mode="strict", batches_kept=5, pids_max=10_000_000)
    now = 1_700_000_000_000
    offset = 0
    for pid in range(1, n + 1):
        for b in range(batches_each):
            t.apply_append(pid, 123456, b * 100, 100, offset, now + pid, durable=True)
            offset += 100
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(t) == n
    per = (after - before) / n
    del t
    gc.collect()
    return per


# -- 4. snapshot cost at scale -------------------------------------------------------------
def snapshot_cost(n: int) -> dict[str, float]:
    t = ProducerStateTable(mode="strict", batches_kept=5, pids_max=10_000_000)
    for pid in range(1, n + 1):
        t.apply_append(pid, 77, 0, 10, pid * 10, 1_700_000_000_000, durable=True)
    gc.collect()
    # the same chunking Partition.capture uses (20k PIDs, GC paused)
    pids = t.pids()
    rows: list = []  # type: ignore[type-arg]
    worst = 0.0
    gc.disable()
    t0 = time.perf_counter()
    for i in range(0, len(pids), 20_000):
        a = time.perf_counter()
        rows.extend(t.export_rows(pids[i : i + 20_000]))
        worst = max(worst, time.perf_counter() - a)
    capture_s = time.perf_counter() - t0
    gc.enable()
    t0 = time.perf_counter()
    raw = encode(Snapshot(1, {("t", 0): PartitionImage(0, n * 10, rows)}))
    encode_s = time.perf_counter() - t0
    del rows
    gc.disable()
    t0 = time.perf_counter()
    snap = decode(raw)
    u = ProducerStateTable(mode="strict", batches_kept=5, pids_max=10_000_000)
    u.load_rows(snap.partitions[("t", 0)].rows)
    load_s = time.perf_counter() - t0
    gc.enable()
    assert len(u) == n
    return {
        "pids": n,
        "capture_s": round(capture_s, 3),
        "longest_stall_ms": round(worst * 1000, 1),
        "encode_s": round(encode_s, 3),
        "file_mb": round(len(raw) / 1e6, 1),
        "load_s": round(load_s, 3),
    }


def memory_table(skip_1m: bool) -> dict[str, int]:
    print("3. memory per tracked PID (tracemalloc)")
    mem = {}
    for n in (100_000, 1_000_000):
        if n == 1_000_000 and skip_1m:
            continue
        for k in (1, 5):
            per = memory_per_pid(n, k)
            mem[f"{n}_pids_{k}_batches"] = round(per)
            print(
                f"  {n:>9,} pids, {k} batch(es) kept each: {per:,.0f} bytes/pid "
                f"({per * n / 1e6:,.0f} MB)"
            )
    return mem


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay-batches", type=int, default=200_000)
    ap.add_argument("--replay-records", type=int, default=10)
    ap.add_argument("--server-batches", type=int, default=200_000)
    ap.add_argument("--server-pids", type=int, default=20_000)
    ap.add_argument("--intervals", default="2000,20000,100000,10000000")
    ap.add_argument("--skip-servers", action="store_true")
    ap.add_argument("--skip-1m", action="store_true")
    ap.add_argument(
        "--memory-only", action="store_true", help="run only part 3 (memory per tracked PID)"
    )
    args = ap.parse_args()
    results: dict[str, object] = {}
    if args.memory_only:
        results["memory_bytes_per_pid"] = memory_table(args.skip_1m)
        print(json.dumps(results))
        return 0

    print("1. replay rate (no snapshot, every batch validated and replayed)")
    rr = replay_rate(args.replay_batches, args.replay_records, 10_000)
    print(
        f"  {rr['batches']} batches of {rr['records_per_batch']} x 100-byte records "
        f"({rr['log_mb']} MB, {rr['pids']} pids) in {rr['seconds']}s: "
        f"{rr['batches_per_s']:,} batches/s, {rr['mb_per_s']} MB/s"
    )
    results["replay"] = rr

    if not args.skip_servers:
        print("2. recovery after SIGKILL vs snapshot interval (real servers)")
        results["recovery_vs_interval"] = recovery_vs_interval(
            [int(x) for x in args.intervals.split(",")], args.server_batches, args.server_pids, 10
        )

    results["memory_bytes_per_pid"] = memory_table(args.skip_1m)

    print("4. snapshot cost (capture in 20k-PID chunks, encode, load at recovery)")
    sc = []
    for n in (100_000, 1_000_000):
        if n == 1_000_000 and args.skip_1m:
            continue
        r = snapshot_cost(n)
        sc.append(r)
        print(
            f"  {n:>9,} pids: capture {r['capture_s']}s (longest stall "
            f"{r['longest_stall_ms']} ms), encode {r['encode_s']}s, {r['file_mb']} MB, "
            f"load {r['load_s']}s"
        )
    results["snapshot_cost"] = sc
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
