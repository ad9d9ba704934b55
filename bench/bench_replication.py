"""Throughput of replication factor 3 against 1, side by side in one run.

One real local cluster (ZooKeeper, a coordinator, three partition servers as processes) with
two one-partition topics, ``r1`` (R=1) and ``r3`` (R=3), both led by server 1. The same
workload (``--producers`` producer processes, each ``--records`` records of
``--value-bytes`` bytes through ``Producer.send`` at the SDK defaults) runs against each in
turn, alternating ``--rounds`` times so drifting background load hits both alike. An R=3
ack waits for both followers to fetch and fsync the batch; the figures show what that
costs. Each pass is audited (every record acked once).

    .venv/bin/python bench/bench_replication.py [--producers 3] [--records 100000]
        [--value-bytes 100] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.runner import run_producers
from bench.workload import summarize
from pidlease.cli.verify import verify_topic
from pidlease.testing.devcluster import LocalCluster, http_json

SERVER_ENV = {"PIDLEASE_SEGMENT_BYTES_MAX": str(256 * 1024 * 1024)}


def one_pass(cluster: LocalCluster, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    cfg = {"url": cluster.coordinator_url, "topic": topic}
    outcomes = run_producers(
        "bench.peers.pidlease_sdk:produce",
        cfg,
        producers=args.producers,
        phase="produce",
        value_bytes=args.value_bytes,
        records=args.records,
    )
    r = summarize(outcomes)
    if r.errors or r.acked != r.records:
        raise RuntimeError(
            f"{topic}: {r.errors} errors, {r.acked}/{r.records} acked: {r.error_sample}"
        )
    return {
        "records_per_s": r.records_per_s,
        "mb_per_s": r.records_per_s * args.value_bytes / 1e6,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "seconds": r.seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-repl-"))
    results: dict[str, list[dict[str, Any]]] = {"r1": [], "r3": []}
    with LocalCluster(work, servers=3, env=SERVER_ENV) as cluster:
        for rnd in range(args.rounds):
            for rf in (1, 3):
                topic = f"r{rf}-{rnd}"
                cluster.create_topic(topic, partitions=1, replication_factor=rf)
                _, desc = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{topic}")
                assert desc["partition_states"][0]["leader"] == 1, desc
                time.sleep(0.5)  # let the followers open their fetch sessions
                got = one_pass(cluster, topic, args)
                audit = verify_topic(cluster.coordinator_url, topic)
                if not audit.ok or audit.total("records") != args.producers * args.records:
                    raise RuntimeError(audit.summary())
                results[f"r{rf}"].append(got)
                print(
                    f"round {rnd + 1} R={rf}: {got['records_per_s']:,.0f} records/s, "
                    f"{got['mb_per_s']:.1f} MB/s, ack p50 {got['p50_ms']:.1f} ms, "
                    f"p99 {got['p99_ms']:.1f} ms",
                    flush=True,
                )
    summary = {}
    for key, runs in results.items():
        summary[key] = {
            m: statistics.median(r[m] for r in runs)
            for m in ("records_per_s", "mb_per_s", "p50_ms", "p99_ms")
        }
    ratio = summary["r3"]["records_per_s"] / summary["r1"]["records_per_s"]
    print(
        f"\nmedian of {args.rounds} rounds, {args.producers} producers x {args.records:,} records "
        f"of {args.value_bytes} B, one partition led by server 1:"
    )
    print("| replication | records/s | MB/s | ack p50 ms | ack p99 ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for key in ("r1", "r3"):
        s = summary[key]
        print(
            f"| R={key[1]} | {s['records_per_s']:,.0f} | {s['mb_per_s']:.1f} | "
            f"{s['p50_ms']:.1f} | {s['p99_ms']:.1f} |"
        )
    print(f"R=3 / R=1 throughput: {ratio:.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "rounds": results,
                    "median": summary,
                    "ratio_r3_r1": ratio,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
