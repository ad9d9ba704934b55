"""One attempt at writing one Spark task's rows: who it is, its producers' leases, what it
does when fenced. ``pidlease.spark.columnar.ColumnarAttempt`` is the write itself.

The rows of a task fall into buckets (``pidlease.spark.sequencing``); each bucket publishes as
its named producer ``<job>:<bucket>/<buckets>``, and the shuffle ``pidlease.spark.bucketed``
adds puts every row of a bucket in one task (a plain DataFrame: the task's Spark
partition is its one bucket, producer ``<job>:<partition>``). An attempt leases the
producer of every bucket it holds (``Attempt.lease``): by name, which for a known name is
a takeover that fences every older holder (a fence record in each partition the PID has
used). The lease reports, per topic partition, the PID's durable highwater; rows at or
below it were written by an earlier attempt and are skipped (``Resume``). The rest are
sent with explicit sequence ids, pipelined through the SDK's ``AsyncProducer``, and
counted as they are acknowledged: appended, or duplicate (the partition already had it).

A stream does not fence in every micro-batch (issue 26): the first attempt of a
micro-batch's task renews each producer at its current generation (``current_leases``:
looked up by name; ``SharedTransport`` sends the producer's first lease as that renewal,
``resumed_lease``) instead of taking it over, which writes no fence record. Another
holder of that generation wrote an earlier micro-batch, whose ids are all below this
one's (``batch_id * 2**32 + position``; a micro-batch starts once the one before it is
durable). When ids of *this* micro-batch are already durable (a replay after a restart,
whose earlier run may still have a writer), the attempt takes the producer over after
all (``replayed``): a takeover per producer per restart, not per micro-batch. A retry
or a speculative copy (attempt > 0) takes over, fencing the attempts before it; a
renewal answered FENCED (a takeover came in between) or UNKNOWN_PID falls back to a
takeover.

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

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pidlease.client.producer import AsyncProducer
from pidlease.spark.errors import AttemptFenced, PipelineError
from pidlease.spark.options import WriteSettings
from pidlease.spark.sequencing import STREAM_POSITION_BITS, plain_producer_name, producer_name

log = logging.getLogger("pidlease.spark.attempt")

CLOSE_TIMEOUT_MS = 10_000  # a failing attempt waits this long for its in-flight batches
FENCED_WAIT_S = 900.0  # a fenced attempt waits this long for the newer one's rows
FENCED_POLL_S = 0.5
PIDS_LOOKUP_MAX = 1000  # names found by one search (the name is in longer names too)


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


def resumed_lease(body: bytes, resume: dict[str, tuple[int, int]]) -> bytes | None:
    """A producer's first lease (``pid -1`` and its name) as a renewal of the run's lease of
    that name (``pid`` and ``generation`` given: no takeover, no fence), once per name
    (``resume`` loses the name); None for any other request."""
    try:
        req = json.loads(body)
    except ValueError:
        return None
    if not isinstance(req, dict) or req.get("pid") != -1 or "generation" in req:
        return None
    held = resume.pop(str(req.get("producer_name")), None)
    if held is None:
        return None
    req["pid"], req["generation"] = held
    return json.dumps(req).encode()


class SharedTransport:
    """One HTTP transport (connection pool, TLS context) to the coordinator for all the
    producers of an attempt, which closes only when the attempt does: an ``httpx`` client
    of its own per producer cost ~0.15 s of CPU each (loading the default CA bundle),
    which a task with one producer per bucket paid per bucket. Plain ``http://`` only; an
    ``https://`` coordinator keeps the SDK's own client per producer (its TLS settings),
    and its producers take over where a run lease would have been renewed.

    ``resume`` (producer name -> the run's pid and generation): the first lease of each of
    these names goes out as a renewal at that generation (``resumed_lease``); the names
    renewed so are in ``resumed``."""

    def __init__(
        self, coordinator: str, resume: Mapping[str, tuple[int, int]] | None = None
    ) -> None:
        import httpx

        self.real: Any = None
        self.view: Any = None
        self.resumed: set[str] = set()
        if not coordinator.lower().startswith("http://"):
            return
        self.real = httpx.AsyncHTTPTransport(verify=False)  # plain http: no TLS
        todo = dict(resume or {})
        owner = self

        class _View(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                if todo and request.method == "POST" and request.url.path == "/v1/lease_pid":
                    body = resumed_lease(await request.aread(), todo)
                    if body is not None:
                        owner.resumed.add(json.loads(body)["producer_name"])
                        headers = [
                            (k, v) for k, v in request.headers.raw if k.lower() != b"content-length"
                        ]
                        request = httpx.Request(
                            request.method,
                            request.url,
                            headers=headers,
                            content=body,
                            extensions=request.extensions,
                        )
                response: httpx.Response = await owner.real.handle_async_request(request)
                return response

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
    """What every attempt shares: who it is, its producers by bucket (leased, resumed,
    closed), and what it does when fenced. The write is
    ``pidlease.spark.columnar.ColumnarAttempt``."""

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
        # bucket -> topic partition -> the PID's durable highwater when it was leased
        self.durable: dict[int, dict[int, int]] = {}

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

    def renews(self) -> bool:
        """Whether this attempt renews its producers' current leases instead of taking
        them over: the first attempt of a micro-batch's task only (a retry or a
        speculative copy must fence the attempts before it; a batch write has no earlier
        micro-batch to share a generation with)."""
        t = self.task
        return t.batch_id is not None and t.attempt == 0 and not t.speculative

    def current_leases(self, names: list[str]) -> dict[str, tuple[int, int]]:
        """The PID and current generation of each of ``names`` the coordinator knows
        (``GET /v1/pids``, searched by name: a task holds a few buckets); a name it does
        not list is leased by name (created, or taken over)."""
        s = self.settings
        found: dict[str, tuple[int, int]] = {}
        with LeaseClient(s.coordinator, api_token=s.api_token) as client:
            for name in names:
                view = client.call("GET", "/v1/pids", params={"q": name, "limit": PIDS_LOOKUP_MAX})
                for v in view.get("pids", []):
                    if v.get("producer_name") == name:
                        found[name] = (int(v["pid"]), int(v["generation"]))
        return found

    def _open(self, name: str, transport: SharedTransport) -> AsyncProducer:
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
            http_transport=transport.view,
        )

    async def _start(self, name: str, transport: SharedTransport) -> AsyncProducer:
        """``name``'s producer, leased: renewed at the run's generation when the
        transport resumes it, else taken over (or created). A renewal answered FENCED (a
        retry or copy took the producer over since) or UNKNOWN_PID (its state expired)
        falls back to a takeover."""
        producer = self._open(name, transport)
        try:
            return await producer.start()
        except (errors.ProducerFenced, errors.UnknownPid) as exc:
            await producer.close()
            if name not in transport.resumed:
                raise
            log.info("%s: the run's lease was not renewed (%s): taking it over", name, exc)
        except BaseException:
            await producer.close()
            raise
        producer = self._open(name, transport)  # the transport resumes a name once
        try:
            return await producer.start()
        except BaseException:
            await producer.close()
            raise

    async def lease(self, buckets: list[int], commit: PartitionCommit) -> dict[int, AsyncProducer]:
        """The producers of ``buckets``, all leased over one transport (the run's leases
        renewed where ``renews`` allows), with their PIDs, generations and the earlier
        attempt a takeover fenced recorded in ``commit``; a takeover by another attempt
        that wins the race raises ``AttemptFenced``. ``close`` ends them."""
        names = [self.name(b) for b in buckets]
        renew = await asyncio.to_thread(self.current_leases, names) if self.renews() else {}
        transport = self._transport = SharedTransport(self.settings.coordinator, renew)
        started = await asyncio.gather(
            *(self._start(n, transport) for n in names), return_exceptions=True
        )
        producers = {
            b: p for b, p in zip(buckets, started, strict=True) if not isinstance(p, BaseException)
        }
        failed = [e for e in started if isinstance(e, BaseException)]
        if not failed:
            # A replay: ids of this micro-batch are durable already, written by an
            # earlier run (or stage attempt) that may still have a writer: fence it.
            again = [b for b, p in producers.items() if self.replayed(p, transport)]
            for b in again:
                await producers.pop(b).close()
            retaken = await asyncio.gather(
                *(self._start(self.name(b), transport) for b in again), return_exceptions=True
            )
            producers.update(
                (b, p)
                for b, p in zip(again, retaken, strict=True)
                if not isinstance(p, BaseException)
            )
            failed = [e for e in retaken if isinstance(e, BaseException)]
        if failed:
            await self.close(producers, ok=False)
            if isinstance(failed[0], errors.ProducerFenced):
                raise self._fenced(commit, failed[0]) from failed[0]
            raise failed[0]
        producers = {b: producers[b] for b in buckets}  # in bucket order
        if self._on_leased is not None:
            self._on_leased()
        first = producers[buckets[0]]
        commit.pid, commit.generation = first.pid, first.generation
        earlier: dict[str, Any] | None = None
        for b, p in producers.items():
            commit.pids[b] = [p.pid, p.generation]
            # The attempt that fenced an earlier one records it (the loser's no-op message
            # may be the one Spark keeps, or none at all): one entry for the earlier
            # attempt, its durable rows added up over the buckets.
            last = self.durable[b] = {tp: p.last_sequence_id(tp) for tp in range(p.partitions)}
            fenced = takeover_record(self.task, p.pid, p.generation, last)
            if fenced is not None and earlier is None:
                earlier = fenced
            elif fenced is not None and earlier is not None:
                earlier["durable_rows"] += fenced["durable_rows"]
        if earlier is not None:
            commit.fenced_attempts.append(earlier)
        return producers

    def replayed(self, producer: AsyncProducer, transport: SharedTransport) -> bool:
        """Whether ``producer``, renewed rather than taken over, already holds ids of this
        micro-batch."""
        t = self.task
        if t.batch_id is None or producer.producer_name not in transport.resumed:
            return False
        floor = t.batch_id << STREAM_POSITION_BITS
        return any(producer.last_sequence_id(tp) >= floor for tp in range(producer.partitions))

    async def close(self, producers: Mapping[int, AsyncProducer], *, ok: bool) -> None:
        """Close every producer, then the transport: after a success each delivers what it
        was sent; after a failure each waits at most ``CLOSE_TIMEOUT_MS`` for its batches
        in flight."""
        await asyncio.gather(
            *(p.close(timeout_ms=None if ok else CLOSE_TIMEOUT_MS) for p in producers.values()),
            return_exceptions=True,
        )
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None

    _transport: SharedTransport | None = None  # the coordinator transport of ``lease``

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
