"""Spark pipeline benchmark: the same job writing through pidlease and writing Parquet,
then reading each back, on one machine, in one run; rows/s and their ratios.

    python bench/bench_spark.py --rows 1000000 --master 'local[2]'
    python bench/bench_spark.py --rows 1000000 --standalone
    python bench/bench_spark.py --rows 1000000 --master spark://127.0.0.1:7077

``--standalone`` starts a Spark standalone master and two one-core workers (127.0.0.1
and 127.0.0.2, as tests/integration/test_spark_cluster.py does, ``pidlease.spark.testing``)
and stops them at the end; ``--master spark://...`` uses a running cluster, whose
executors must import the same pidlease as this driver (``spark.executorEnv.PYTHONPATH``
is set to the checkout of the ``pidlease`` package imported here). On a cluster,
executor CPU is that of the executors' JVMs (``CoarseGrainedExecutorBackend``, found
under the workers' process trees in /proc) and of their Python daemons and workers;
the driver's JVM is reported apart.

What runs: a real local cluster (ZooKeeper, coordinator, ``--servers`` partition servers,
started here on 127.0.0.1 and stopped at the end) and a Spark session. The data set is
``spark.range(rows)`` with a key (1,000 distinct customers) and a 100-byte value, in
``--spark-partitions`` partitions; both sinks compute it the same way. A small warm-up
write to each sink first keeps Python worker start-up out of the measured runs.

- write: ``pidlease.spark.bucketed(df).write.format("pidlease")`` (the row hash and bucket
  columns and the shuffle by bucket into ``--spark-partitions``; strict topic,
  ``--topic-partitions``, explicit sequence ids, key routing) against
  ``df.write.parquet`` (snappy, local disk; no shuffle);
- re-run: the same pidlease job again, which skips every row (exactly-once re-run cost);
- read: a full scan of the value column (``sum(length(value))``) from the topic through
  the ``pidlease`` reader against the same scan of the Parquet files.

Figures depend on the machine and its load; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")
_EXECUTOR_MAIN = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"
_WORKER_MAIN = b"org.apache.spark.deploy.worker.Worker"


def _children() -> dict[int, list[int]]:
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
    return children


def _descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process under ``root`` (Spark's JVM, its Python daemon and workers)."""
    children = _children() if children is None else children
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _cpu_s(pid: int, with_children: bool) -> float:
    """CPU seconds of ``pid``; ``with_children``: plus its exited, waited-for children."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + ((cutime + cstime) if with_children else 0)) / _TICKS


def cluster_cpu_s(workers: list[int] | None) -> dict[str, float]:
    """CPU seconds so far of a standalone cluster's executors: ``jvm`` (each executor's
    JVM) and ``python`` (the Python daemons and workers under them, with their exited
    children), found under the given worker processes, or under every Spark worker on
    this machine if none are given; ``driver_jvm``: this process's JVM child."""
    children = _children()
    if workers is None:
        workers = [
            int(d) for d in os.listdir("/proc") if d.isdigit() and _WORKER_MAIN in _cmdline(int(d))
        ]
    got = {"python": 0.0, "jvm": 0.0, "driver_jvm": 0.0}
    for worker in workers:
        for pid in _descendants(worker, children):
            if _EXECUTOR_MAIN not in _cmdline(pid):
                continue
            got["jvm"] += _cpu_s(pid, with_children=False)
            for sub in _descendants(pid, children):
                if b"pyspark" in _cmdline(sub):
                    got["python"] += _cpu_s(sub, with_children=True)
    for pid in children.get(os.getpid(), []):
        if b"java" in _cmdline(pid).split(b"\0")[0]:
            got["driver_jvm"] += _cpu_s(pid, with_children=False)
    return got


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


def _standalone_helpers() -> ModuleType:
    """``pidlease.spark.testing`` (start and stop a standalone cluster); loaded from this
    checkout by path when an older checkout without it is on the path."""
    try:
        from pidlease.spark import testing

        return testing
    except ImportError:
        path = Path(__file__).resolve().parents[1] / "pidlease" / "spark" / "testing.py"
        spec = importlib.util.spec_from_file_location("_bench_standalone", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def check_cwd(checkout: str) -> None:
    """Spark starts its Python workers with ``python -m pyspark.daemon``, which puts the
    working directory first on their path: run from another checkout, the driver imports
    the ``pidlease`` of ``PYTHONPATH`` and the workers that of the directory (a sink
    pickled by one and read by the other fails, or a comparison measures the wrong code)."""
    here = Path.cwd() / "pidlease"
    if here.is_dir() and here.resolve() != Path(checkout) / "pidlease":
        raise SystemExit(
            f"run from another directory: Spark's Python workers would import {here}, "
            f"this driver imports {checkout}/pidlease (e.g. cd /tmp first)"
        )


def _timed(
    what: str,
    fn: Any,
    cpu: dict[str, dict[str, float]] | None = None,
    measure: Any = spark_cpu_s,
) -> float:
    before = measure()
    started = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - started
    after = measure()
    used = {k: round(after[k] - before[k], 2) for k in after}
    if cpu is not None:
        cpu[what] = used
    print(f"  {what}: {elapsed:.2f}s (Spark CPU s: {used})", file=sys.stderr, flush=True)
    return elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import pidlease
    from pidlease.testing.devcluster import LocalCluster

    try:
        import pidlease.spark as package
        from pidlease.spark.session import build_session
    except ImportError:  # a checkout from before the move into pidlease.spark (issue 28)
        import pipeline as package
        from pipeline.session import build_session

    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-spark-"))
    # executors import the pidlease this driver imports (a before/after comparison sets
    # PYTHONPATH to the tree under test)
    checkout = str(Path(pidlease.__file__).resolve().parent.parent)
    check_cwd(checkout)
    standalone: Any = None
    master = args.master
    conf: dict[str, str] = {}
    measure: Any = spark_cpu_s
    if args.standalone or master.startswith("spark://"):
        helpers = _standalone_helpers()
        if args.standalone:
            (work / "spark").mkdir()
            standalone = helpers.Standalone(
                work / "spark", memory=args.worker_memory, pythonpath=checkout
            ).start()
            master = standalone.url
        os.environ["PYSPARK_PYTHON"] = sys.executable  # the only way to name the interpreter
        conf = {
            "spark.executor.memory": args.executor_memory,
            "spark.executor.cores": "1",
            "spark.cores.max": str(len(helpers.HOSTS)),
            "spark.executorEnv.PYTHONPATH": checkout,
        }
        workers = [w.pid for w in standalone.workers] if standalone else None

        def measure() -> dict[str, float]:
            return cluster_cpu_s(workers)

    args.master = master
    cluster = LocalCluster(work / "cluster", servers=args.servers).start()
    spark = None
    try:
        spark = build_session(master, app_name="pidlease-bench-spark", conf=conf)
        if master.startswith("spark://"):
            helpers.wait_for_executors(spark, helpers.HOSTS)
        url = cluster.coordinator_url

        def data(rows: int) -> Any:
            return spark.range(rows, numPartitions=args.spark_partitions).selectExpr(
                "concat('customer-', CAST(id % 1000 AS STRING)) AS key",
                "concat(lpad(CAST(id AS STRING), 20, '0'), repeat('x', 80)) AS value",
            )

        def to_pidlease(df: Any, topic: str, job: str, bucketed: bool = True) -> None:
            # pidlease.spark.bucketed since issue 30 (an older checkout has none)
            if bucketed and hasattr(package, "bucketed"):
                df = package.bucketed(df, args.buckets, partitions=args.spark_partitions)
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
            "parquet write", lambda: df.write.mode("overwrite").parquet(parquet_dir), cpu, measure
        )
        t_write = _timed(
            "pidlease write", lambda: to_pidlease(df, "bench", "bench-job"), cpu, measure
        )
        identity = compare_plain(args, cluster, df, to_pidlease, measure) if args.plain else None
        if args.no_read:
            return {
                "rows": args.rows,
                "master": args.master,
                "pidlease_checkout": checkout,
                "write_rows_per_s": {
                    "pidlease": round(args.rows / t_write),
                    "parquet": round(args.rows / t_parquet_write),
                    "ratio": round(t_parquet_write / t_write, 3),
                },
                "executor_cpu_us_per_row": {
                    what: {k: round(v * 1e6 / args.rows, 2) for k, v in used.items()}
                    for what, used in cpu.items()
                },
                "bucketed_against_plain": identity,
            }
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
            "pidlease_checkout": checkout,
            "write_rows_per_s": {
                "pidlease": round(rate(t_write)),
                "parquet": round(rate(t_parquet_write)),
                "ratio": round(t_parquet_write / t_write, 3),
            },
            # executor CPU per row, microseconds: Python workers and the JVM (local mode:
            # the JVM is driver and executor at once; on a cluster the executors' JVMs,
            # and the driver's JVM apart)
            "executor_cpu_us_per_row": {
                what: {k: round(v * 1e6 / args.rows, 2) for k, v in used.items()}
                for what, used in cpu.items()
            },
            "rerun_rows_per_s": round(rate(t_rerun)),
            "bucketed_against_plain": identity,
            "read_rows_per_s": {
                "pidlease": round(rate(t_read)),
                "parquet": round(rate(t_parquet_read)),
                "ratio": round(t_parquet_read / t_read, 3),
            },
        }
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        if standalone is not None:
            standalone.stop()
        shutil.rmtree(work, ignore_errors=True)


def compare_plain(
    args: argparse.Namespace, cluster: Any, df: Any, to_pidlease: Any, measure: Any
) -> dict[str, Any]:
    """The cost of row identity, in one run: ``--repeat`` pairs of writes of the same rows,
    each to a topic of its own, through ``pidlease.spark.bucketed`` (row hash, bucket, shuffle
    by bucket, content order) and as a plain DataFrame (no shuffle; one producer per Spark
    partition, content order within it), alternated (and which goes first too) so both
    see the same load."""
    times: dict[str, list[float]] = {"bucketed": [], "plain": []}
    cpu_runs: dict[str, list[dict[str, float]]] = {"bucketed": [], "plain": []}
    for i in range(args.repeat):
        for variant in ("bucketed", "plain") if i % 2 == 0 else ("plain", "bucketed"):
            topic = f"cmp-{variant}-{i}"
            cluster.create_topic(topic, partitions=args.topic_partitions)
            used: dict[str, dict[str, float]] = {}
            times[variant].append(
                _timed(
                    f"pidlease write, {variant} #{i + 1}",
                    lambda t=topic, v=variant: to_pidlease(df, t, t, v == "bucketed"),
                    used,
                    measure,
                )
            )
            cpu_runs[variant].append(next(iter(used.values())))

    median = statistics.median

    return {
        "repeat": args.repeat,
        "rows_per_s": {v: [round(args.rows / t) for t in ts] for v, ts in times.items()},
        # per pair: the bucketed write's time over the plain one's (1.2 = 20 % slower)
        "time_ratio": [
            round(b / p, 3) for b, p in zip(times["bucketed"], times["plain"], strict=True)
        ],
        "median_time_ratio": round(median(times["bucketed"]) / median(times["plain"]), 3),
        "executor_cpu_us_per_row": {
            v: {k: round(median([r[k] for r in runs]) * 1e6 / args.rows, 2) for k in runs[0]}
            for v, runs in cpu_runs.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--spark-partitions", type=int, default=4)
    p.add_argument("--topic-partitions", type=int, default=4)
    p.add_argument(
        "--buckets",
        type=int,
        default=32,
        help="pidlease.spark.bucketed's bucket count (the write shuffles into --spark-partitions)",
    )
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--master", default="local[2]", help="local[N] or spark://host:port")
    p.add_argument(
        "--standalone",
        action="store_true",
        help="start a standalone master and two one-core workers (127.0.0.1, 127.0.0.2), "
        "run on them, stop them",
    )
    p.add_argument("--worker-memory", default="1536m", help="with --standalone")
    p.add_argument("--executor-memory", default="1g", help="on a spark:// master")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument(
        "--plain",
        action="store_true",
        help="also compare, in this run, the bucketed write with a plain DataFrame's "
        "(no shuffle): --repeat pairs, alternated",
    )
    p.add_argument("--repeat", type=int, default=3, help="pairs of writes with --plain")
    p.add_argument(
        "--no-read", action="store_true", help="measure the writes only (no re-run, no reads)"
    )
    args = p.parse_args(argv)
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"master {result['master']}, pidlease from {result['pidlease_checkout']}")
    w = result["write_rows_per_s"]
    print(
        f"write: pidlease {w['pidlease']:,} rows/s, parquet {w['parquet']:,} rows/s, "
        f"ratio {w['ratio']:.3f}"
    )
    for what, used in result["executor_cpu_us_per_row"].items():
        extra = f", driver jvm {used['driver_jvm']} us" if "driver_jvm" in used else ""
        print(
            f"executor CPU per row, {what}: python {used['python']} us, jvm {used['jvm']} us"
            + extra
        )
    cmp = result.get("bucketed_against_plain")
    if cmp:
        print(
            f"bucketed against plain, {cmp['repeat']} pairs: rows/s {cmp['rows_per_s']}, "
            f"time ratios {cmp['time_ratio']}, median {cmp['median_time_ratio']}"
        )
    if "read_rows_per_s" in result:
        r = result["read_rows_per_s"]
        print(f"re-run of the same job (skips every row): {result['rerun_rows_per_s']:,} rows/s")
        print(
            f"read:  pidlease {r['pidlease']:,} rows/s, parquet {r['parquet']:,} rows/s, "
            f"ratio {r['ratio']:.3f}"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
