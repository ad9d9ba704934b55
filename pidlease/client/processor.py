"""``Processor`` / ``AsyncProcessor``: read a topic, write a function of it to another topic
(or another cluster), effectively once across crashes, restarts and takeovers.

The rules are the pure functions at the top (``output_sequence``, ``resume_plan``,
``output_partition``, ``producer_name``, ``assigned_partitions``); the classes below only
move records. ``docs/processing.md`` is the argument for why they are enough.

- Input partition ``p`` is processed by one named producer on the output topic,
  ``producer_name(name, input_topic, p)``, and all its outputs go to output partition
  ``p % output_partitions`` (the mirror: ``p`` itself). One producer, one output
  partition: the output partition's per-PID sequence is the whole record of progress.
- Output ``i`` of the ``k`` outputs of input record ``o`` has sequence id
  ``o * fanout_max + i`` for ``i < k - 1``; the last one has ``o * fanout_max +
  fanout_max - 1`` (the *end mark*). Ids grow with the input order, so the output topic
  must be ``monotonic`` (holes: input records with fewer outputs, control offsets).
- At start the producer's ``last_sequence_id(q)`` (everything any holder of the name
  wrote, the takeover fenced before it answered) says where to resume: nothing written:
  at the input's log start; the end mark of ``o``: at ``o + 1``; output ``i`` of ``o``
  without its end mark: at ``o`` again, sending only its outputs after ``i``.
- By default (``uses_group``) instances sharing a ``name`` share the input partitions
  through a consumer group (``processor_group(name)``, the partition servers' Kafka group
  coordinator, on by default, found through the coordinator's server registry;
  ``pidlease.client.consumer``): the group hands each member its partitions, and a member
  that dies (no heartbeat for ``session_timeout_ms``) loses them to the others, whose
  producers lease the same names and so fence whatever the dead (or only paused) member
  still had in flight before they read ``last_sequence_id``. A member fenced on a
  partition the group still gives it leaves that partition alone for ``FENCED_RETRY_S``.
  The group only decides who works; what is written is decided by the names and the
  resume rule alone, so a race between two members costs time, not records.
- Static assignment instead (``group=False``, or any of ``partitions``, ``instances`` or
  ``until_caught_up``): the instance takes ``instance`` of ``instances`` (or an explicit
  ``partitions`` list; default all); for clusters without a Kafka listener, one-shot
  catch-up runs, and pinning partitions to hosts. Starting an instance on partitions
  another holds takes their names over, which fences the other: it stops with
  ``ProducerFenced``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pidlease import errors
from pidlease.client.batch_future import AsyncBatchFuture
from pidlease.client.lease_client import LeaseClient
from pidlease.client.producer import AsyncProducer
from pidlease.client.reader import Reader
from pidlease.wire.protocol import Record

Output = tuple[bytes | str | None, bytes | str]
ProcessFn = Callable[[Record], Iterable[Output]]

log = logging.getLogger("pidlease.processor")

FANOUT_MAX_LIMIT = 1 << 16
CHUNK_RECORDS = 2000  # input records pulled from the reader per step
PENDING_CALLS_MAX = 64  # send_batch calls in flight per partition before waiting for one
FENCED_RETRY_S = 20.0  # group mode: a partition fenced away from us is left alone this long


# -- the rules ---------------------------------------------------------------------------
def producer_name(name: str, input_topic: str, partition: int) -> str:
    """The producer name that owns input partition ``partition``'s outputs."""
    return f"{name}/{input_topic}/{partition}"


def processor_group(name: str) -> str:
    """The consumer group of the instances named ``name`` (``group=True``)."""
    return f"pidlease-processor/{name}"


def uses_group(
    group: bool | None, *, partitions: object = None, instances: int = 1, until_caught_up: bool
) -> bool:
    """Whether a processor joins its consumer group: ``group`` when given (True with a
    static flag is a ``ConfigError``); by default yes, unless a static flag says which
    partitions to take (``partitions``, ``instances``) or the run is a one-shot catch-up
    (``until_caught_up``: "everything the input held at start" is a property of all the
    partitions this instance takes, which a group may change under it)."""
    static = partitions is not None or instances != 1 or until_caught_up
    if group is None:
        return not static
    if group and static:
        raise errors.ConfigError(
            "group=True: the group assigns the partitions; partitions, instances and "
            "until_caught_up need the static assignment (group=False)"
        )
    return bool(group)


def may_retake(now_s: float, fenced_at_s: float, fenced_generation: int, generation: int) -> bool:
    """Group mode: may a member start a partition again that it was fenced on (another
    instance took it over) while the group still gave it to this member? Once the group
    moved on (a new generation: the assignment was recomputed with everyone's view), or
    after ``FENCED_RETRY_S`` (the other holder had time to learn it lost the partition);
    not before, or two members would take the partition from each other in turn."""
    return generation != fenced_generation or now_s - fenced_at_s >= FENCED_RETRY_S


def output_partition(input_partition: int, output_partitions: int) -> int:
    """Where the outputs of ``input_partition`` go: one output partition per input one."""
    return input_partition % output_partitions


def output_sequence(offset: int, index: int, count: int, fanout_max: int) -> int:
    """Sequence id of output ``index`` of the ``count`` outputs of the input record at
    ``offset``: ``offset * fanout_max + index``, the last one at index ``fanout_max - 1``
    (the end mark: "every output of this record is written")."""
    if not 0 <= index < count <= fanout_max:
        raise errors.ConfigError(
            f"output {index} of {count}: a record may have at most fanout_max={fanout_max}"
        )
    return offset * fanout_max + (fanout_max - 1 if index == count - 1 else index)


@dataclass(frozen=True)
class ResumePlan:
    """Where an input partition resumes: ``offset`` (None: the input's log start, nothing
    was written) and, for the record at ``offset``, the last output index already written
    (-1: none), whose outputs up to it are not sent again."""

    offset: int | None
    written_index: int = -1


def resume_plan(last_sequence_id: int, fanout_max: int) -> ResumePlan:
    """The resume rule: from the output partition's ``last_sequence_id`` of the name."""
    if last_sequence_id < 0:
        return ResumePlan(None)
    offset, index = divmod(last_sequence_id, fanout_max)
    if index == fanout_max - 1:
        return ResumePlan(offset + 1)
    return ResumePlan(offset, index)


def outputs_to_send(
    offset: int, outputs: list[Output], fanout_max: int, plan: ResumePlan
) -> list[tuple[int, Output]]:
    """The (sequence id, output) pairs of the record at ``offset`` still to send under
    ``plan``: all of them, except for the record the plan resumes inside."""
    k = len(outputs)
    pairs = [(output_sequence(offset, i, k, fanout_max), out) for i, out in enumerate(outputs)]
    if plan.offset == offset and plan.written_index >= 0:
        done = offset * fanout_max + plan.written_index
        pairs = [(s, o) for s, o in pairs if s > done]
    return pairs


def assigned_partitions(
    partitions: int, *, instance: int = 0, instances: int = 1, explicit: Iterable[int] | None = None
) -> list[int]:
    """The input partitions an instance processes: ``explicit`` when given, else every
    ``p`` with ``p % instances == instance``."""
    if explicit is not None:
        chosen = sorted(set(explicit))
        bad = [p for p in chosen if not 0 <= p < partitions]
        if bad or not chosen:
            raise errors.ConfigError(
                f"partitions {bad or chosen} are not in 0..{partitions - 1} of the input"
            )
        return chosen
    if not 0 <= instance < instances:
        raise errors.ConfigError(f"instance must be in 0..{instances - 1}, not {instance}")
    return [p for p in range(partitions) if p % instances == instance]


def records_lost(
    topic: str, partition: int, position: int, exc: errors.OffsetOutOfRange
) -> errors.OffsetOutOfRange:
    """The error for an input position retention deleted before it was processed."""
    earliest = exc.extra.get("earliest")
    upto = f"{earliest - 1}" if isinstance(earliest, int) else "?"
    new = errors.OffsetOutOfRange(
        f"records lost at the source: {topic!r} partition {partition} next offset to "
        f"process is {position} but the log starts at {earliest}: retention deleted "
        f"offsets {position}..{upto} before "
        "they were processed; nothing was skipped (restart from the log start with a new "
        "name to accept the loss)",
        earliest=earliest,
        latest=exc.extra.get("latest"),
    )
    new.__cause__ = exc
    return new


# -- the engine ----------------------------------------------------------------------------
@dataclass
class PartitionProgress:
    """What one input partition's worker has done (read by progress printers, metrics)."""

    partition: int
    position: int = -1  # next input offset to process
    high_watermark: int = -1  # the input's, at the last fetch
    processed: int = 0  # input records handed to the producer by this run
    written: int = 0  # outputs acknowledged in this run (duplicates included)
    caught_up: bool = False

    @property
    def lag(self) -> int:
        """Input records not processed yet, as of the last fetch (-1: unknown)."""
        if self.high_watermark < 0 or self.position < 0:
            return -1
        return max(0, self.high_watermark - self.position)


@dataclass
class _Side:
    url: str
    api_token: str | None = None
    tls_ca_file: str | None = None


@dataclass
class ProcessorStats:
    partitions: dict[int, PartitionProgress] = field(default_factory=dict)

    @property
    def lag(self) -> int:
        lags = [p.lag for p in self.partitions.values()]
        return -1 if any(x < 0 for x in lags) else sum(lags)


class AsyncProcessor:
    """The processor on the running event loop: ``await AsyncProcessor(...).run()``.
    See ``Processor`` for the arguments."""

    def __init__(
        self,
        url: str,
        input_topic: str,
        output_topic: str,
        name: str,
        fn: ProcessFn,
        *,
        output_url: str | None = None,
        fanout_max: int = 1,
        partitions: Iterable[int] | None = None,
        instance: int = 0,
        instances: int = 1,
        until_caught_up: bool = False,
        group: bool | None = None,
        session_timeout_ms: int = 10_000,
        api_token: str | None = None,
        tls_ca_file: str | None = None,
        output_api_token: str | None = None,
        output_tls_ca_file: str | None = None,
        poll_interval_ms: float = 200,
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        if not name or not input_topic or not output_topic:
            raise errors.ConfigError("a processor needs a name, an input and an output topic")
        if type(fanout_max) is not int or not 1 <= fanout_max <= FANOUT_MAX_LIMIT:
            raise errors.ConfigError(f"fanout_max must be 1..{FANOUT_MAX_LIMIT}")
        self.input = _Side(url, api_token, tls_ca_file)
        self.output = _Side(
            output_url or url,
            output_api_token if output_url else (output_api_token or api_token),
            output_tls_ca_file if output_url else (output_tls_ca_file or tls_ca_file),
        )
        self.input_topic, self.output_topic, self.name, self.fn = (
            input_topic,
            output_topic,
            name,
            fn,
        )
        self.group = uses_group(
            group, partitions=partitions, instances=instances, until_caught_up=until_caught_up
        )
        self._session_timeout_ms = session_timeout_ms
        self.fanout_max = fanout_max
        self._explicit = None if partitions is None else list(partitions)
        self._instance, self._instances = instance, instances
        self.until_caught_up = until_caught_up
        self._poll_s = poll_interval_ms / 1000
        self._producer_options = dict(producer_options or {})
        self.stats = ProcessorStats()
        self._stop = asyncio.Event()
        self._stops: dict[int, asyncio.Event] = {}  # per partition task: stop it alone
        self._pool: ThreadPoolExecutor | None = None

    def stop(self) -> None:
        """Ask ``run`` to finish: what was handed to the producers is delivered first."""
        self._stop.set()
        for e in self._stops.values():
            e.set()

    async def run(self) -> ProcessorStats:
        """Process until stopped (or, with ``until_caught_up``, until every assigned input
        partition is processed up to its high watermark at start). Raises
        ``ProducerFenced`` when another instance took a partition over, and
        ``OffsetOutOfRange`` when retention deleted input records before they were
        processed."""
        with LeaseClient(
            self.input.url, api_token=self.input.api_token, tls_ca_file=self.input.tls_ca_file
        ) as c:
            info = c.topic(self.input_topic, offsets=False)
        if self.group:
            return await self._run_group(info.partitions)
        mine = assigned_partitions(
            info.partitions,
            instance=self._instance,
            instances=self._instances,
            explicit=self._explicit,
        )
        for p in mine:
            self.stats.partitions[p] = PartitionProgress(p)
        self._pool = ThreadPoolExecutor(max_workers=len(mine), thread_name_prefix="processor")
        tasks = [asyncio.create_task(self._partition(p)) for p in mine]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._pool.shutdown(wait=False, cancel_futures=True)
        return self.stats

    async def _run_group(self, partitions: int) -> ProcessorStats:
        """Group mode: start a partition's task when the group gives it, stop it when the
        group takes it away; a fenced partition is someone else's for now."""
        from pidlease.client.consumer import Consumer  # the Kafka schemas load on use

        loop = asyncio.get_running_loop()
        member = ThreadPoolExecutor(max_workers=1, thread_name_prefix="processor-group")
        self._pool = ThreadPoolExecutor(
            max_workers=2 * partitions + 1, thread_name_prefix="processor"
        )
        consumer = Consumer(
            self.input.url,
            [self.input_topic],
            processor_group(self.name),
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(100, self._session_timeout_ms // 10),
            api_token=self.input.api_token,
            tls_ca_file=self.input.tls_ca_file,
        )
        tasks: dict[int, asyncio.Task[None]] = {}
        fenced: dict[int, tuple[float, int]] = {}  # partition -> (when, group generation)
        try:
            while not self._stop.is_set():
                try:
                    joined = await loop.run_in_executor(member, consumer.sync_membership)
                except errors.CoordinatorUnavailable as unavailable:
                    raise errors.CoordinatorUnavailable(
                        f"{self.name}: cannot join the consumer group {consumer.group!r}: "
                        f"{unavailable}. Instances share partitions through the partition servers' "
                        "Kafka listener (PIDLEASE_KAFKA_PORT, on by default); without one, "
                        "run with group=False (static assignment)"
                    ) from unavailable
                if joined:
                    log.info(
                        "%s: group generation %d gives this member partitions %s",
                        self.name,
                        consumer.generation,
                        [p for t, p in consumer.assignment if t == self.input_topic],
                    )
                mine = {p for t, p in consumer.assignment if t == self.input_topic}
                for p, t in list(tasks.items()):
                    if not t.done():
                        continue
                    del tasks[p]
                    self.stats.partitions.pop(p, None)
                    exc = None if t.cancelled() else t.exception()
                    if isinstance(exc, errors.ProducerFenced):
                        log.warning(
                            "%s: %s partition %d was taken over by another instance (fenced)",
                            self.name,
                            self.input_topic,
                            p,
                        )
                        fenced[p] = (time.monotonic(), consumer.generation)
                    elif exc is not None:
                        raise exc
                for p in set(tasks) - mine:  # revoked: deliver what was handed over, stop
                    self._stops[p].set()
                now = time.monotonic()
                for p in sorted(mine - set(tasks)):
                    if p in fenced and not may_retake(now, *fenced[p], consumer.generation):
                        continue
                    fenced.pop(p, None)
                    self.stats.partitions[p] = PartitionProgress(p)
                    self._stops[p] = asyncio.Event()
                    tasks[p] = asyncio.create_task(self._partition(p))
                await _sleep_or_stop(self._stop, self._poll_s)
        finally:
            self.stop()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await loop.run_in_executor(member, consumer.close)
            member.shutdown(wait=False)
            self._pool.shutdown(wait=False, cancel_futures=True)
        return self.stats

    async def _partition(self, p: int) -> None:
        prog = self.stats.partitions[p]
        stop = self._stops.setdefault(p, asyncio.Event())
        if self._stop.is_set():
            stop.set()
        target = -1
        if self.until_caught_up:
            # the input's end now, from its leader: "everything the input held at start"
            target = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._end_offset, p
            )
        prod = AsyncProducer(
            self.output.url,
            topic=self.output_topic,
            producer_name=producer_name(self.name, self.input_topic, p),
            api_token=self.output.api_token,
            tls_ca_file=self.output.tls_ca_file,
            **self._producer_options,
        )
        await prod.start()
        try:
            if prod.dedup != "monotonic":
                raise errors.ConfigError(
                    f"output topic {self.output_topic!r} is dedup={prod.dedup}: a processor "
                    "needs a monotonic topic (its sequence ids are input positions, with holes)"
                )
            await self._copy(p, prod, prog, target, stop)
            await prod.flush()
        finally:
            await prod.close(timeout_ms=None if prod.fatal is None else 0)

    def _end_offset(self, p: int) -> int:
        """The input partition's high watermark, asked of its leader (LIST_OFFSETS)."""
        with Reader(
            self.input.url,
            self.input_topic,
            p,
            start="latest",
            api_token=self.input.api_token,
            tls_ca_file=self.input.tls_ca_file,
        ) as rd:
            for _ in rd:
                break
            return rd.position

    async def _copy(
        self, p: int, prod: AsyncProducer, prog: PartitionProgress, target: int, stop: asyncio.Event
    ) -> None:
        q = output_partition(p, prod.partitions)
        last = prod.last_sequence_id(q)
        plan = resume_plan(last, self.fanout_max)
        log.info(
            "%s: %s partition %d resumes at %s (last_sequence_id %d of %s in partition %d)",
            self.name,
            self.input_topic,
            p,
            "the log start" if plan.offset is None else f"offset {plan.offset}",
            last,
            self.output_topic,
            q,
        )
        reader = Reader(
            self.input.url,
            self.input_topic,
            p,
            start_offset=plan.offset or 0,
            start="earliest" if plan.offset is None else None,
            stop_at_end=True,
            api_token=self.input.api_token,
            tls_ca_file=self.input.tls_ca_file,
        )
        puller = _Puller(reader)
        pending: collections.deque[AsyncBatchFuture] = collections.deque()
        loop = asyncio.get_running_loop()
        prog.position = plan.offset if plan.offset is not None else -1
        try:
            while True:
                if stop.is_set():
                    return
                try:
                    chunk, at_end = await loop.run_in_executor(
                        self._pool, puller.pull, CHUNK_RECORDS
                    )
                except errors.OffsetOutOfRange as exc:
                    raise records_lost(self.input_topic, p, reader.position, exc) from None
                prog.position, prog.high_watermark = reader.position, reader.high_watermark
                if chunk:
                    await self._send_chunk(prod, q, chunk, plan, pending)
                    prog.processed += len(chunk)
                while pending and pending[0].done():
                    prog.written += len(pending.popleft().result())
                if at_end:
                    prog.caught_up = prog.position >= target
                    if self.until_caught_up and prog.caught_up:
                        while pending:
                            prog.written += len(await pending.popleft())
                        return
                    if not chunk:
                        await _sleep_or_stop(stop, self._poll_s)
        finally:
            reader.close()

    async def _send_chunk(
        self,
        prod: AsyncProducer,
        q: int,
        chunk: list[Record],
        plan: ResumePlan,
        pending: collections.deque[AsyncBatchFuture],
    ) -> None:
        """Hand one chunk's outputs to the producer: one ``send_batch`` per run of input
        records that share a timestamp (the outputs keep their input's timestamp)."""
        for ts, group in itertools.groupby(chunk, key=lambda r: r.timestamp_ms):
            keys: list[bytes | str | None] = []
            values: list[bytes | str] = []
            seqs: list[int] = []
            fn, fanout = self.fn, self.fanout_max
            for rec in group:
                outs = list(fn(rec))
                if fanout == 1 and len(outs) == 1:
                    # the mirror's case, per record: the id is the offset (output_sequence)
                    k, v = outs[0]
                    keys.append(k)
                    values.append(v)
                    seqs.append(rec.offset)
                    continue
                for seq, (k, v) in outputs_to_send(rec.offset, outs, fanout, plan):
                    keys.append(k)
                    values.append(v)
                    seqs.append(seq)
            if not values:
                continue
            while len(pending) >= PENDING_CALLS_MAX:
                await asyncio.wait([pending[0]])
                pending.popleft().result()
            pending.append(
                await prod.send_batch(
                    values,
                    keys,
                    partition=q,
                    sequence_ids=seqs,
                    timestamp_ms=ts if ts >= 0 else None,
                )
            )
            if pending[0].done():
                pending[0].result()  # a fenced producer: raise now


class _Puller:
    """Pulls input records from a blocking ``Reader`` (on a worker thread)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self._it: Iterator[Record] | None = None

    def pull(self, n: int) -> tuple[list[Record], bool]:
        """Up to ``n`` records, and whether the reader reached the input's end."""
        if self._it is None:
            self._it = iter(self.reader)
        out = list(itertools.islice(self._it, n))
        if len(out) < n:
            self._it = None  # that iteration ended at the high watermark
            return out, True
        return out, False


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class Processor:
    """``Processor(url, input_topic, output_topic, name, fn).run()``: blocking form.

    ``fn(record)`` returns (or yields) the record's outputs as ``(key, value)`` pairs: at
    most ``fanout_max`` of them, and the same ones when called again on the same record
    (a record interrupted half-way is processed again and only its missing outputs are
    sent). Outputs keep their input record's timestamp and go to output partition
    ``p % output_partitions``. ``output_url``: the output's cluster when not ``url``'s
    (with ``output_api_token`` / ``output_tls_ca_file``).

    Instances with the same ``name`` share the input partitions through the consumer group
    ``processor_group(name)`` and take over a dead one's (``session_timeout_ms``), fencing
    it. ``group=False``, or ``partitions`` / ``instance`` of ``instances``: a static
    assignment instead (default: all partitions), without a group (a cluster without a
    Kafka listener, pinned partitions). ``until_caught_up`` (static): return once
    everything the input held at start is processed.
    ``producer_options``: more ``AsyncProducer`` settings (``linger_ms``, ...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._proc: AsyncProcessor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        AsyncProcessor(*args, **kwargs)  # check the arguments now

    @property
    def stats(self) -> ProcessorStats:
        return self._proc.stats if self._proc is not None else ProcessorStats()

    def run(self) -> ProcessorStats:
        async def main() -> ProcessorStats:
            self._proc = AsyncProcessor(*self._args, **self._kwargs)
            self._loop = asyncio.get_running_loop()
            if self._stop_requested:
                self._proc.stop()
            return await self._proc.run()

        return asyncio.run(main())

    def stop(self) -> None:
        """From any thread: finish ``run`` after delivering what was handed over."""
        self._stop_requested = True
        if self._loop is not None and self._proc is not None:
            self._loop.call_soon_threadsafe(self._proc.stop)
