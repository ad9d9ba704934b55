"""The PySpark side of pidlease: a ``pidlease`` data source for batch and streaming writes
and reads, and the ``pidlease-spark`` publish/audit commands.

How the package is built (read this first):

- ``source``      the ``DataSource`` Spark knows; ``register(spark)`` adds it to a session
- ``sink``        batch and streaming writers: checks on the driver, tasks run ``faults.run_task``
- ``attempt``     one attempt at one Spark partition: lease by name (a takeover fences older
                  attempts), skip what is durable, send the rest with explicit sequence ids
- ``bucketing``   ``bucketed(df)``: the row hash and bucket columns, and the shuffle by bucket
- ``sequencing``  pure rules: producer name, topic partition and sequence id of each row
- ``encoding``    rows (Arrow batches) to (key, value) bytes
- ``faults``      injected failures and the speculative copy used by tests and demos
- ``job_report``  the commit messages added up on the driver
- ``scan``        the batch read: offset ranges per topic partition, read with the SDK
- ``stream_source``  the streaming read (``readStream``): offsets per partition in Spark's
                  checkpoint, each micro-batch's ranges read with the SDK
- ``audit``       the exactly-once audit of a topic, in Spark, written as JSON and Parquet
- ``session`` / ``progress`` / ``cli``   the ``pidlease-spark`` command

Spark and pyarrow are imported only by the modules that need them, so ``sequencing``,
``encoding``'s planning and ``options`` stay importable (and testable) on their own.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "bucketed", "register"]

FORMAT = "pidlease"


def bucketed(df: Any, buckets: int | None = None, partitions: int | None = None) -> Any:
    """``df`` ready for a pidlease write: row hash and bucket columns, shuffled by bucket
    (``pipeline.bucketing``)."""
    from pipeline.bucketing import bucketed as _bucketed
    from pipeline.sequencing import BUCKETS_DEFAULT

    return _bucketed(df, buckets or BUCKETS_DEFAULT, partitions)


def register(spark: Any) -> None:
    """Make ``format("pidlease")`` available in ``spark`` (a ``SparkSession``)."""
    from pipeline.source import register as _register

    _register(spark)
