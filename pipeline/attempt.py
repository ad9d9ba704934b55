"""One attempt at writing one Spark partition: what a writer task runs.

An attempt leases its producer by name (``<job>:<spark partition>``): for a retry or a
speculative copy that is a takeover, which fences every older attempt of the same
partition. The lease reports, per topic partition, the PID's durable highwater; rows at
or below it were written by an earlier attempt and are skipped (``Resume``). The rest are
sent with explicit sequence ids (``pipeline.sequencing``), pipelined through the SDK's
``AsyncProducer``, and counted as they are acknowledged: appended, or duplicate (the
partition already had it).

A fenced attempt stops at once, closes its producer and raises ``AttemptFenced`` with its
figures; what it sent before the fence is either in the log (and the newer attempt skips
it) or was refused, so nothing is lost or doubled. The fenced attempt's task fails, so
Spark brings back no message of it: the attempt that fenced it records it instead
(``fenced_attempts``), from what its takeover lease told it (``takeover_record``).

The result is a ``PartitionCommit``, the ``WriterCommitMessage`` that Spark brings back to
the driver, where ``pipeline.job_report`` adds them up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from pidlease import errors
from pidlease.client.producer import AsyncProducer
from pipeline.errors import AttemptFenced, PipelineError
from pipeline.options import WriteSettings
from pipeline.sequencing import (
    STREAM_POSITION_BITS,
    BatchSequencer,
    Resume,
    StreamSequencer,
    plan,
    producer_name,
)

log = logging.getLogger("pipeline.attempt")

CLOSE_TIMEOUT_MS = 10_000  # a failing attempt waits this long for its in-flight batches
YIELD_EVERY_RECORDS = 1024  # records admitted between turns of the event loop


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """Who is running: from ``pyspark.TaskContext`` in a real task."""

    spark_partition: int
    attempt: int
    batch_id: int | None = None  # streaming micro-batch id, None for a batch write
    query_id: str | None = None  # streaming query id (stable across restarts)
    speculative: bool = False

    @classmethod
    def current(cls) -> TaskInfo:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:
            raise PipelineError("a pidlease writer runs only inside a Spark task")
        batch = tc.getLocalProperty("streaming.sql.batchId")
        return cls(
            tc.partitionId(),
            tc.attemptNumber(),
            int(batch) if batch is not None else None,
            tc.getLocalProperty("sql.streaming.queryId"),
        )


@dataclass
class PartitionCommit(WriterCommitMessage):
    """What one successful attempt did. ``rows == skipped + sent`` and
    ``sent == appended + duplicates``."""

    spark_partition: int
    attempt: int
    producer_name: str
    batch_id: int | None = None
    speculative: bool = False
    pid: int = -1
    generation: int = -1
    rows: int = 0
    skipped: int = 0  # written by an earlier attempt (at or below the durable highwater)
    sent: int = 0
    appended: int = 0
    duplicates: int = 0  # sent, but the partition already had it
    sequences: dict[int, list[int]] = field(
        default_factory=dict
    )  # topic partition -> [first, last]
    fenced_attempts: list[dict[str, Any]] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def takeover_record(
    task: TaskInfo, pid: int, generation: int, written: Mapping[int, int]
) -> dict[str, Any] | None:
    """The earlier attempt this one fenced, as far as it can tell: a Spark retry or
    speculative copy (attempt > 0) whose lease found rows of this task already durable
    (``written``: topic partition -> the PID's durable highwater) took an earlier
    attempt's name over, and the takeover raised the generation by one. An earlier
    attempt that made nothing durable leaves no trace to tell it by, and is not counted.
    In a stream only this micro-batch's ids count: the producer wrote earlier batches."""
    floor = 0 if task.batch_id is None else task.batch_id << STREAM_POSITION_BITS
    durable = [h - floor + 1 for h in written.values() if h >= floor]
    if task.attempt == 0 or not durable:
        return None
    return {
        "pid": pid,
        "generation": generation - 1,
        "fenced_by_attempt": task.attempt,
        "durable_rows": sum(durable),  # ids are consecutive per topic partition from floor
    }


def job_name_for(settings: WriteSettings, task: TaskInfo) -> str:
    if settings.job_name:
        return settings.job_name
    if task.query_id:
        return f"stream-{task.query_id}"
    raise PipelineError("no job_name option and no streaming query id to name the producers by")


class Attempt:
    def __init__(
        self,
        settings: WriteSettings,
        task: TaskInfo,
        *,
        on_leased: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.task = task
        self.name = producer_name(job_name_for(settings, task), task.spark_partition)
        self._on_leased = on_leased

    def _open(self) -> AsyncProducer:
        s = self.settings
        return AsyncProducer(
            s.coordinator,
            topic=s.topic,
            producer_name=self.name,
            expire_ms=s.expire_ms,
            max_in_flight=s.max_in_flight,
            linger_ms=s.linger_ms,
            batch_records_max=s.batch_records_max,
            api_token=s.api_token,
        )

    def _fenced(self, commit: PartitionCommit, exc: BaseException) -> AttemptFenced:
        who = "speculative copy" if self.task.speculative else f"attempt {self.task.attempt}"
        return AttemptFenced(
            f"{who} of Spark partition {self.task.spark_partition} was fenced: a newer "
            f"attempt took producer {self.name!r} over and continues its rows "
            f"({exc})",
            commit.figures(),
        )

    def run(
        self,
        rows: Iterable[tuple[bytes | None, bytes]],
        hooks: Mapping[int, Callable[[], Any]] | None = None,
    ) -> PartitionCommit:
        """Publish ``rows`` (this Spark partition's (key, value) pairs, in order).
        ``hooks[position]()`` runs just before the row at that position (fault injection);
        when it returns an awaitable, the attempt awaits it (on its event loop, so what was
        sent goes on being delivered and the lease renewed).

        The SDK's ``AsyncProducer`` runs on this thread's own event loop: about three times
        the throughput of the blocking ``Producer``, which hands every record to another
        thread under a lock."""
        it = iter(rows)
        first = next(it, None)
        if first is None:
            # An empty partition (common in micro-batches) leases nothing: a lease would be
            # a takeover, with a fence record in every partition, for no row.
            t = self.task
            return PartitionCommit(
                t.spark_partition, t.attempt, self.name, t.batch_id, t.speculative
            )
        return asyncio.run(self._run(itertools.chain([first], it), hooks or {}))

    async def _run(
        self, rows: Iterable[tuple[bytes | None, bytes]], hooks: Mapping[int, Callable[[], Any]]
    ) -> PartitionCommit:
        t = self.task
        commit = PartitionCommit(t.spark_partition, t.attempt, self.name, t.batch_id, t.speculative)
        producer = self._open()
        try:
            await producer.start()
        except errors.ProducerFenced as exc:  # a concurrent takeover won the lease race
            await producer.close()
            raise self._fenced(commit, exc) from exc
        if self._on_leased is not None:
            self._on_leased()
        pending: deque[asyncio.Future[Any]] = deque()
        ok = False
        try:
            commit.pid, commit.generation = producer.pid, producer.generation
            partitions = producer.partitions
            resume = Resume({tp: producer.last_sequence_id(tp) for tp in range(partitions)})
            fenced = takeover_record(t, commit.pid, commit.generation, resume.last_sequence)
            if fenced is not None:
                commit.fenced_attempts.append(fenced)
            sequencer = (
                BatchSequencer(partitions) if t.batch_id is None else StreamSequencer(t.batch_id)
            )
            seqs = commit.sequences
            for rec in plan(
                rows,
                routing=self.settings.routing,
                spark_partition=t.spark_partition,
                partitions=partitions,
                sequencer=sequencer,
                resume=resume,
            ):
                if hooks:
                    hook = hooks.get(rec.position)
                    if hook is not None:
                        pause = hook()
                        if pause is not None:  # a stall: the producer keeps running meanwhile
                            await pause
                commit.rows += 1
                span = seqs.get(rec.topic_partition)
                if span is None:
                    seqs[rec.topic_partition] = [rec.sequence, rec.sequence]
                else:
                    span[1] = rec.sequence
                if rec.written:
                    commit.skipped += 1
                    continue
                pending.append(
                    await producer.send(
                        rec.value, rec.key, partition=rec.topic_partition, sequence_id=rec.sequence
                    )
                )
                commit.sent += 1
                if not commit.sent % YIELD_EVERY_RECORDS:
                    # send() only waits when the buffer is full; let the senders run sooner.
                    await asyncio.sleep(0)
                    while pending and pending[0].done():
                        _count(pending.popleft(), commit)
            await producer.flush()
            while pending:
                _count(pending.popleft(), commit)
            ok = True
        except errors.ProducerFenced as exc:
            while pending and pending[0].done() and pending[0].exception() is None:
                _count(pending.popleft(), commit)
            raise self._fenced(commit, exc) from exc
        finally:
            await producer.close(timeout_ms=None if ok else CLOSE_TIMEOUT_MS)
            for fut in pending:  # mark failures as seen, so asyncio does not log each one
                if fut.done() and not fut.cancelled():
                    fut.exception()
        log.info(
            "%s: %d rows, %d skipped, %d appended, %d duplicates",
            self.name,
            commit.rows,
            commit.skipped,
            commit.appended,
            commit.duplicates,
        )
        return commit


def _count(fut: Any, commit: PartitionCommit) -> None:
    meta = fut.result()  # raises the producer's fatal error, e.g. ProducerFenced
    if meta.duplicate:
        commit.duplicates += 1
    else:
        commit.appended += 1
