"""The Spark data source's entry points under the ``pidlease`` package (the contract's
``pidlease.spark.register(spark)``): ``register`` adds the ``pidlease`` format to a
session, ``bucketed`` prepares a DataFrame for an exactly-once write whatever order Spark
delivers its rows in, ``FORMAT`` is the format's name.

The data source's code still lives in the top-level ``pipeline`` package (docs/pipeline.md);
moving it here whole is issue 28 item 5, not done yet. Spark and pyarrow are imported only
when a function runs, so ``import pidlease.spark`` costs nothing."""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "bucketed", "register"]

FORMAT = "pidlease"


def register(spark: Any) -> None:
    """Make ``format("pidlease")`` available in ``spark`` (a ``SparkSession``), for writes,
    batch reads and streaming reads."""
    from pipeline.source import register as _register

    _register(spark)


def bucketed(df: Any, buckets: int | None = None, partitions: int | None = None) -> Any:
    """``df`` with the row hash and bucket columns, shuffled by bucket: every row's producer
    and sequence id then depend only on the row and the job (docs/pipeline.md)."""
    from pipeline import bucketed as _bucketed

    return _bucketed(df, buckets, partitions)
