"""The write side of the data source: ``BatchSink`` (``df.write``) and ``StreamSink``
(``df.writeStream``), both Arrow writers (Spark hands each task Arrow record batches,
which encode much faster than rows).

Spark builds a sink on the driver, in a planning worker, then pickles it to every
task: so ``plan`` checks everything that can be checked before a task runs (options, the
columns, the topic's existence and dedup mode) and fails the query with a sentence a
user can act on. Each task then runs ``pidlease.spark.faults.run_task`` (one
``ColumnarAttempt``, plus whatever faults the options inject); ``commit``/``abort`` on
the driver add the tasks' messages up into the job report (``pidlease.spark.job_report``).

Both send whole Arrow batches (``pidlease.spark.columnar``: one ``send_batch`` per
(bucket, topic partition) group, cut at ``batch_records_max`` by the SDK), with the
lease, resume and fence handling of ``pidlease.spark.attempt``.

A plain DataFrame (without ``pidlease.spark.bucketed``'s columns, the contract's example) is
accepted: each Spark partition is one bucket (``pidlease.spark.sequencing``), and ``plan``
logs once what that leaves to the input split.

Topic modes: a batch write numbers rows contiguously, so it works on ``strict`` (and
``monotonic``) topics; a stream numbers them ``batch_id * 2**32 + position``, which has
holes, so it needs ``monotonic``. Dedup ``off`` cannot be exactly-once and is refused.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from pyspark.sql.types import StructType

from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pidlease.spark import job_report
from pidlease.spark.attempt import PartitionCommit, TaskInfo
from pidlease.spark.encoding import RecordEncoder
from pidlease.spark.errors import InjectedFailure, OptionError, PipelineError, TopicModeError
from pidlease.spark.faults import run_task
from pidlease.spark.options import WriteSettings
from pidlease.spark.sequencing import BUCKET_COLUMN, BUCKETS_METADATA, HASH_COLUMN

log = logging.getLogger("pidlease.spark.sink")


def _columns(schema: StructType) -> list[tuple[str, str]]:
    """The data columns (the row hash and bucket are not part of the record)."""
    return [
        (f.name, f.dataType.typeName())
        for f in schema.fields
        if f.name not in (HASH_COLUMN, BUCKET_COLUMN)
    ]


PLAIN_WARNING = (
    "job %r writes a plain DataFrame (not pidlease.spark.bucketed(df)): each Spark partition is "
    "one producer ('<job_name>:<partition>') numbering its rows in an order of the rows' "
    "content, so a retry, a replayed micro-batch or a re-run with the SAME input split "
    "writes every row exactly once in any row order; a re-run or restart with another "
    "split (another core count, another file listing, another spark.sql.shuffle.partitions) "
    "moves rows to other producers and can write them twice. For split independence write "
    "pidlease.spark.bucketed(df) (or use pidlease-spark publish, which buckets itself)"
)


def bucketed_settings(settings: WriteSettings, schema: StructType) -> WriteSettings:
    """``settings`` with the bucket count of the rows (``pidlease.spark.bucketed`` records it in
    the bucket column's metadata); for rows without the bucket columns (a plain
    DataFrame) ``bucketed=False``, and the warning of what that does not cover, once per
    job (the sink is planned once per write or streaming query)."""
    fields = {f.name: f for f in schema.fields}
    if HASH_COLUMN not in fields or BUCKET_COLUMN not in fields:
        if HASH_COLUMN in fields or BUCKET_COLUMN in fields:
            raise OptionError(
                f"the rows have only one of {HASH_COLUMN!r} and {BUCKET_COLUMN!r}: write "
                f"pidlease.spark.bucketed(df) as it returns it, or a DataFrame with neither"
            )
        log.warning(PLAIN_WARNING, settings.job_name or "stream-<query id>")
        return dataclasses.replace(settings, bucketed=False)
    buckets = (fields[BUCKET_COLUMN].metadata or {}).get(BUCKETS_METADATA)
    if buckets is None:
        return settings
    return dataclasses.replace(settings, buckets=int(buckets))


def check_buckets_once(messages: list[Any]) -> None:
    """Every bucket in one Spark task (what the shuffle by bucket guarantees); two tasks
    holding rows of one bucket would have fenced each other's producer."""
    seen: dict[int, int] = {}
    for m in messages:
        if m is None:
            continue
        for b in m.buckets:
            other = seen.setdefault(b, m.spark_partition)
            if other != m.spark_partition:
                raise PipelineError(
                    f"rows of bucket {b} were written by Spark partitions {other} and "
                    f"{m.spark_partition}: repartition by the bucket column after "
                    f"adding it (pidlease.spark.bucketed does); re-run the job"
                )


def check_topic(settings: WriteSettings, *, streaming: bool) -> str:
    """The topic's dedup mode, if this write can be exactly-once on it; else raise."""
    try:
        with LeaseClient(settings.coordinator, api_token=settings.api_token) as client:
            info = client.topic(settings.topic, offsets=False)
    except errors.UnknownTopicOrPartition:
        raise OptionError(
            f"topic {settings.topic!r} does not exist at {settings.coordinator}; create "
            f"it first (pidlease topic create {settings.topic} --partitions N"
            f"{' --dedup monotonic' if streaming else ''})"
        ) from None
    if info.dedup == "off":
        raise TopicModeError(
            f"topic {settings.topic!r} has dedup off: nothing can be exactly-once "
            f"on it; use a strict or monotonic topic"
        )
    if streaming and info.dedup != "monotonic":
        raise TopicModeError(
            f"a streaming write numbers records batch_id * 2**32 + position, which "
            f"leaves holes; topic {settings.topic!r} is {info.dedup}, it must be "
            f"monotonic (pidlease topic create ... --dedup monotonic)"
        )
    return info.dedup


class BatchSink(DataSourceArrowWriter):
    def __init__(self, settings: WriteSettings, encoder: RecordEncoder) -> None:
        self.settings = settings
        self.encoder = encoder

    @classmethod
    def plan(cls, options: Any, schema: StructType, overwrite: bool) -> BatchSink:
        if overwrite:
            raise OptionError("a pidlease topic is an append-only log: use mode('append')")
        settings = bucketed_settings(WriteSettings.parse(options), schema)
        encoder = RecordEncoder.for_columns(_columns(schema), settings.key_column)
        check_topic(settings, streaming=False)
        return cls(settings, encoder)

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        # Whole Arrow batches through the SDK's send_batch (pidlease.spark.columnar).
        return run_task(self.settings, TaskInfo.current(), self.encoder, iterator)

    def commit(self, messages: list[Any]) -> None:
        check_buckets_once(messages)
        report = job_report.summarize(messages, topic=self.settings.topic, committed=True)
        job_report.save(report, self.settings.report_path, quiet=not self.settings.log_report)

    def abort(self, messages: list[Any]) -> None:
        report = job_report.summarize(messages, topic=self.settings.topic, committed=False)
        job_report.save(report, self.settings.report_path, quiet=not self.settings.log_report)


class StreamSink(DataSourceStreamArrowWriter):
    def __init__(self, settings: WriteSettings, encoder: RecordEncoder) -> None:
        self.settings = settings
        self.encoder = encoder

    @classmethod
    def plan(cls, options: Any, schema: StructType, overwrite: bool) -> StreamSink:
        # ``overwrite`` is Spark's "complete" output mode: a log cannot take a batch back.
        if overwrite:
            raise OptionError("a pidlease topic is an append-only log: use outputMode('append')")
        settings = bucketed_settings(WriteSettings.parse(options, streaming=True), schema)
        encoder = RecordEncoder.for_columns(_columns(schema), settings.key_column)
        check_topic(settings, streaming=True)
        return cls(settings, encoder)

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        # The same columnar path as a batch write; the micro-batch's ids (batch_id * 2**32
        # + position per topic partition) are consecutive per partition, so one send_batch
        # per partition and Arrow batch stays one request.
        return run_task(self.settings, TaskInfo.current(), self.encoder, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - PySpark's name
        check_buckets_once(messages)
        killed = self.settings.faults.kill_commit_batch_id == batchId
        report = job_report.summarize(
            messages, topic=self.settings.topic, committed=not killed, batch_id=batchId
        )
        if report["rows"] and report["skipped"] == report["rows"]:
            # A replay after a restart can be whole, but a batch that only ever skips is
            # worth a look (an earlier query under this job name wrote these ids).
            log.warning(
                "micro-batch %d of topic %r: all %d rows were already written (skipped whole)",
                batchId,
                self.settings.topic,
                report["rows"],
            )
        job_report.save(report, self.settings.report_path, append=True)
        if killed:
            raise InjectedFailure(
                f"injected failure in the commit of micro-batch {batchId} "
                f"(kill_commit_batch_id): its rows are written, the checkpoint "
                f"does not record it"
            )

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - PySpark's name
        report = job_report.summarize(
            messages, topic=self.settings.topic, committed=False, batch_id=batchId
        )
        job_report.save(report, self.settings.report_path, append=True)
