"""Append throughput of one partition server over the real protocol.

Starts a real local cluster (ZooKeeper + one partition server, no coordinator), creates a
`strict` and an `off` topic, and drives each with one pipelining client: 100-byte records
in batches of 1,000, up to ``--window`` requests in flight. Runs the two modes alternately
(``--rounds`` each, alternating which goes first) on the same server and reports the
median records/s of each and the strict/off ratio. Figures are noisy on a shared machine.

    .venv/bin/python bench/bench_append.py [--batches 600] [--rounds 3] [--fsync interval]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

from pidlease.testing.devcluster import DEV_SECRET, LocalCluster
from pidlease.testing.wire import create_topic, token
from pidlease.wire import protocol as P

_TAIL = struct.Struct(">BQIqIq")


class FastBatches:
    """Batches of ``count`` identical 100-byte records; only the header changes per batch,
    so the client spends its time on the socket, not on encoding."""

    def __init__(self, pid: int, generation: int, count: int, value_bytes: int) -> None:
        rec = struct.pack(">iI", -1, value_bytes) + b"v" * value_bytes
        self.body = rec * count
        self.pid, self.generation, self.count = pid, generation, count

    def make(self, base_seq: int) -> bytes:
        tail = (
            _TAIL.pack(0, self.pid, self.generation, base_seq, self.count, int(time.time() * 1000))
            + self.body
        )
        return struct.pack(">qII", 0, len(tail) + 4, zlib.crc32(tail)) + tail


def drive(
    address: str,
    topic: str,
    pid: int,
    gen: int,
    batches: int,
    window: int,
    count: int,
    start_seq: int,
) -> tuple[float, int]:
    host, _, port = address.rpartition(":")
    fb = FastBatches(pid, gen, count, 100)
    tok = token(DEV_SECRET, pid, gen) if pid else ""
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    sent = recvd = 0
    errors = 0
    t0 = time.perf_counter()
    try:
        while recvd < batches:
            out = []
            while sent < batches and sent - recvd < window:
                out.append(
                    P.produce_request(sent + 1, topic, 0, tok, fb.make(start_seq + sent * count))
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
                (code,) = struct.unpack_from(">H", buf, 8)
                if code != 0:
                    errors += 1
                del buf[: 4 + n]
                recvd += 1
    finally:
        sock.close()
    return time.perf_counter() - t0, errors


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=600, help="batches per round")
    ap.add_argument("--records", type=int, default=1000, help="records per batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=32, help="requests in flight")
    ap.add_argument("--fsync", default="interval", choices=["interval", "batch"])
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="pidlease-bench-append-"))
    env = {"PIDLEASE_FSYNC": args.fsync, "PIDLEASE_SEGMENT_BYTES_MAX": str(256 * 1024 * 1024)}
    with LocalCluster(base, servers=1, coordinators=0, env=env) as cluster:
        create_topic(cluster.zk_hosts, "bench-strict", dedup="strict")
        create_topic(cluster.zk_hosts, "bench-off", dedup="off")
        addr = cluster.servers[0].address
        drive(addr, "bench-strict", 0, 0, 5, 4, 10, 0)  # warm up: topic discovery
        drive(addr, "bench-off", 0, 0, 5, 4, 10, 0)
        rates: dict[str, list[float]] = {"strict": [], "off": []}
        seq = 0
        for r in range(args.rounds):
            # alternate which mode goes first: the disk's dirty-page state carries over
            for mode in ("strict", "off") if r % 2 == 0 else ("off", "strict"):
                secs, errs = drive(
                    addr,
                    f"bench-{mode}",
                    7,
                    1,
                    args.batches,
                    args.window,
                    args.records,
                    seq if mode == "strict" else 0,
                )
                if errs:
                    print(f"round {r} {mode}: {errs} error responses", file=sys.stderr)
                    return 1
                rate = args.batches * args.records / secs
                rates[mode].append(rate)
                print(f"round {r} {mode:6s}: {rate:12,.0f} records/s ({secs:.2f}s)")
            seq += args.batches * args.records
    med = {m: statistics.median(v) for m, v in rates.items()}
    result = {
        "fsync": args.fsync,
        "records_per_batch": args.records,
        "record_bytes": 100,
        "window": args.window,
        "batches_per_round": args.batches,
        "strict_records_per_s": round(med["strict"]),
        "off_records_per_s": round(med["off"]),
        "strict_over_off": round(med["strict"] / med["off"], 3),
    }
    print(
        f"median strict {med['strict']:,.0f} records/s, off {med['off']:,.0f} records/s, "
        f"ratio strict/off {med['strict'] / med['off']:.3f}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
