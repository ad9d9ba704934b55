"""Size of the group log after N offset commits, with and without compaction (issue 25:
compaction of the group log). A fresh real cluster per run (``LocalCluster``: ZooKeeper,
a coordinator, three partition servers as processes); one group commits the offset of one
of ``--partitions`` partitions per OffsetCommit (as an auto-committing consumer does),
``--commits`` times, over one connection. Then, per run: the group log partition's bytes
on disk on each replica, its first offset, and, after a SIGKILL of the coordinator, how
many records the new coordinator replayed and how long its load took (its log line).

    python bench/bench_group_log.py [--commits 20000] [--partitions 8]
        [--compact-bytes 262144] [--segment-bytes 65536] [--runs off,on] [--json out.json]

Run ``--compact-bytes 0`` is compaction off (the log keeps every commit).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from partition_server.kafka import codec as C
from partition_server.kafka.groups import GROUPS_TOPIC, partition_of
from pidlease.testing.devcluster import LocalCluster
from tests.kafka_wire import KafkaWire

GROUP = "bench"


def wait_for(pred: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached within {timeout_s}s")


def find(cluster: LocalCluster, not_at: str = "") -> str | None:
    for s in cluster.servers:
        if not s.alive:
            continue
        try:
            with KafkaWire(s.kafka_address) as w:
                r = w.request(C.FIND_COORDINATOR, 3, {"key": GROUP, "key_type": 0})
        except OSError:
            continue
        if int(r.error_code) == 0 and f"{r.host}:{r.port}" != not_at:
            return f"{r.host}:{r.port}"
    return None


def commit(w: KafkaWire, p: int, offset: int) -> int:
    r = w.request(
        C.OFFSET_COMMIT,
        8,
        {
            "group_id": GROUP,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": "t",
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        },
    )
    return int(r.topics[0].partitions[0].error_code)


def run(work: Path, args: argparse.Namespace, compact_bytes: int) -> dict[str, Any]:
    env = {
        "PIDLEASE_GROUP_LOG_COMPACT_BYTES": str(compact_bytes),
        "PIDLEASE_GROUP_LOG_SEGMENT_BYTES": str(args.segment_bytes),
        "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
        "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    }
    out: dict[str, Any] = {"compact_bytes": compact_bytes, "commits": args.commits}
    with LocalCluster(work, servers=3, env=env) as cluster:
        cluster.create_topic("t", partitions=args.partitions, replication_factor=3)
        addr = wait_for(lambda: find(cluster), 60, "a coordinator")
        t0 = time.monotonic()
        with KafkaWire(addr) as w:
            wait_for(lambda: commit(w, 0, 0) == 0, 60, "the group log loaded")
            for n in range(args.commits):
                code = commit(w, n % args.partitions, n)
                assert code == 0, code
        out["commit_s"] = round(time.monotonic() - t0, 1)
        time.sleep(3)  # the followers' reads and retention passes
        idx = partition_of(GROUP)
        sizes, starts = {}, {}
        for s in cluster.servers:
            d = cluster.data_dir / f"server-{s.ident}" / "data" / f"{GROUPS_TOPIC}-{idx}"
            segs = sorted(d.glob("*.log"))
            sizes[s.ident] = sum(f.stat().st_size for f in segs)
            starts[s.ident] = int(segs[0].stem) if segs else -1
        out["log_bytes"] = sizes
        out["first_offset"] = starts
        coord = next(s for s in cluster.servers if s.kafka_address == addr)
        cluster.kill(coord)
        addr2 = wait_for(lambda: find(cluster, not_at=addr), 60, "a new coordinator")
        new = next(s for s in cluster.servers if s.kafka_address == addr2)
        with KafkaWire(addr2) as w:
            wait_for(lambda: commit(w, 0, args.commits) == 0, 60, "loaded by the new one")
        text = new.log_path.read_text()
        m = re.findall(
            rf"group log partition {idx} \(epoch \d+\): loaded (\d+) groups from (\d+) records "
            r"in ([0-9.]+)s",
            text,
        )
        if m:
            out["reload_records"] = int(m[-1][1])
            out["reload_s"] = float(m[-1][2])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--compact-bytes", type=int, default=262_144)
    ap.add_argument("--segment-bytes", type=int, default=65_536)
    ap.add_argument("--runs", default="off,on", help="off,on: without then with compaction")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    results = []
    runs = {"off": 0, "on": args.compact_bytes}
    for compact in [runs[r] for r in args.runs.split(",")]:
        with tempfile.TemporaryDirectory(prefix="bench-group-log-") as tmp:
            r = run(Path(tmp), args, compact)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
