"""Streaming write benchmark: a keyed streaming query into pidlease, rows/s.

    python bench/bench_stream.py --rows 1000000 --master 'local[2]'

What runs: a real local cluster (ZooKeeper, coordinator, ``--servers`` partition servers,
started here on 127.0.0.1 and stopped at the end) and a Spark session. The input is
``--files`` Parquet files of ``--rows`` rows in total, each with a key (1,000 distinct
customers) and a 100-byte value, read as a stream (``readStream.parquet``,
``--files-per-batch`` files per micro-batch) and written to a monotonic topic of
``--topic-partitions`` partitions with the default partitioning (``auto``: by key), the
case where every Spark partition writes to every topic partition. A small warm-up query
first keeps Python worker start-up out of the measured one. The time is from ``start()``
to the end of the last micro-batch (``trigger(availableNow=True)``); the topic is then
counted, so a lost or doubled row fails the run.

Run it with ``PYTHONPATH`` pointing at another checkout to measure that checkout's code
(the script itself only uses the data source's public options), and from a directory
that holds no other checkout: Spark's Python workers (``python -m pyspark.daemon``) put
the working directory first on their path, so run from a checkout's root they would
import that checkout's ``pidlease`` whatever ``PYTHONPATH`` says. The script refuses to.
A checkout from before the data source moved into ``pidlease.spark`` (its top-level
``pipeline``) is measured too (``spark_package``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def spark_package() -> tuple[Any, Any]:
    """The data source's package and its ``session`` module: ``pidlease.spark``, or the
    top-level ``pipeline`` of a checkout from before the move (issue 28 item 5)."""
    try:
        import pidlease.spark as package
        from pidlease.spark import session
    except ImportError:
        import pipeline as package
        from pipeline import session
    return package, session


def check_cwd() -> None:
    """Refuse a working directory whose ``pidlease`` is not the one imported here (see
    the module doc)."""
    import pidlease

    mine = Path(pidlease.__file__).resolve().parent
    here = Path.cwd() / "pidlease"
    if here.is_dir() and here.resolve() != mine:
        raise SystemExit(
            f"run from another directory: Spark's Python workers would import {here}, "
            f"this driver imports {mine} (e.g. cd /tmp first)"
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_cwd()
    from pidlease.testing.devcluster import LocalCluster

    package, session = spark_package()
    build_session = session.build_session

    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-stream-"))
    cluster = LocalCluster(work / "cluster", servers=args.servers).start()
    spark = build_session(args.master, app_name="pidlease-bench-stream")
    try:
        url = cluster.coordinator_url

        def make_input(path: Path, rows: int, files: int) -> Any:
            df = spark.range(rows, numPartitions=files).selectExpr(
                "concat('customer-', CAST(id % 1000 AS STRING)) AS key",
                "concat(lpad(CAST(id AS STRING), 20, '0'), repeat('x', 80)) AS value",
            )
            df.write.mode("overwrite").parquet(str(path))
            return df.schema

        def stream(src: Path, schema: Any, topic: str, name: str) -> float:
            df = (
                spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", args.files_per_batch)
                .parquet(str(src))
            )
            if hasattr(package, "bucketed"):  # since issue 30; an older checkout has none
                df = package.bucketed(df, partitions=args.files_per_batch)
            q = (
                df.writeStream.format("pidlease")
                .option("coordinator", url)
                .option("topic", topic)
                .option("partitioning", args.partitioning)
                .option("checkpointLocation", str(work / f"ck-{name}"))
                .trigger(availableNow=True)
            )
            started = time.perf_counter()
            query = q.start()
            query.awaitTermination(args.timeout_s)
            elapsed = time.perf_counter() - started
            if query.isActive:
                query.stop()
                raise SystemExit(f"the streaming query did not finish in {args.timeout_s}s")
            if query.exception() is not None:
                raise SystemExit(f"the streaming query failed: {query.exception()}")
            return elapsed

        print(f"warm-up ({args.master})", file=sys.stderr)
        cluster.create_topic("warmup", partitions=args.topic_partitions, dedup="monotonic")
        schema = make_input(work / "warmup-in", 10_000, 2)
        stream(work / "warmup-in", schema, "warmup", "warmup")

        print(
            f"{args.rows:,} rows in {args.files} files, {args.files_per_batch} per micro-batch, "
            f"partitioning {args.partitioning}",
            file=sys.stderr,
        )
        cluster.create_topic("bench", partitions=args.topic_partitions, dedup="monotonic")
        make_input(work / "in", args.rows, args.files)
        elapsed = stream(work / "in", schema, "bench", "bench")
        print(f"  streaming write: {elapsed:.2f}s", file=sys.stderr)
        count = (
            spark.read.format("pidlease")
            .option("coordinator", url)
            .option("topic", "bench")
            .load()
            .count()
        )
        if count != args.rows:
            raise SystemExit(f"the topic holds {count} records, expected {args.rows}")
        return {
            "rows": args.rows,
            "master": args.master,
            "files": args.files,
            "files_per_batch": args.files_per_batch,
            "partitioning": args.partitioning,
            "topic_partitions": args.topic_partitions,
            "servers": args.servers,
            "seconds": round(elapsed, 2),
            "rows_per_s": round(args.rows / elapsed),
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
    p.add_argument("--files", type=int, default=8, help="input files (Spark partitions)")
    p.add_argument("--files-per-batch", type=int, default=4, help="files per micro-batch")
    p.add_argument("--topic-partitions", type=int, default=4)
    p.add_argument("--partitioning", default="auto", choices=["auto", "spark", "key"])
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--json", help="also write the result to this file")
    args = p.parse_args(argv)
    result = run(args)
    print(
        f"streaming write ({result['partitioning']}): {result['rows_per_s']:,} rows/s "
        f"({result['rows']:,} rows in {result['seconds']}s)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
