"""One attempt at writing one Spark task's rows: what a writer task runs.

The rows of a task fall into buckets (``pidlease.spark.sequencing``); each bucket publishes as
its named producer ``<job>:<bucket>/<buckets>``, and the shuffle ``pidlease.spark.bucketed``
adds puts every row of a bucket in one task (a plain DataFrame: the task's Spark
partition is its one bucket, producer ``<job>:<partition>``). An attempt leases the
producer of every bucket it holds: for a retry or a speculative copy that is a takeover,
which fences every older attempt of the same task. The lease reports, per topic
partition, the PID's durable highwater; rows at or below it were written by an earlier
attempt and are skipped (``Resume``). The rest are sent with explicit sequence ids,
pipelined through the SDK's ``AsyncProducer``, and counted as they are acknowledged:
appended, or duplicate (the partition already had it). ``pidlease.spark.columnar`` holds the
write itself.

A fenced attempt stops at once and closes its producers; what it sent before the fence
is either in the log (and the newer attempt skips it) or was refused. It then waits
until the newer attempt has made every row of the task durable (``GET /v1/pids/{pid}``)
and ends as a no-op success (``fenced=True``, counted apart by the driver), never as a
task failure: Spark counts failures toward ``spark.task.maxFailures``, and a skewed task
whose copies fence one another would abort the job. A fenced attempt whose rows are not
all durable within ``FENCED_WAIT_S`` (the newer attempt died too) fails with
``AttemptFenced`` and Spark retries the task.

The result is a ``PartitionCommit``, the ``WriterCommitMessage`` that Spark brings back to
the driver, where ``pidlease.spark.job_report`` adds them up.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from pidlease.client.lease_client import LeaseClient
from pidlease.client.producer import AsyncProducer
from pidlease.spark.errors import AttemptFenced, PipelineError
from pidlease.spark.options import WriteSettings
from pidlease.spark.sequencing import STREAM_POSITION_BITS, plain_producer_name, producer_name

log = logging.getLogger("pidlease.spark.attempt")

CLOSE_TIMEOUT_MS = 10_000  # a failing attempt waits this long for its in-flight batches
FENCED_WAIT_S = 900.0  # a fenced attempt waits this long for the newer one's rows
FENCED_POLL_S = 0.5


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
    producer_name: str  # the producers' names, comma-separated (one per bucket)
    batch_id: int | None = None
    speculative: bool = False
    fenced: bool = False  # fenced; a newer attempt wrote the rest: a no-op for the job
    buckets: list[int] = field(default_factory=list)
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
    pids: dict[int, list[int]] = field(default_factory=dict)  # bucket -> [pid, generation]

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


class SharedTransport:
    """One HTTP transport (connection pool, TLS context) to the coordinator for all the
    producers of an attempt, which closes only when the attempt does: an ``httpx`` client
    of its own per producer cost ~0.15 s of CPU each (loading the default CA bundle),
    which a task with one producer per bucket paid per bucket. Plain ``http://`` only; an
    ``https://`` coordinator keeps the SDK's own client per producer (its TLS settings)."""

    def __init__(self, coordinator: str) -> None:
        import httpx

        self.real: Any = None
        self.view: Any = None
        if not coordinator.lower().startswith("http://"):
            return
        real = self.real = httpx.AsyncHTTPTransport(verify=False)  # plain http: no TLS

        class _View(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                return await real.handle_async_request(request)

            async def aclose(self) -> None:  # each producer's client closes its view only
                return None

        self.view = _View()

    async def aclose(self) -> None:
        if self.real is not None:
            await self.real.aclose()


def job_name_for(settings: WriteSettings, task: TaskInfo) -> str:
    if settings.job_name:
        return settings.job_name
    if task.query_id:
        return f"stream-{task.query_id}"
    raise PipelineError("no job_name option and no streaming query id to name the producers by")


class Attempt:
    """What every attempt shares: who it is, its producers by bucket, and what it does
    when fenced. The write is ``pidlease.spark.columnar.ColumnarAttempt``."""

    def __init__(
        self,
        settings: WriteSettings,
        task: TaskInfo,
        *,
        on_leased: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.task = task
        self.job = job_name_for(settings, task)
        self._on_leased = on_leased

    def name(self, bucket: int) -> str:
        if not self.settings.bucketed:  # a plain DataFrame: the bucket is the Spark partition
            return plain_producer_name(self.job, bucket)
        return producer_name(self.job, bucket, self.settings.buckets)

    def new_commit(self, buckets: list[int]) -> PartitionCommit:
        t = self.task
        return PartitionCommit(
            t.spark_partition,
            t.attempt,
            ",".join(self.name(b) for b in buckets),
            t.batch_id,
            t.speculative,
            buckets=list(buckets),
        )

    def _open(self, name: str) -> AsyncProducer:
        s = self.settings
        return AsyncProducer(
            s.coordinator,
            topic=s.topic,
            producer_name=name,
            expire_ms=s.expire_ms,
            max_in_flight=s.max_in_flight,
            linger_ms=s.linger_ms,
            batch_records_max=s.batch_records_max,
            api_token=s.api_token,
            http_transport=self.coordinator_transport,
        )

    coordinator_transport: Any = None  # shared by the attempt's producers (see below)

    def _fenced(self, commit: PartitionCommit, exc: BaseException) -> AttemptFenced:
        who = "speculative copy" if self.task.speculative else f"attempt {self.task.attempt}"
        return AttemptFenced(
            f"{who} of Spark partition {self.task.spark_partition} was fenced: a newer "
            f"attempt took producer(s) {commit.producer_name!r} over and continues its "
            f"rows ({exc})",
            commit.figures(),
        )

    def durable_highwaters(self, pid: int) -> dict[int, int]:
        """The PID's live durable highwater per partition of the topic (the coordinator
        asks the leaders): what a fenced attempt watches."""
        s = self.settings
        with LeaseClient(s.coordinator, api_token=s.api_token) as client:
            view = client.call("GET", f"/v1/pids/{pid}")
        return {
            int(p["partition"]): int(p["highwater"])
            for p in view.get("partitions", [])
            if p.get("topic") == s.topic
        }

    def await_newer(
        self,
        commit: PartitionCommit,
        fenced: AttemptFenced,
        planned_last: Mapping[int, Mapping[int, int]],
    ) -> PartitionCommit:
        """After a fence: wait until every planned id (bucket -> topic partition -> last
        id) is durable under its producer's PID (the newer attempt wrote it), then end as
        a no-op success; raise ``fenced`` if that does not happen in ``FENCED_WAIT_S``."""
        deadline = time.monotonic() + FENCED_WAIT_S
        while True:
            done = True
            for bucket, lasts in planned_last.items():
                pid = commit.pids.get(bucket, [-1])[0]
                if pid < 0:  # fenced before its lease: nothing to watch by
                    raise fenced
                try:
                    hw = self.durable_highwaters(pid)
                except Exception:  # noqa: BLE001 - coordinator busy: ask again
                    done = False
                    break
                if any(hw.get(tp, -1) < last for tp, last in lasts.items()):
                    done = False
                    break
            if done:
                commit.fenced = True
                commit.sent = commit.appended + commit.duplicates  # what it did deliver
                commit.skipped = commit.rows - commit.sent  # the newer attempt's
                log.warning(
                    "%s: fenced by a newer attempt, which made all %d rows durable; "
                    "this attempt ends as a no-op",
                    commit.producer_name,
                    commit.rows,
                )
                return commit
            if time.monotonic() > deadline:
                raise fenced
            time.sleep(FENCED_POLL_S)
