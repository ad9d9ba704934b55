"""The Spark streaming query the stream source test starts and SIGKILLs (``python -m
tests.integration.spark_stream_worker URL CHECKPOINT TRIGGER``): pidlease topic ``raw``
-> ``readStream.format("pidlease")`` -> a transform -> ``pidlease.spark.bucketed`` ->
``writeStream.format("pidlease")`` topic ``out``, with the query's checkpoint at
CHECKPOINT. TRIGGER is ``continuous`` (a micro-batch every 200 ms until killed) or
``available-now`` (everything the input holds at start, then exit 0)."""

from __future__ import annotations

import sys
import time
from typing import Any

MAX_RECORDS_PER_TRIGGER = 4000
BUCKETS = 8
ODD_BUCKET_DELAY_S = 0.001  # per row of the odd buckets, in the write's stage


def transform(value: bytes, partition: int, offset: int) -> bytes:
    """What the query does to each input record's value (the test recomputes it)."""
    return value.upper() + b"/%d:%d" % (partition, offset)


def main(argv: list[str]) -> int:
    url, checkpoint, trigger = argv[0], argv[1], argv[2]
    from pyspark.sql import functions as F

    import pidlease.spark
    from pidlease.spark.sequencing import BUCKET_COLUMN
    from pidlease.spark.session import build_session

    spark = build_session(
        "local[2]", app_name="stream-source-test", conf={"spark.sql.shuffle.partitions": "2"}
    )
    stream = (
        spark.readStream.format("pidlease")
        .option("coordinator", url)
        .option("topic", "raw")
        .option("max_records_per_trigger", MAX_RECORDS_PER_TRIGGER)
        .option("split_records", 1500)
        .load()
    )
    out = stream.select(
        F.col("key"),
        F.concat(
            F.upper(F.col("value").cast("string")),
            F.lit("/"),
            F.col("partition").cast("string"),
            F.lit(":"),
            F.col("offset").cast("string"),
        ).alias("value"),
    )

    @F.udf("string")
    def slow_on_odd_buckets(bucket: int, value: str) -> str:
        # The sink holds a task's rows until the task's input ends (it numbers them in
        # content order), then sends them in a burst: the task of the odd buckets (Spark
        # partition 1) is slowed down so that for a while each micro-batch has the rows of
        # one task written and not the other's: a kill lands inside a micro-batch's write.
        if bucket % 2:
            time.sleep(ODD_BUCKET_DELAY_S)
        return value

    ready = pidlease.spark.bucketed(out, BUCKETS, 2)
    w: Any = (
        ready.withColumn("value", slow_on_odd_buckets(F.col(BUCKET_COLUMN), F.col("value")))
        .writeStream.format("pidlease")
        .option("coordinator", url)
        .option("topic", "out")
        .option("job_name", "stream-job")
        .option("batch_records_max", 200)
        .option("checkpointLocation", checkpoint)
    )
    w = (
        w.trigger(availableNow=True)
        if trigger == "available-now"
        else w.trigger(processingTime="200 milliseconds")
    )
    query = w.start()
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
