"""The price of effectively-once copying: ``pidlease mirror``'s engine against a plain
read-and-send loop on the same data, records/s.

    python bench/bench_mirror.py --records 200000 --partitions 6

What runs: two local clusters (one ZooKeeper with a chroot each, ``--servers`` partition
servers per cluster, started here on 127.0.0.1 and stopped at the end). The source topic
gets ``--records`` keyed records of ``--value-bytes`` bytes on ``--partitions``
partitions. Then, one after the other, on the same source data:

- ``mirror``: ``pidlease.client.mirror.Mirror`` with ``until_caught_up`` (what
  ``pidlease mirror --until-caught-up`` runs): one named producer per partition,
  explicit sequence ids (the source offsets), source timestamps kept, into a monotonic
  target topic.
- ``plain``: the loop a user writes without it: one ``Reader`` per partition, one
  producer of its own numbering (no name), ``send_batch`` of each chunk to the same
  partition of a strict target topic, the partitions one thread each. At-least-once: a
  restart would copy again from wherever its author decided.

Each time is from start to the last acknowledgement; the targets are counted afterwards,
so a lost or doubled record fails the run. ``--json`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _count(url: str, topic: str, partitions: int) -> int:
    from pidlease import Reader

    n = 0
    for p in range(partitions):
        with Reader(url, topic, p) as rd:
            n += sum(1 for _ in rd)
    return n


def plain_copy(src: str, dst: str, topic: str, target: str, partitions: int) -> None:
    from pidlease import Producer, Reader

    with Producer(dst, topic=target) as prod:

        def one(p: int) -> None:
            with Reader(src, topic, p) as rd:
                chunk: list[Any] = []
                for rec in rd:
                    chunk.append(rec)
                    if len(chunk) == 2000:
                        prod.send_batch(
                            [r.value for r in chunk], [r.key for r in chunk], partition=p
                        )
                        chunk = []
                if chunk:
                    prod.send_batch([r.value for r in chunk], [r.key for r in chunk], partition=p)

        threads = [threading.Thread(target=one, args=(p,)) for p in range(partitions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        prod.flush()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pidlease import Producer
    from pidlease.client.mirror import Endpoint, Mirror, prepare_topics
    from pidlease.testing.devcluster import LocalCluster
    from pidlease.testing.zkserver import ZooKeeperCluster

    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-mirror-"))
    zk = ZooKeeperCluster(work / "zk", 1).start()
    clusters: list[LocalCluster] = []
    try:
        for side in ("src", "dst"):
            clusters.append(
                LocalCluster(
                    work / side, servers=args.servers, zk_hosts=f"{zk.hosts}/{side}"
                ).start()
            )
        src, dst = (c.coordinator_url for c in clusters)
        clusters[0].create_topic("orders", partitions=args.partitions)
        clusters[1].create_topic("plain", partitions=args.partitions)
        value = b"v" * args.value_bytes
        with Producer(src, topic="orders") as p:
            for start in range(0, args.records, 10_000):
                n = min(10_000, args.records - start)
                p.send_batch([value] * n, keys=[b"k%d" % (i % 1000) for i in range(n)])
            p.flush()
        out: dict[str, Any] = {"records": args.records, "partitions": args.partitions}

        t0 = time.perf_counter()
        plain_copy(src, dst, "orders", "plain", args.partitions)
        out["plain_s"] = time.perf_counter() - t0

        source, target = Endpoint(src), Endpoint(dst)
        prepare_topics(source, target, ["orders"])
        t0 = time.perf_counter()
        asyncio.run(Mirror(source, target, ["orders"], until_caught_up=True).run())
        out["mirror_s"] = time.perf_counter() - t0

        for key, topic in (("plain", "plain"), ("mirror", "orders")):
            got = _count(dst, topic, args.partitions)
            if got != args.records:
                raise SystemExit(f"{key}: {got} records in the target, not {args.records}")
            out[f"{key}_rps"] = round(args.records / out[f"{key}_s"])
        out["mirror_vs_plain"] = round(out["mirror_rps"] / out["plain_rps"], 2)
        return out
    finally:
        for c in clusters:
            c.stop()
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--servers", type=int, default=1, help="partition servers per cluster")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{args.records} records, {args.partitions} partitions, {args.value_bytes}-byte values\n"
        f"  plain read-and-send loop: {out['plain_s']:.2f} s, {out['plain_rps']:,} records/s\n"
        f"  mirror (effectively once): {out['mirror_s']:.2f} s, {out['mirror_rps']:,} records/s"
        f" ({out['mirror_vs_plain']:.2f}x the plain loop)"
    )


if __name__ == "__main__":
    main()
