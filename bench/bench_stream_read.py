"""Streaming read benchmark: ``readStream.format("pidlease")``, records/s.

    cd /tmp && PYTHONPATH=/path/to/checkout python /path/to/checkout/bench/bench_stream_read.py \
        --records 500000 --master 'local[2]'

What runs: a real local cluster (ZooKeeper, coordinator, ``--servers`` partition servers,
started here on 127.0.0.1 and stopped at the end) and a Spark session. ``--records``
keyed records of a 100-byte value are written to a topic of ``--partitions`` partitions,
then read three ways, each timed from the start of the read to its end:

- ``batch``: ``spark.read.format("pidlease")`` counted (the batch scan, for reference;
  it also starts the Python workers before the measured streams);
- ``stream-noop``: ``readStream`` with ``Trigger.AvailableNow`` into Spark's ``noop``
  sink (the stream source alone, ``--max-records-per-trigger`` per micro-batch);
- ``stream-pidlease``: the same stream into a monotonic pidlease topic through the
  exactly-once streaming sink with ``pidlease.spark.bucketed`` (the pidlease -> pidlease query
  of docs/processing.md); the output is then counted, so a lost or doubled record fails
  the run.

Run it from a directory that holds no checkout (see ``bench/bench_stream.py``: Spark's
Python workers put the working directory first on their path). It refuses otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_stream import check_cwd


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_cwd()
    import pidlease.spark
    from pidlease import Producer
    from pidlease.spark.session import build_session
    from pidlease.testing.devcluster import LocalCluster

    work = Path(tempfile.mkdtemp(prefix="pidlease-bench-stream-read-"))
    cluster = LocalCluster(work / "cluster", servers=args.servers).start()
    spark = build_session(args.master, app_name="pidlease-bench-stream-read")
    out: dict[str, Any] = {"records": args.records, "partitions": args.partitions}
    try:
        url = cluster.coordinator_url
        cluster.create_topic("raw", partitions=args.partitions)
        cluster.create_topic("out", partitions=args.partitions, dedup="monotonic")
        value = b"v" * 100
        with Producer(url, topic="raw", producer_name="bench-loader") as prod:
            for a in range(0, args.records, 5000):
                n = min(5000, args.records - a)
                prod.send_batch([value] * n, keys=[b"c%d" % ((a + i) % 1000) for i in range(n)])
            prod.flush()

        def stream() -> Any:
            return (
                spark.readStream.format("pidlease")
                .option("coordinator", url)
                .option("topic", "raw")
                .option("max_records_per_trigger", args.max_records_per_trigger)
                .load()
            )

        t0 = time.monotonic()
        n = spark.read.format("pidlease").option("coordinator", url).option("topic", "raw")
        counted = n.load().count()
        out["batch_s"] = time.monotonic() - t0
        assert counted == args.records, counted

        t0 = time.monotonic()
        q = (
            stream()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "ck-noop"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        out["stream_noop_s"] = time.monotonic() - t0

        t0 = time.monotonic()
        rows = stream().select("key", "value")
        q = (
            pidlease.spark.bucketed(rows)
            .writeStream.format("pidlease")
            .option("coordinator", url)
            .option("topic", "out")
            .option("checkpointLocation", str(work / "ck-pidlease"))
            .option("log_report", "false")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        out["stream_pidlease_s"] = time.monotonic() - t0
        # records, not offsets: each micro-batch's producers fence the previous batch's
        written = (
            (spark.read.format("pidlease").option("coordinator", url).option("topic", "out"))
            .load()
            .count()
        )
        assert written == args.records, f"{written} records in the output, not {args.records}"
        for k in ("batch", "stream_noop", "stream_pidlease"):
            out[f"{k}_records_per_s"] = round(args.records / out[f"{k}_s"])
        return out
    finally:
        spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--max-records-per-trigger", type=int, default=100_000)
    ap.add_argument("--master", default="local[2]")
    print(json.dumps(run(ap.parse_args()), indent=2))


if __name__ == "__main__":
    main()
