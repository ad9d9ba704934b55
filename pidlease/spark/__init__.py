"""The PySpark side of pidlease: a ``pidlease`` data source for batch and streaming writes
and reads, and the ``pidlease-spark`` publish/audit commands (docs/pipeline.md).

The entry points are this module's names (the contract's ``pidlease.spark.register(spark)``):
``register`` adds the ``pidlease`` format to a session, ``bucketed`` prepares a DataFrame
for an exactly-once write whatever order Spark delivers its rows in, ``FORMAT`` is the
format's name. Spark's Python workers import the data source by its module path
(``pidlease.spark.source``), so they need this package on their path like the driver.

How the package is built (read this first):

- ``source``      the ``DataSource`` Spark knows; ``register(spark)`` adds it to a session
- ``sink``        batch and streaming writers: checks on the driver, tasks run ``faults.run_task``
- ``attempt``     what one attempt at one Spark task is and holds: its producers' leases (a
                  takeover fences older attempts; a micro-batch's first attempt renews),
                  the durable highwaters it resumes after, what it does when fenced
- ``columnar``    the write: the task's Arrow batches in canonical order, explicit sequence
                  ids, rows at or below the durable highwater skipped, ``send_batch`` per group
- ``bucketing``   ``bucketed(df)``: the row hash and bucket columns, and the shuffle by bucket
- ``sequencing``  pure rules: producer name, topic partition and sequence id of each row
- ``encoding``    rows (Arrow batches) to (key, value) bytes
- ``options`` / ``errors``   the options parsed and checked; the errors a user sees
- ``faults``      injected failures and the speculative copy used by tests and demos
- ``job_report``  the commit messages added up on the driver
- ``scan``        the batch read: offset ranges per topic partition, read with the SDK
- ``stream_source``  the streaming read (``readStream``): offsets per partition in Spark's
                  checkpoint, each micro-batch's ranges read with the SDK
- ``audit`` / ``against``   the exactly-once audit of a topic, in Spark, written as JSON and
                  Parquet; the audit by content against the input
- ``session`` / ``progress`` / ``cli``   the ``pidlease-spark`` command
- ``testing``     a Spark standalone cluster for tests and benchmarks

Spark and pyarrow are imported only by the modules that need them (and by the entry points
above only when called), so ``import pidlease.spark``, ``sequencing``, ``encoding``'s
planning and ``options`` stay importable (and testable) without them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "bucketed", "register"]

FORMAT = "pidlease"


def bucketed(df: Any, buckets: int | None = None, partitions: int | None = None) -> Any:
    """``df`` ready for a pidlease write: row hash and bucket columns, shuffled by bucket
    (``pidlease.spark.bucketing``)."""
    from pidlease.spark.bucketing import bucketed as _bucketed
    from pidlease.spark.sequencing import BUCKETS_DEFAULT

    return _bucketed(df, buckets or BUCKETS_DEFAULT, partitions)


def register(spark: Any) -> None:
    """Make ``format("pidlease")`` available in ``spark`` (a ``SparkSession``), for writes,
    batch reads and streaming reads."""
    from pidlease.spark.source import register as _register

    _register(spark)
