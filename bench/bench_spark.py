"""Spark pipeline benchmark: the same job writing through pidlease and writing Parquet,
then reading each back, on one machine, in one run; rows/s and their ratios.

    python bench/bench_spark.py --rows 1000000 --master 'local[2]'

What runs: a real local cluster (ZooKeeper, coordinator, ``--servers`` partition servers,
started here on 127.0.0.1 and stopped at the end) and a Spark session. The data set is
``spark.range(rows)`` with a key (1,000 distinct customers) and a 100-byte value, in
``--spark-partitions`` partitions; both sinks compute it the same way. A small warm-up
write to each sink first keeps Python worker start-up out of the measured runs.

- write: ``df.write.format("pidlease")`` (strict topic, ``--topic-partitions``, explicit
  sequence ids, key routing) against ``df.write.parquet`` (snappy, local disk);
- re-run: the same pidlease job again, which skips every row (exactly-once re-run cost);
- read: a full scan of the value column (``sum(length(value))``) from the topic through
  the ``pidlease`` reader against the same scan of the Parquet files.

Figures depend on the machine and its load; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    """Every process under ``root`` (Spark's JVM, its Python daemon and workers)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def spark_cpu_s() -> dict[str, float]:
    """CPU seconds so far of Spark's processes under this one: ``python`` (the Python
    daemon and workers, with their exited children: workers that ended were waited for by
    the daemon) and ``jvm`` (the JVM's own threads). In local mode both are the executor."""
    got = {"python": 0.0, "jvm": 0.0}
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        if b"java" in cmd.split(b"\0")[0]:
            got["jvm"] += (utime + stime) / _TICKS
        elif b"pyspark" in cmd:
            got["python"] += (utime + stime + cutime + cstime) / _TICKS
    return got


def _timed(what: str, fn: Any, cpu: dict[str, dict[str, float]] | None = None) -> float:
    before = spark_cpu_s()
    started = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - started
    after = spark_cpu_s()
    used = {k: round(after[k] - before[k], 2) for k in after}
    if cpu is not None:
        cpu[what] = used
    print(f"  {what}: {elapsed:.2f}s (Spark CPU s: {used})", file=sys.stderr, flush=True)
    return elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from pidlease.testing.devcluster import LocalCluster
    from pipeline.session import build_session

    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-spark-"))
    cluster = LocalCluster(work / "cluster", servers=args.servers).start()
    spark = build_session(args.master, app_name="pidlease-bench-spark")
    try:
        url = cluster.coordinator_url

        def data(rows: int) -> Any:
            return spark.range(rows, numPartitions=args.spark_partitions).selectExpr(
                "concat('customer-', CAST(id % 1000 AS STRING)) AS key",
                "concat(lpad(CAST(id AS STRING), 20, '0'), repeat('x', 80)) AS value",
            )

        def to_pidlease(df: Any, topic: str, job: str) -> None:
            (
                df.write.format("pidlease")
                .option("coordinator", url)
                .option("topic", topic)
                .option("job_name", job)
                .mode("append")
                .save()
            )

        def scan(df: Any) -> None:
            df.select(F.sum(F.length("value"))).collect()

        print(f"warm-up ({args.master})", file=sys.stderr)
        cluster.create_topic("warmup", partitions=args.topic_partitions)
        to_pidlease(data(10_000), "warmup", "warmup")
        data(10_000).write.mode("overwrite").parquet(str(work / "warmup.parquet"))

        print(f"{args.rows:,} rows, {args.spark_partitions} Spark partitions", file=sys.stderr)
        cluster.create_topic("bench", partitions=args.topic_partitions)
        df = data(args.rows)
        parquet_dir = str(work / "bench.parquet")
        cpu: dict[str, dict[str, float]] = {}
        t_parquet_write = _timed(
            "parquet write", lambda: df.write.mode("overwrite").parquet(parquet_dir), cpu
        )
        t_write = _timed("pidlease write", lambda: to_pidlease(df, "bench", "bench-job"), cpu)
        t_rerun = _timed(
            "pidlease re-run (appends nothing)", lambda: to_pidlease(df, "bench", "bench-job")
        )
        t_parquet_read = _timed("parquet read", lambda: scan(spark.read.parquet(parquet_dir)))
        topic_df = (
            spark.read.format("pidlease").option("coordinator", url).option("topic", "bench").load()
        )
        t_read = _timed("pidlease read", lambda: scan(topic_df))
        count = topic_df.count()
        if count != args.rows:
            raise SystemExit(f"the topic holds {count} records, expected {args.rows}")

        def rate(t: float) -> float:
            return args.rows / t

        return {
            "rows": args.rows,
            "master": args.master,
            "spark_partitions": args.spark_partitions,
            "topic_partitions": args.topic_partitions,
            "servers": args.servers,
            "write_rows_per_s": {
                "pidlease": round(rate(t_write)),
                "parquet": round(rate(t_parquet_write)),
                "ratio": round(t_parquet_write / t_write, 3),
            },
            # executor CPU per row, microseconds: Python workers and the JVM (local mode:
            # the JVM is driver and executor at once)
            "executor_cpu_us_per_row": {
                what: {k: round(v * 1e6 / args.rows, 2) for k, v in used.items()}
                for what, used in cpu.items()
            },
            "rerun_rows_per_s": round(rate(t_rerun)),
            "read_rows_per_s": {
                "pidlease": round(rate(t_read)),
                "parquet": round(rate(t_parquet_read)),
                "ratio": round(t_parquet_read / t_read, 3),
            },
        }
    finally:
        spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--spark-partitions", type=int, default=4)
    p.add_argument("--topic-partitions", type=int, default=4)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--json", help="also write the result to this file")
    args = p.parse_args(argv)
    result = run(args)
    w, r = result["write_rows_per_s"], result["read_rows_per_s"]
    print(
        f"write: pidlease {w['pidlease']:,} rows/s, parquet {w['parquet']:,} rows/s, "
        f"ratio {w['ratio']:.3f}"
    )
    for what, used in result["executor_cpu_us_per_row"].items():
        print(f"executor CPU per row, {what}: python {used['python']} us, jvm {used['jvm']} us")
    print(f"re-run of the same job (skips every row): {result['rerun_rows_per_s']:,} rows/s")
    print(
        f"read:  pidlease {r['pidlease']:,} rows/s, parquet {r['parquet']:,} rows/s, "
        f"ratio {r['ratio']:.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
