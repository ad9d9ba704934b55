"""The write side of the data source: ``BatchSink`` (``df.write``) and ``StreamSink``
(``df.writeStream``), both Arrow writers (Spark hands each task Arrow record batches,
which encode much faster than rows).

Spark builds a sink once on the driver, in a planning worker, then pickles it to every
task: so ``plan`` checks everything that can be checked before a task runs (options, the
columns, the topic's existence and dedup mode) and fails the query with a sentence a
user can act on. Each task then runs ``pipeline.faults.run_task`` (one ``Attempt``, plus
whatever faults the options inject); ``commit``/``abort`` on the driver add the tasks'
messages up into the job report (``pipeline.job_report``).

Both send whole Arrow batches (``pipeline.columnar``: one ``send_batch`` per topic
partition and Arrow batch); only a batch task that starts its own speculative copy
(a test fault) sends row by row (``pipeline.attempt``).

Topic modes: a batch write numbers rows contiguously, so it works on ``strict`` (and
``monotonic``) topics; a stream numbers them ``batch_id * 2**32 + position``, which has
holes, so it needs ``monotonic``. Dedup ``off`` cannot be exactly-once and is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from pyspark.sql.types import StructType

from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pipeline import job_report
from pipeline.attempt import PartitionCommit, TaskInfo
from pipeline.columnar import ColumnarAttempt
from pipeline.encoding import RecordEncoder
from pipeline.errors import InjectedFailure, OptionError, TopicModeError
from pipeline.faults import hooks_for, run_task, wants_twin
from pipeline.options import WriteSettings


def _columns(schema: StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.typeName()) for f in schema.fields]


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


def _rows(encoder: RecordEncoder, batches: Iterator[Any]) -> Iterator[tuple[bytes | None, bytes]]:
    for batch in batches:
        yield from encoder.encode(batch)


class BatchSink(DataSourceArrowWriter):
    def __init__(self, settings: WriteSettings, encoder: RecordEncoder) -> None:
        self.settings = settings
        self.encoder = encoder

    @classmethod
    def plan(cls, options: Any, schema: StructType, overwrite: bool) -> BatchSink:
        if overwrite:
            raise OptionError("a pidlease topic is an append-only log: use mode('append')")
        settings = WriteSettings.parse(options)
        encoder = RecordEncoder.for_columns(_columns(schema), settings.key_column)
        check_topic(settings, streaming=False)
        return cls(settings, encoder)

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        # Whole Arrow batches through the SDK's send_batch (pipeline.columnar); a task
        # that starts its own speculative copy replays rows from a list: the row path.
        task = TaskInfo.current()
        if wants_twin(self.settings.faults, task):
            return run_task(self.settings, task, _rows(self.encoder, iterator))
        return ColumnarAttempt(self.settings, task).run_columns(
            self.encoder, iterator, hooks_for(self.settings.faults, task)
        )

    def commit(self, messages: list[Any]) -> None:
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
        settings = WriteSettings.parse(options, streaming=True)
        encoder = RecordEncoder.for_columns(_columns(schema), settings.key_column)
        check_topic(settings, streaming=True)
        return cls(settings, encoder)

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        # The same columnar path as a batch write; the micro-batch's ids (batch_id * 2**32
        # + position per topic partition) are consecutive per partition, so one send_batch
        # per partition and Arrow batch stays one request.
        task = TaskInfo.current()
        if wants_twin(self.settings.faults, task):
            return run_task(self.settings, task, _rows(self.encoder, iterator))
        return ColumnarAttempt(self.settings, task).run_columns(
            self.encoder, iterator, hooks_for(self.settings.faults, task)
        )

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - PySpark's name
        killed = self.settings.faults.kill_commit_batch_id == batchId
        report = job_report.summarize(
            messages, topic=self.settings.topic, committed=not killed, batch_id=batchId
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
