"""The contract's entry point ``pidlease.spark.register(spark)`` on a plain SparkSession
(real PySpark, local mode) and a real cluster: a bucketed write through it, read back
through the same format, every row once."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pidlease.spark
from pidlease.spark.session import DEFAULT_CONF, spark_environment


def test_register_from_the_pidlease_package_writes_and_reads(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("entry", partitions=2)
    spark_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName("pidlease-entry")
    for key, value in DEFAULT_CONF.items():
        builder = builder.config(key, value)
    spark: Any = builder.getOrCreate()
    try:
        pidlease.spark.register(spark)
        rows = [(f"k{i % 7}", f"v{i:03d}") for i in range(60)]
        df = spark.createDataFrame(rows, "key string, value string")
        (
            pidlease.spark.bucketed(df, 4)
            .write.format(pidlease.spark.FORMAT)
            .option("coordinator", c.coordinator_url)
            .option("topic", "entry")
            .option("job_name", "entry-job")
            .option("key_column", "key")
            .mode("append")
            .save()
        )
        got = (
            spark.read.format("pidlease")
            .option("coordinator", c.coordinator_url)
            .option("topic", "entry")
            .load()
            .collect()
        )
    finally:
        spark.stop()
    values = sorted(bytes(r["value"]).decode() for r in got if r["value"] is not None)
    assert values == sorted(v for _, v in rows), "every row once through pidlease.spark"
