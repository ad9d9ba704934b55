"""The producer SDK: ``AsyncProducer`` (the engine, asyncio) and ``Producer`` (the same
engine on a background thread's event loop, for blocking code).

The engine ties together the lease (``lease_keeper.py``: PID, generation, token,
renewal), the leaders and their connections (``leader_pool.py``), the ``Accumulator``
(``accumulator.py``: each partition's open and closed batches, the one buffer counter)
and one ``PartitionSender`` per partition (``sender.py``: drains its partition's batches,
the in-flight window, resends). Records enter through ``admit`` (validation, partition
choice, sequence-mode checks) and are appended to the accumulator under one lock, so
``Producer.send`` can admit on the caller's thread and raise bad input at once, before
anything is queued. A send waits for buffer space in one loop per class
(``Producer._wait_for_space``, ``AsyncProducer._wait_for_space``).

Fatal errors (fenced, unknown PID, a real out-of-order, unauthorized, invalid) fail every
unresolved future and the producer; later sends raise the same error type. When fenced,
each batch's ``ProducerFenced`` says whether it may have been written (``indeterminate``,
with its partition and sequences; ``sender.PartitionSender.fail_all``).

The senders get their collaborators explicitly (``SenderContext``: the accumulator, the
leader pool, the lease, the settings, the clocks, and callbacks for a fatal error, a
retry, resent batches); they never see the producer, and nothing in the send path calls
back into it. Both classes take the same keywords through one constructor (``_Settings``,
read into one ``ProducerSettings``). The engine's lifecycle is ``ProducerState``
(checked transitions).

Fast path and readable path. ``send`` runs once per record, so its common case is written
out inline in two places: ``AsyncProducer.admit`` (bytes, no key, no partition, own
numbering: a few checks) and ``Producer.send`` (the same, appended straight to the
partition's open batch in the accumulator). Everything else, and every record when the switch
``PIDLEASE_SDK_READABLE_PATH=1`` is set (read once, at import: ``READABLE_PATH``; a
producer takes its value when it is built), goes through the readable path: ``admit``'s
full checks, ``Partitioner.partition``, ``ProducerBatch.add``. Both give the same records,
futures and batches: tests/unit/client/test_paths.py compares them on random workloads, and
the SDK's unit tests run both ways (tests/unit/conftest.py).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import enum
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Self, TypeVar

import httpx

from pidlease import errors
from pidlease.client.accumulator import Accumulator
from pidlease.client.batch_future import (
    AsyncBatchFuture,
    BatchFuture,
    BatchMetadata,
    BatchTracker,
)
from pidlease.client.config import DEFAULTS as _DEFAULTS
from pidlease.client.config import RECORD_OVERHEAD, ProducerConfig, ProducerSettings
from pidlease.client.leader_pool import LeaderPool
from pidlease.client.lease_client import (
    DEFAULT_COORDINATOR,
    AsyncLeaseClient,
    TopicInfo,
    coordinator_base_url,
)
from pidlease.client.lease_keeper import LeaseKeeper
from pidlease.client.partitioner import Partitioner
from pidlease.client.producer_batch import ProducerBatch
from pidlease.client.record_columns import (
    Columns,
    IdPlan,
    RunLimits,
    build_runs,
    plan_ids,
    route,
)
from pidlease.client.record_future import RecordFuture, future_class, place, settle, settled_outcome
from pidlease.client.retry import retrying
from pidlease.client.sender import PartitionSender, SenderContext
from pidlease.client.structs import BatchAck, RecordMetadata
from pidlease.errors import DeliveryTimeout, ProducerClosed
from pidlease.wire import protocol
from pidlease.wire.tls import client_ssl_context

__all__ = [
    "READABLE_PATH",
    "AsyncBatchFuture",
    "AsyncProducer",
    "BatchFuture",
    "BatchMetadata",
    "DeliveryTimeout",
    "Producer",
    "ProducerClosed",
    "ProducerConfig",
    "ProducerState",
    "RecordMetadata",
]

log = logging.getLogger("pidlease.client.producer")
T = TypeVar("T")

# Every send through the readable path (see the module docstring). Read once; a producer
# takes the value current when it is built, so tests can flip it per producer.
READABLE_PATH: bool = os.environ.get("PIDLEASE_SDK_READABLE_PATH", "0") == "1"


class ProducerState(enum.Enum):
    """The engine's lifecycle. NEW -> OPEN (``start``) -> CLOSING (``close``) -> CLOSED;
    OPEN or CLOSING -> FAILED (a fatal error; ``fatal`` holds it) -> CLOSED (``close``);
    NEW -> CLOSING (closed without being started). Only OPEN admits records."""

    NEW = "new"
    OPEN = "open"
    FAILED = "failed"
    CLOSING = "closing"
    CLOSED = "closed"


_NEXT_STATES = {
    ProducerState.NEW: {ProducerState.OPEN, ProducerState.CLOSING},
    ProducerState.OPEN: {ProducerState.FAILED, ProducerState.CLOSING},
    ProducerState.CLOSING: {ProducerState.FAILED, ProducerState.CLOSED},
    ProducerState.FAILED: {ProducerState.CLOSED},
    ProducerState.CLOSED: set(),
}


def _checked_move(topic: str, old: ProducerState, new: ProducerState) -> ProducerState:
    """``new``, when old -> new is a transition of ProducerState; else a bug: raises."""
    if new not in _NEXT_STATES[old]:
        raise RuntimeError(
            f"producer of topic {topic!r}: {old.value} -> {new.value} is not a transition"
        )
    return new


def _as_bytes(x: Any, what: str) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode()
    raise errors.ConfigError(f"{what} must be bytes or str, not {type(x).__name__}")


def _check_timestamp(timestamp_ms: object) -> None:
    """``send_batch(timestamp_ms=)``: None, or ms since the epoch as a non-negative int."""
    if timestamp_ms is not None and (
        type(timestamp_ms) is not int or not 0 <= timestamp_ms <= 2**63 - 1
    ):
        raise errors.ConfigError(
            f"timestamp_ms must be a non-negative int (ms since the epoch), not {timestamp_ms!r}"
        )


def _new_loop() -> asyncio.AbstractEventLoop:
    """The event loop of the blocking Producer's thread: uvloop's when it is installed
    (less CPU per wake-up and per socket operation), else asyncio's. PIDLEASE_UVLOOP=0
    forces asyncio's."""
    if os.environ.get("PIDLEASE_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _fresh(exc: errors.PidleaseError) -> errors.PidleaseError:
    """A new instance of a stored fatal error, so raising it again keeps tracebacks short."""
    new = type(exc)(exc.detail, **exc.extra)
    new.__cause__ = exc
    return new


def _refused_send(exc: errors.PidleaseError) -> errors.PidleaseError:
    """What ``send`` raises on a failed producer: the stored error again; when fenced or
    timed out, one that says the record was not taken (nothing of it can have been
    written)."""
    if isinstance(exc, errors.DeliveryTimeout):
        timed_out = errors.DeliveryTimeout(
            f"{exc.detail}; this record was not accepted: the producer is closed",
            **{
                **exc.extra,
                "partition": None,
                "first_sequence": None,
                "last_sequence": None,
                "indeterminate": False,
            },
        )
        timed_out.__cause__ = exc
        return timed_out
    if not isinstance(exc, errors.ProducerFenced):
        return _fresh(exc)
    new = errors.ProducerFenced(
        f"{exc.detail}; this record was not accepted: the producer is fenced",
        **{**exc.extra, "indeterminate": False},
    )
    new.__cause__ = exc
    return new


class _Settings(abc.ABC):
    """The constructor ``AsyncProducer`` and ``Producer`` share: one signature (the
    keywords docs/sdk.md and the contract list), read into one ``ProducerSettings`` and
    checked here, then given to the class's ``_build``."""

    def __init__(
        self,
        coordinator_url: str = DEFAULT_COORDINATOR,
        topic: str = "",
        *,
        producer_name: str | None = None,
        expire_ms: int | None = None,
        max_in_flight: int = _DEFAULTS.max_in_flight,
        linger_ms: float = _DEFAULTS.linger_ms,
        delivery_timeout_ms: int | None = _DEFAULTS.delivery_timeout_ms,
        batch_bytes_max: int = _DEFAULTS.batch_bytes_max,
        batch_records_max: int = _DEFAULTS.batch_records_max,
        buffer_records_max: int = _DEFAULTS.buffer_records_max,
        request_timeout_ms: int = _DEFAULTS.request_timeout_ms,
        retry_backoff_ms: float = _DEFAULTS.retry_backoff_ms,
        retry_backoff_max_ms: float = _DEFAULTS.retry_backoff_max_ms,
        start_timeout_ms: int = _DEFAULTS.start_timeout_ms,
        metadata_refresh_min_ms: float = _DEFAULTS.metadata_refresh_min_ms,
        http_transport: httpx.AsyncBaseTransport | None = None,
        api_token: str | None = None,
        tls_ca_file: str | None = None,
        tls: bool = False,
        clock_ms: Callable[[], float] | None = None,
        wall_ms: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not topic:
            raise errors.ConfigError("a producer needs a topic")
        config = ProducerConfig(
            max_in_flight=max_in_flight,
            linger_ms=linger_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            batch_bytes_max=batch_bytes_max,
            batch_records_max=batch_records_max,
            buffer_records_max=buffer_records_max,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            start_timeout_ms=start_timeout_ms,
            metadata_refresh_min_ms=metadata_refresh_min_ms,
        )
        config.check()
        self._build(
            ProducerSettings(
                coordinator_url=coordinator_url,
                topic=topic,
                config=config,
                producer_name=producer_name,
                expire_ms=expire_ms,
                http_transport=http_transport,
                api_token=api_token,
                tls_ca_file=tls_ca_file,
                tls=tls,
                clock_ms=clock_ms,
                wall_ms=wall_ms,
                rng=rng,
            )
        )

    @abc.abstractmethod
    def _build(self, settings: ProducerSettings) -> None:
        """Build the producer from checked settings."""


class AsyncProducer(_Settings):
    """Exactly-once producer for one topic, on the running event loop.

    ``await AsyncProducer.create(url, topic, ...)`` (or ``async with AsyncProducer(...)``,
    or ``await p.start()``) leases the PID; ``fut = await p.send(...)`` admits a record and
    returns an asyncio future of its ``RecordMetadata``."""

    @classmethod
    def from_settings(cls, settings: ProducerSettings) -> AsyncProducer:
        """A producer built from checked settings (what the blocking ``Producer`` does)."""
        engine = cls.__new__(cls)
        engine._build(settings)  # noqa: SLF001 - its own class, instead of __init__
        return engine

    def _build(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self.config = settings.config
        self.coordinator_url = coordinator_base_url(settings.coordinator_url)
        self.topic = settings.topic
        self.producer_name = settings.producer_name
        self.expire_ms = settings.expire_ms
        self.clock_ms = settings.clock_ms or (lambda: time.monotonic() * 1000)
        self.wall_ms = settings.wall_ms or (lambda: time.time() * 1000)
        self.rng = settings.rng or random.Random()
        self.partitions = 0
        self.dedup = "strict"
        self.fatal: errors.PidleaseError | None = None
        self.stats = {"batches_resent": 0, "retries": 0}
        # Guards admission and the accumulator: Producer.send runs on callers' threads.
        self.lock = threading.Lock()
        # Set by Producer before start: its futures' shared Condition (they are
        # RecordFutures, resolved a batch at a time), and the topic grew to n partitions
        # (called under ``lock``).
        self.future_condition: threading.Condition | None = None
        self.grow_hook: Callable[[int], None] | None = None
        self.accumulator: Accumulator | None = None  # made by start()
        self._ssl = client_ssl_context(settings.tls_ca_file, settings.tls)
        self._client: AsyncLeaseClient | None = None
        self._lease: LeaseKeeper | None = None
        self._pool: LeaderPool | None = None
        self._senders: list[PartitionSender] = []
        self._ctx: SenderContext | None = None
        self._growing: asyncio.Task[int] | None = None
        self._partitioner: Partitioner | None = None
        self._explicit: bool | None = None
        self._last_given: list[int] = []
        self._state = ProducerState.NEW
        self._readable = READABLE_PATH
        # admit's inline case applies: OPEN and not on the readable path (kept in step with
        # the state by _move_to; a bool, read once per record)
        self._admit_inline = False
        self._value_bytes_max = (
            self.config.batch_bytes_max - protocol.BATCH_HEADER_SIZE - RECORD_OVERHEAD
        )

    @property
    def pid(self) -> int:
        return self._lease.pid if self._lease is not None else -1

    @property
    def generation(self) -> int:
        return self._lease.generation if self._lease is not None else -1

    @property
    def token(self) -> str:
        assert self._lease is not None
        return self._lease.token

    @property
    def state(self) -> ProducerState:
        return self._state

    @property
    def partitioner(self) -> Partitioner:
        """Where records without a partition go (after ``start``)."""
        assert self._partitioner is not None, "the producer is not started"
        return self._partitioner

    def _move_to(self, state: ProducerState) -> None:
        self._state = _checked_move(self.topic, self._state, state)
        self._admit_inline = state is ProducerState.OPEN and not self._readable

    # -- lifecycle -----------------------------------------------------------------------
    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> AsyncProducer:
        return await cls(*args, **kwargs).start()

    async def start(self) -> Self:
        """Look the topic up and lease the PID on every partition (see lease_keeper.py)."""
        if self._state is not ProducerState.NEW:
            return self
        cfg = self.config
        client = self._client = AsyncLeaseClient(
            self.coordinator_url,
            request_timeout_ms=cfg.request_timeout_ms,
            transport=self.settings.http_transport,
            api_token=self.settings.api_token,
            tls_ca_file=self.settings.tls_ca_file,
            tls=self.settings.tls,
        )
        try:
            self._lease = LeaseKeeper(
                client,
                self.topic,
                producer_name=self.producer_name,
                expire_ms=self.expire_ms,
                clock_ms=self.clock_ms,
                rng=self.rng,
                backoff_ms=cfg.retry_backoff_ms,
                backoff_max_ms=cfg.retry_backoff_max_ms,
                on_fatal=self.fail,
                on_renewed=self._wake_senders,
                on_renewal=self._look_for_new_partitions,
            )
            self._pool = LeaderPool(
                client,
                self.topic,
                connect_timeout_ms=min(cfg.request_timeout_ms, 10_000),
                refresh_min_ms=cfg.metadata_refresh_min_ms,
                clock_ms=self.clock_ms,
                ssl_context=self._ssl,
            )
            deadline = self.clock_ms() + cfg.start_timeout_ms
            info: TopicInfo = await retrying(
                lambda: client.topic(self.topic, offsets=False),
                deadline_ms=deadline,
                backoff=self._lease.backoff(),
                clock_ms=self.clock_ms,
            )
            self._pool.apply(info)
            self.partitions, self.dedup = info.partitions, info.dedup
            leases = await self._lease.acquire(self.partitions, deadline)
        except BaseException:
            await client.close()
            raise
        self._partitioner = Partitioner(self.partitions, start=self.rng.randrange(self.partitions))
        # Records admitted on callers' threads (the blocking Producer: its futures share
        # future_condition) wake their senders through the loop, once per burst.
        threaded = self.future_condition is not None
        acc = self.accumulator = Accumulator(
            cfg,
            self.partitions,
            lock=self.lock,
            clock_ms=self.clock_ms,
            linked=threaded,
            call_soon_threadsafe=(
                asyncio.get_running_loop().call_soon_threadsafe if threaded else None
            ),
        )
        ctx = SenderContext(
            topic=self.topic,
            config=cfg,
            accumulator=acc,
            leaders=self._pool,
            lease=self._lease,
            clock_ms=self.clock_ms,
            wall_ms=self.wall_ms,
            rng=self.rng,
            future_condition=self.future_condition,
            on_fatal=self.fail,
            on_retry=self._on_retry,
            on_resent=self._on_resent,
        )
        self._ctx = ctx
        self._senders = [
            PartitionSender(ctx, p, next_sequence=leases[p].sequence_number)
            for p in range(self.partitions)
        ]
        self._last_given = [leases[p].sequence_number - 1 for p in range(self.partitions)]
        # What a replayed (already durable) explicit sequence id resolves to: record i of
        # this "batch" is sequence i, duplicate, offset unknown (-1).
        self._replayed_ack = [BatchAck(self.topic, p, -1, 0, True) for p in range(self.partitions)]
        self._replayed = [settled_outcome(ack) for ack in self._replayed_ack]
        for s in self._senders:
            acc.attach(s.partition, s.wake)
            s.start()
        self._lease.start()
        self._move_to(ProducerState.OPEN)
        return self

    async def close(self, timeout_ms: float | None = None) -> None:
        """Deliver what was sent (up to ``timeout_ms``; then fail the rest), stop, release
        connections. Idempotent."""
        if self._state is ProducerState.CLOSED:
            return
        if self._state in (ProducerState.NEW, ProducerState.OPEN):
            self._move_to(ProducerState.CLOSING)  # FAILED stays so until CLOSED
        if self.accumulator is not None:
            with self.lock:
                self.accumulator.close_all()
        for s in self._senders:
            s.close()
        tasks = [s.task for s in self._senders if s.task is not None]
        if tasks:
            _done, late = await asyncio.wait(
                tasks, timeout=None if timeout_ms is None else timeout_ms / 1000
            )
            if late:
                self.fail(
                    ProducerClosed(f"closed after {timeout_ms} ms with records still undelivered")
                )
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._lease is not None:
            await self._lease.stop()
        if self._pool is not None:
            await self._pool.close()
        if self._client is not None:
            await self._client.close()
        self._finish_close()

    def _finish_close(self) -> None:
        if self._state is not ProducerState.CLOSED:  # a second close() may have finished first
            self._move_to(ProducerState.CLOSED)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the public surface --------------------------------------------------------------
    def last_sequence_id(self, partition: int) -> int:
        """Highest sequence of this PID known durable in ``partition`` (-1: none)."""
        self._check_partition(partition)
        return self._senders[partition].last_acked

    async def send(
        self,
        value: bytes | str,
        key: bytes | str | None = None,
        partition: int | None = None,
        sequence_id: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Admit one record; returns the future of its RecordMetadata. Waits while
        ``buffer_records_max`` records are unresolved. Bad input raises here."""
        self.check_open()
        acc = self.accumulator
        if acc is None or acc.used >= acc.buffer_max:
            acc = await self._wait_for_space()
        fut: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        with self.lock:
            got = self.admit(value, key, partition, sequence_id, fut)
            if got is not None:
                p, key_b, value_b, seq = got
                acc.append(p, key_b, value_b, fut, seq)
        return fut

    async def _wait_for_space(self) -> Accumulator:
        """Until the accumulator has room for a record (``buffer_records_max``); raises
        when the producer is not open (loop thread)."""
        self.check_open()
        acc = self.accumulator
        assert acc is not None
        while acc.used >= acc.buffer_max:
            acc.space_event.clear()
            await acc.space_event.wait()
            self.check_open()
        return acc

    async def send_and_wait(
        self,
        value: bytes | str,
        key: bytes | str | None = None,
        partition: int | None = None,
        sequence_id: int | None = None,
    ) -> RecordMetadata:
        return await (await self.send(value, key, partition, sequence_id))

    async def send_batch(
        self,
        values: Any,
        keys: Any = None,
        partition: int | None = None,
        sequence_ids: Any = None,
        timestamp_ms: int | None = None,
    ) -> AsyncBatchFuture:
        """Admit many records in one call (lists or Arrow arrays; see
        ``record_columns.py``); returns one future whose result is their
        ``BatchMetadata`` in input order. Waits while ``buffer_records_max`` records are
        unresolved, then takes the whole call. Bad input raises here, changing nothing.
        ``timestamp_ms``: the timestamp of every batch the call makes (default: the
        producer's clock when each batch is built)."""
        self.check_open()
        _check_timestamp(timestamp_ms)
        cols = Columns.of(values, keys, sequence_ids, bytes_max=self.config.batch_bytes_max)
        await self._wait_for_space()
        fut = AsyncBatchFuture(cols.n, loop=asyncio.get_running_loop())
        with self.lock:
            self.accumulate_batch(cols, partition, fut.tracker, timestamp_ms)
        fut.tracker.seal()
        return fut

    def accumulate_batch(
        self,
        cols: Columns,
        partition: int | None,
        tracker: BatchTracker,
        timestamp_ms: int | None,
    ) -> None:
        """Place a ``send_batch`` call's records (``plan_batch``) and append its batches to
        the accumulator, closed, after the records sent before (under self.lock)."""
        acc = self.accumulator
        assert acc is not None
        for p, batches in self.plan_batch(cols, partition, tracker):
            if timestamp_ms is not None:
                for r in batches:
                    r.timestamp_ms = timestamp_ms
            acc.append_closed(p, batches)

    async def flush(self) -> None:
        """Wait until every record admitted so far is resolved (acked or failed); records
        waiting for ``linger_ms`` are sent at once. Errors are on the futures."""
        if self.accumulator is None:
            return
        with self.lock:
            targets = self.accumulator.close_all()
        await asyncio.gather(
            *(s.wait_resolved(t) for s, t in zip(self._senders, targets, strict=False))
        )

    def drop_connections(self) -> None:
        """Fault injection: abort every socket at once, as a network cut would. In-flight
        batches are resent on new connections (the server answers DUPLICATE for the ones
        it already has, with their original offsets)."""
        if self._pool is not None:
            self._pool.drop_all()

    # -- admission (any thread, under self.lock) -----------------------------------------
    def check_open(self) -> None:
        if self.fatal is not None:
            raise _refused_send(self.fatal)
        if self._state is ProducerState.NEW:
            raise ProducerClosed("the producer is not started: await start() or use create()")
        if self._state is not ProducerState.OPEN:
            raise ProducerClosed("the producer is closed")

    def _check_partition(self, partition: Any) -> None:
        if (
            not isinstance(partition, int)
            or isinstance(partition, bool)
            or not 0 <= partition < self.partitions
        ):
            raise errors.ConfigError(
                f"partition {partition!r} is not in 0..{self.partitions - 1} "
                f"of topic {self.topic!r}"
            )

    def admit(
        self,
        value: Any,
        key: Any,
        partition: int | None,
        sequence_id: int | None,
        fut: asyncio.Future[RecordMetadata] | RecordFuture,
    ) -> tuple[int, bytes | None, bytes, int] | None:
        """Validate one record and place it: (partition, key, value, explicit sequence id
        or -1); None when it was resolved at once (an explicit sequence id already
        durable: a duplicate). Raises on bad input, changing nothing."""
        if (
            self._admit_inline
            and type(value) is bytes
            and key is None
            and partition is None
            and sequence_id is None
            and self._explicit is not True
            and len(value) <= self._value_bytes_max
        ):
            # The common case (bytes, no key, no partition, the producer's own numbering)
            # in a few checks: this runs once per record.
            self._explicit = False
            p = 0 if self.partitions == 1 else self.next_partition()
            return p, None, value, -1
        self.check_open()
        value_b = _as_bytes(value, "value")
        key_b = None if key is None else _as_bytes(key, "key")
        size = len(value_b) + (len(key_b) if key_b is not None else 0) + RECORD_OVERHEAD
        if size + protocol.BATCH_HEADER_SIZE > self.config.batch_bytes_max:
            raise errors.RecordTooLarge(
                f"record of {size} bytes does not fit batch_bytes_max={self.config.batch_bytes_max}"
            )
        explicit = sequence_id is not None
        if self._explicit is not None and self._explicit != explicit:
            raise errors.ConfigError(
                "this producer numbers records itself; do not pass sequence_id"
                if not self._explicit
                else "this producer uses explicit sequence ids: every send must give sequence_id"
            )
        if partition is not None:
            self._check_partition(partition)
            p = partition
        else:
            assert self._partitioner is not None
            p = self._partitioner.partition(key_b)
        seq = -1
        if explicit:
            if (
                not isinstance(sequence_id, int)
                or isinstance(sequence_id, bool)
                or not 0 <= sequence_id <= protocol.MAX_SEQUENCE
            ):
                raise errors.ConfigError(
                    f"sequence_id {sequence_id!r} must be an int in 0..2**63-1"
                )
            seq = sequence_id
            last = self._last_given[p]
            if seq <= last:
                if seq <= self._senders[p].last_acked:
                    self._explicit = True
                    if isinstance(fut, RecordFuture):  # a replay: cheap, it is per record
                        place(fut, self._replayed[p], seq)
                    else:
                        settle(fut, RecordMetadata(self.topic, p, -1, seq, True))
                    return None
                raise errors.ConfigError(
                    f"sequence_id {seq} was already given to a record of "
                    f"partition {p} that is not acknowledged yet"
                )
            if self.dedup == "strict" and seq != last + 1:
                raise errors.ConfigError(
                    f"topic {self.topic!r} is strict: partition {p} needs "
                    f"sequence_id {last + 1} next, not {seq}"
                )
            self._last_given[p] = seq
        self._explicit = explicit
        return p, key_b, value_b, seq

    def plan_batch(
        self, cols: Columns, partition: int | None, tracker: BatchTracker
    ) -> list[tuple[int, list[ProducerBatch]]]:
        """Place the records of a ``send_batch`` call (under self.lock): routing, the
        explicit-id rules of ``admit`` for every partition (all checked before anything
        changes), then the batches of each partition. Raises on bad input, changing nothing."""
        self.check_open()
        explicit = cols.seqs is not None
        if self._explicit is not None and self._explicit != explicit:
            raise errors.ConfigError(
                "this producer numbers records itself; do not pass sequence_ids"
                if not self._explicit
                else "this producer uses explicit sequence ids: every send must give them"
            )
        if not cols.n:
            return []
        if partition is not None:
            self._check_partition(partition)
            groups = [(partition, range(cols.n))]
        else:
            keys = cols.keys
            unkeyed = keys is None or (
                keys.null_count if cols.arrow else any(k is None for k in keys)
            )
            sticky = self.next_partition() if unkeyed else 0
            groups = route(cols, self.partitions, sticky)
        plans: list[IdPlan | None] = [None] * len(groups)
        if cols.seqs is not None:
            strict = self.dedup == "strict"
            for g, (p, pos) in enumerate(groups):
                seqs = cols.seqs[pos.start : pos.stop] if isinstance(pos, range) else None
                if seqs is None:
                    seqs = [cols.seqs[i] for i in (pos.tolist() if hasattr(pos, "tolist") else pos)]
                plans[g] = plan_ids(
                    seqs,
                    last_given=self._last_given[p],
                    last_acked=self._senders[p].last_acked,
                    strict=strict,
                    partition=p,
                )
            for (p, _pos), ids in zip(groups, plans, strict=True):
                assert ids is not None
                self._last_given[p] = ids.last_given
        self._explicit = explicit
        limits = RunLimits(self.config.batch_records_max, self.config.batch_bytes_max)
        now = self.clock_ms()
        return [
            (
                p,
                build_runs(
                    cols,
                    p,
                    pos,
                    ids,
                    limits=limits,
                    tracker=tracker,
                    replayed=self._replayed_ack[p],
                    now_ms=now,
                ),
            )
            for (p, pos), ids in zip(groups, plans, strict=True)
        ]

    def next_partition(self) -> int:
        """Round robin, for a record with neither key nor partition (under self.lock)."""
        assert self._partitioner is not None
        return self._partitioner.partition(None)

    def own_numbering_open(self) -> bool:
        """OPEN, off the readable path, and numbering records itself: what the inline case
        of ``Producer.send`` assumes (under self.lock)."""
        return self._admit_inline and self._explicit is False

    # -- the senders' and the lease keeper's callbacks ----------------------------------
    def fail(self, exc: errors.PidleaseError) -> None:
        """A fatal error: fail every unresolved record and the producer (once)."""
        if self.fatal is not None:
            return
        self.fatal = exc
        if self._state in (ProducerState.OPEN, ProducerState.CLOSING):
            self._move_to(ProducerState.FAILED)
        log.error(
            "producer pid %s of topic %s failed: %s: %s", self.pid, self.topic, exc.name, exc.detail
        )
        for s in self._senders:
            s.fail_all(exc)  # each fails its partition's batches, sent or not
        if self.accumulator is not None:
            self.accumulator.space_event.set()  # waiting senders raise the error
        if self._lease is not None:
            self._lease.halt()

    def _on_retry(self, partition: int, exc: errors.PidleaseError) -> None:
        self.stats["retries"] += 1
        log.info("partition %s: retrying after %s: %s", partition, exc.name, exc.detail)

    def _on_resent(self, batches: int) -> None:
        self.stats["batches_resent"] += batches

    async def refresh_metadata(self) -> None:
        """Look the topic's leaders up again (at most once per metadata_refresh_min_ms)."""
        assert self._pool is not None, "the producer is not started"
        await self._pool.refresh()

    def _wake_senders(self) -> None:
        for s in self._senders:
            s.wake()

    # -- partitions added to the topic while running ----------------------------------------
    def _look_for_new_partitions(self) -> None:
        """After each lease renewal: has the topic grown (CreatePartitions, ``pidlease topic
        alter --partitions``)? One look at a time."""
        if self._growing is None or self._growing.done():
            self._growing = asyncio.get_running_loop().create_task(self.check_partitions())

    async def check_partitions(self) -> int:
        """Take up partitions added to the topic since the start: lease them with this PID
        (the existing ones and their sequences are untouched), start their senders, and
        route records to them from now on (round robin and key hash over the new count, as
        a Kafka producer does). Returns the partition count. A failure leaves the count as
        it was (the next renewal looks again)."""
        if self._state is not ProducerState.OPEN or self._client is None:
            return self.partitions
        assert self._lease is not None and self._pool is not None and self._ctx is not None
        try:
            info = await self._client.topic(self.topic, offsets=False)
            if info.partitions <= self.partitions:
                return self.partitions
            self._pool.apply(info)
            leases = await self._lease.extend(info.partitions)
        except errors.PidleaseError as exc:
            log.info("topic %s: new partitions not taken up yet (%s)", self.topic, exc.name)
            return self.partitions
        if self._state is not ProducerState.OPEN:
            return self.partitions
        old, n = self.partitions, info.partitions
        senders = [
            PartitionSender(self._ctx, p, next_sequence=leases[p].sequence_number)
            for p in range(old, n)
        ]
        assert self.accumulator is not None
        with self.lock:
            self.accumulator.grow(n)
            self._senders.extend(senders)
            self._last_given.extend(leases[p].sequence_number - 1 for p in range(old, n))
            acks = [BatchAck(self.topic, p, -1, 0, True) for p in range(old, n)]
            self._replayed_ack.extend(acks)
            self._replayed.extend(settled_outcome(ack) for ack in acks)
            self._partitioner = Partitioner(n, start=self.rng.randrange(n))
            self.partitions = n
            if self.grow_hook is not None:
                self.grow_hook(n)
        for sender in senders:
            self.accumulator.attach(sender.partition, sender.wake)
            sender.start()
        log.info(
            "topic %s: %d partitions now (was %d); leased with pid %s", self.topic, n, old, self.pid
        )
        return n


class Producer(_Settings):
    """The blocking producer: an ``AsyncProducer`` on a background thread's event loop.
    ``send`` returns a ``concurrent.futures.Future`` of ``RecordMetadata``; it blocks only
    while ``buffer_records_max`` records are unresolved. Construction leases the PID."""

    def _build(self, settings: ProducerSettings) -> None:
        self._engine = AsyncProducer.from_settings(settings)
        # Records admitted on callers' threads go into the engine's accumulator, under the
        # engine's lock: send's inline case appends to the partition's open batch itself
        # (``_open``: the accumulator's slots), within the room the batch reserved.
        self._fast = False  # send's inline path applies: open, own numbering, not closing
        # This side's lifecycle (under the lock): NEW until the engine started, OPEN,
        # CLOSING from close() on (sends raise ProducerClosed), CLOSED once the loop stopped.
        # A failure is the engine's (its state and ``fatal``).
        self._state = ProducerState.NEW
        self._lock = self._engine.lock
        self._bytes_max = self._engine.config.batch_bytes_max
        self._engine.grow_hook = self._grown
        self._engine.future_condition = cond = threading.Condition()
        self._future_class = future_class(cond)
        self._loop = _new_loop()
        self._thread = threading.Thread(
            target=self._run_loop, name=f"pidlease-producer-{settings.topic}", daemon=True
        )
        self._thread.start()
        try:
            self._call(self._engine.start())
        except BaseException:
            self._stop_loop()
            raise
        eng = self._engine
        assert eng.accumulator is not None
        self._acc = eng.accumulator
        self._open = self._acc.open  # grows in place with the topic
        # Round robin for the inline case: the Partitioner's own counter, one C call.
        self._next_round_robin = eng.partitioner.next_round_robin
        self._single = eng.partitions == 1
        with self._lock:
            self._move_to(ProducerState.OPEN)

    def _grown(self, n: int) -> None:
        """The topic grew to ``n`` partitions (the engine's ``check_partitions``, under the
        lock): the new round robin."""
        self._single = n == 1
        self._next_round_robin = self._engine.partitioner.next_round_robin

    def check_partitions(self) -> int:
        """Take up partitions added to the topic now, rather than at the next lease renewal
        (when the producer looks by itself); returns the partition count."""
        return self._call(self._engine.check_partitions())

    def _move_to(self, state: ProducerState) -> None:
        self._state = _checked_move(self.topic, self._state, state)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            rest = asyncio.all_tasks(self._loop)
            for t in rest:
                t.cancel()
            if rest:
                self._loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _stop_loop(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def pid(self) -> int:
        return self._engine.pid

    @property
    def generation(self) -> int:
        return self._engine.generation

    @property
    def partitions(self) -> int:
        return self._engine.partitions

    @property
    def topic(self) -> str:
        return self._engine.topic

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._engine.stats)

    def last_sequence_id(self, partition: int) -> int:
        return self._engine.last_sequence_id(partition)

    def send(
        self,
        value: bytes | str,
        key: bytes | str | None = None,
        partition: int | None = None,
        sequence_id: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        fut: RecordFuture = self._future_class()
        lock = self._lock
        lock.acquire()
        try:
            # This runs once per record: the common case (bytes, no key, no partition, the
            # producer's own numbering, a value as long as the first of the partition's
            # open batch, room left in that batch) is written out inline: place the future
            # on the batch, append the value. The batch's `cap` covers both the batch
            # limits and buffer_records_max (Accumulator.append reserved it). Everything
            # else goes through _send_slow (once per batch in the common case; every record
            # on the readable path, where _fast stays False: READABLE_PATH). A failed
            # producer's slots are emptied (the senders fail their batches), so its next
            # send goes the slow way and raises.
            if (
                self._fast
                and key is None
                and partition is None
                and sequence_id is None
                and type(value) is bytes
            ):
                # round robin: the Partitioner's own iterator (under the lock)
                p = 0 if self._single else self._next_round_robin()
                batch = self._open[p]
                if batch is not None:
                    values = batch.values
                    i = len(values)
                    if i < batch.cap and len(value) == batch.vlen:
                        # record_future.place(fut, batch, i), written out: a call costs
                        # this line ~8 % (see RecordFuture)
                        fut.batch_outcome = batch
                        fut.record_index = i
                        values.append(value)
                        return fut
                return self._send_slow(fut, value, None, p, None)
            return self._send_slow(fut, value, key, partition, sequence_id)
        finally:
            lock.release()

    def send_batch(
        self,
        values: Any,
        keys: Any = None,
        partition: int | None = None,
        sequence_ids: Any = None,
        timestamp_ms: int | None = None,
    ) -> BatchFuture:
        """Admit many records in one call: ``values`` (and ``keys``, ``sequence_ids``) as
        lists or Arrow arrays. Returns one future whose result is the records'
        ``BatchMetadata`` (a lazy sequence of ``RecordMetadata``, in input order). Same
        guarantees as ``send``; blocks while ``buffer_records_max`` records are
        unresolved, then takes the whole call. Bad input raises here, changing nothing.
        ``timestamp_ms``: the timestamp of every batch the call makes (default: the
        producer's clock when each batch is built; a mirror keeps its source's)."""
        eng = self._engine
        _check_timestamp(timestamp_ms)
        cols = Columns.of(values, keys, sequence_ids, bytes_max=self._bytes_max)
        fut = BatchFuture(cols.n)
        with self._lock:
            self._wait_for_space(None)
            eng.accumulate_batch(cols, partition, fut.tracker, timestamp_ms)
            self._fast = eng.own_numbering_open()
        fut.tracker.seal()
        return fut

    def _send_slow(
        self,
        fut: RecordFuture,
        value: Any,
        key: Any,
        partition: int | None,
        sequence_id: int | None,
    ) -> RecordFuture:
        """send() for everything but the inline case, and the readable path for every
        record (under the engine's lock): waits for buffer space, validates (admit), and
        appends the record to its partition's open batch (``Accumulator.append``, which
        also sets the batch's room for the inline case)."""
        eng = self._engine
        acc = self._acc
        if acc.used >= acc.buffer_max or self._state is not ProducerState.OPEN:
            self._wait_for_space(partition)  # (the common case checked inline: per record)
        got = eng.admit(value, key, partition, sequence_id, fut)
        if got is None:
            return fut  # an explicit sequence id already durable: resolved as a duplicate
        p, key_b, value_b, seq = got
        acc.append(p, key_b, value_b, fut, seq)
        self._fast = eng.own_numbering_open()
        return fut

    def _wait_for_space(self, partition: int | None) -> None:
        """Until the accumulator has room for a record of ``partition`` (under the lock,
        which the wait releases); raises when the producer fails or closes meanwhile."""
        acc = self._acc
        while not acc.has_room(partition):
            self._engine.check_open()  # a producer that failed while we waited must not block us
            if self._state is not ProducerState.OPEN:
                raise ProducerClosed("the producer is closed")
            acc.space.wait(0.2)
        if self._state is not ProducerState.OPEN:
            raise ProducerClosed("the producer is closed")

    @property
    def _unresolved(self) -> int:
        """Records admitted and not resolved yet (under the lock for an exact figure)."""
        return self._acc.unresolved()

    async def _drop(self) -> None:
        self._engine.drop_connections()

    def flush(self) -> None:
        """Block until every record sent so far is acked or failed."""
        self._call(self._engine.flush())

    def drop_connections(self) -> None:
        """Fault injection: abort every socket, as a network cut would (see AsyncProducer)."""
        self._call(self._drop())

    def close(self, timeout_ms: float | None = None) -> None:
        """Deliver what was sent (up to ``timeout_ms``; then fail the rest), stop, release
        connections. Sends from now on raise ``ProducerClosed``. Idempotent."""
        with self._lock:
            if self._state is not ProducerState.OPEN:
                return
            self._move_to(ProducerState.CLOSING)
            self._fast = False
        try:
            self._call(self._engine.close(timeout_ms))
        finally:
            self._stop_loop()
            with self._lock:
                self._move_to(ProducerState.CLOSED)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
