"""The send pipeline of one partition: batching, the in-flight window, resends.

One ``PartitionSender`` task per partition owns everything about that partition's
records once the producer has admitted them:

- records wait in ``pending``, as runs of encoded records that fit one batch
  (``record_run.py``), until the head run is full (``batch_records_max`` /
  ``batch_bytes_max``), its first record has waited ``linger_ms``, or a flush or close
  asks;
- a batch gets its sequences when it is built (base = the partition's next sequence, or
  the caller's own contiguous run in explicit mode) and is then frozen: a resend sends
  the same bytes, so the server recognises a retry as the same batch (DUPLICATE with the
  original offsets) and never splits or merges sequences;
- at most ``max_in_flight`` batches are unresolved at once, all written to the current
  leader's pipelined connection in sequence order;
- a retriable answer (connection lost, NOT_LEADER, SEQUENCE_UNKNOWN, ...) stops new
  sends; once every outstanding answer of the partition is in, the sender backs off
  (bounded exponential, jittered), refreshes the leader when needed, and resends every
  unresolved batch in order on one connection. Never two connections at once for one
  partition: that is what keeps the server seeing sequences in order.
- OUT_OF_ORDER_SEQUENCE or UNKNOWN_PID for a batch behind an earlier unresolved one is
  a consequence of that earlier failure and is retried with it; for the earliest
  unresolved batch it is real, and fatal.

User futures are resolved in sequence order when a batch reaches the head of the window.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pidlease import errors
from pidlease.wire import protocol
from pidlease.errors import DeliveryTimeout, ProducerClosed  # noqa: F401  (defined here once; old imports work)
from pidlease.client.record_future import BatchAck, fail_run, resolve_run
from pidlease.client.record_run import RecordRun

if TYPE_CHECKING:
    from pidlease.client.producer import AsyncProducer

log = logging.getLogger("pidlease.client.producer")
_SMALLEST_RECORD = 8  # an encoded record with no key and an empty value
_INVALID_STATE = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a sent record is. ``duplicate`` means the server already had it (a retry of
    something that was written); ``offset`` is then the original one, or -1 when the
    server no longer remembers it."""

    topic: str
    partition: int
    offset: int
    sequence_id: int
    duplicate: bool = False


@dataclass(slots=True, eq=False)
class InFlightBatch:
    run: RecordRun            # its records (and their futures), in sequence order
    count: int
    base_sequence: int
    batch: bytes
    first_ms: float           # admission time of its first record
    response: asyncio.Future[protocol.Response] | None = None
    attempts: int = 0
    done: bool = False
    base_offset: int = -1
    duplicate: bool = False

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + self.count - 1


def settle(fut: Any, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve a user future unless the user already cancelled it."""
    if fut.done():
        return
    try:
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)
    except _INVALID_STATE:
        pass  # cancelled by the user in another thread between done() and here


class Backoff:
    """Exponential backoff from ``base_ms`` up to ``cap_ms``, jittered by +-20%."""

    def __init__(self, *, base_ms: float, cap_ms: float, rng: random.Random) -> None:
        self.base_ms = base_ms
        self.cap_ms = cap_ms
        self.rng = rng
        self.failures = 0

    def next_ms(self) -> float:
        delay = min(self.cap_ms, self.base_ms * (2 ** min(self.failures, 30)))
        self.failures += 1
        return min(self.cap_ms, delay * (0.8 + 0.4 * self.rng.random()))

    def reset(self) -> None:
        self.failures = 0


def _retriable(exc: BaseException) -> bool:
    # UNKNOWN_TOPIC_OR_PARTITION is retried too: a restarted server answers it until it
    # has loaded the partition, and metadata may simply be stale.
    return isinstance(exc, errors.UnknownTopicOrPartition) or bool(getattr(exc, "retriable", False))


class PartitionSender:
    def __init__(self, owner: AsyncProducer, partition: int, *, next_sequence: int) -> None:
        self.owner = owner
        self.partition = partition
        self.next_sequence = next_sequence      # auto numbering
        self.last_acked = next_sequence - 1     # highest sequence known durable
        self.pending: deque[RecordRun] = deque()
        self.pending_records = 0
        self.in_flight: deque[InFlightBatch] = deque()
        self.enqueued = 0
        self.resolved = 0
        self.closing = False
        self.task: asyncio.Task[None] | None = None
        self._flush_upto = 0
        self._wake = asyncio.Event()
        self._retry_at: float | None = None
        self._stale_metadata = False
        self._last_error: errors.PidleaseError | None = None
        # The connection the unresolved batches went out on (see _send_new).
        self._conn: Any = None
        cfg = owner.config
        self._backoff = Backoff(base_ms=cfg.retry_backoff_ms, cap_ms=cfg.retry_backoff_max_ms,
                                rng=owner.rng)
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._records_max = cfg.batch_records_max
        self._bytes_max = cfg.batch_bytes_max
        # The blocking Producer keeps each partition's open run on the callers' side and
        # hands over only closed runs; it is this sender's ``source`` (open_run, take_open).
        self.source: Any = None

    # -- called by the producer (loop thread) -------------------------------------------
    def enqueue(self, key: bytes | None, value: bytes, seq: int, future: Any) -> None:
        """One admitted record (``seq`` -1 unless explicit), from ``AsyncProducer.send``."""
        pending = self.pending
        if not pending or pending[-1].closed or not pending[-1].add(key, value, future, seq):
            run = RecordRun(self.owner.clock_ms(), seq, self._records_max, self._bytes_max)
            run.add(key, value, future, seq)
            pending.append(run)
            # Waking the task per record would cost more than the batching saves: only a
            # new run (to arm the linger timer, or because the previous one is full) does.
            self._wake.set()
        self.pending_records += 1
        self.enqueued += 1

    def enqueue_runs(self, runs: list[RecordRun]) -> None:
        """Closed runs built on a caller's thread (``Producer.send``), in admission order:
        each is one batch, sendable at once."""
        pending = self.pending
        n = 0
        for run in runs:
            n += len(run.values)
            run.closed = True
            pending.append(run)
        self.pending_records += n
        self.enqueued += n
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"sender-{self.partition}")

    async def wait_resolved(self, target: int) -> None:
        """Until ``target`` records of this partition are resolved (acked or failed)."""
        if self.resolved >= target:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, fut))
        self._flush_upto = max(self._flush_upto, target)
        self._wake.set()
        await fut

    def fail_all(self, exc: BaseException) -> None:
        n = 0
        for b in self.in_flight:
            self._fail_run(b.run, exc)
            n += b.count
        for run in self.pending:
            self._fail_run(run, exc)
            n += len(run.values)
        self.in_flight.clear()
        self.pending.clear()
        self.pending_records = 0
        self._count_resolved(n)
        self._wake.set()

    def _fail_run(self, run: RecordRun, exc: BaseException) -> None:
        if run.futures is None:
            cond = self.owner.future_condition
            assert cond is not None
            fail_run(cond, run, exc)
        else:
            for fut in run.futures:
                settle(fut, exc=exc)

    # -- the task ------------------------------------------------------------------------
    async def _run(self) -> None:
        owner = self.owner
        try:
            while owner.fatal is None:
                self._wake.clear()
                now = owner.clock_ms()
                self._collect(now)
                if owner.fatal is not None:
                    break
                self._complete_head()
                if self._check_delivery_timeout(now):
                    break
                if self.closing and not self.pending and not self.in_flight:
                    break
                if self._retry_at is not None:
                    if any(b.response is not None for b in self.in_flight):
                        # Answers still coming: each wakes the task (_on_answer); the
                        # backoff's deadline, already past or not, is no reason to.
                        await self._wait(self._delivery_deadline_s(now))
                    elif now < self._retry_at or not owner.token_ok(now):
                        await self._wait(self._deadline_s(now))
                    else:
                        await self._resend()
                    continue
                if self._can_send_new(now):
                    await self._send_new()
                    continue
                await self._wait(self._deadline_s(now))
        except Exception as exc:  # a bug here must fail the futures, not hang them
            log.exception("sender of partition %s crashed", self.partition)
            owner.fail(errors.PidleaseError(f"sender of partition {self.partition} crashed: {exc!r}"))
            raise

    async def _wait(self, timeout_s: float | None) -> None:
        if timeout_s is None:
            await self._wake.wait()
            return
        handle = asyncio.get_running_loop().call_later(max(timeout_s, 0.0), self._wake.set)
        try:
            await self._wake.wait()
        finally:
            handle.cancel()

    def _deadline_s(self, now: float) -> float | None:
        cfg = self.owner.config
        deadlines: list[float] = []
        if self._retry_at is not None:
            deadlines.append(self._retry_at)
        elif len(self.in_flight) < cfg.max_in_flight:
            if self.pending:
                deadlines.append(self.pending[0].first_ms + cfg.linger_ms)
            elif self.source is not None:
                run = self.source.open_run(self.partition)
                if run is not None:
                    deadlines.append(run.first_ms + cfg.linger_ms)
        oldest = self._oldest_ms()
        if cfg.delivery_timeout_ms is not None and oldest is not None:
            deadlines.append(oldest + cfg.delivery_timeout_ms)
        if not deadlines:
            return None
        return max(0.0, (min(deadlines) - now) / 1000)

    def _delivery_deadline_s(self, now: float) -> float | None:
        limit = self.owner.config.delivery_timeout_ms
        oldest = self._oldest_ms()
        if limit is None or oldest is None:
            return None
        return max(0.0, (oldest + limit - now) / 1000)

    def _oldest_ms(self) -> float | None:
        if self.in_flight:
            return self.in_flight[0].first_ms
        if self.pending:
            return self.pending[0].first_ms
        if self.source is not None:
            run = self.source.open_run(self.partition)
            if run is not None:
                return run.first_ms
        return None

    def _check_delivery_timeout(self, now: float) -> bool:
        limit = self.owner.config.delivery_timeout_ms
        oldest = self._oldest_ms()
        if limit is None or oldest is None or now - oldest < limit:
            return False
        last = f"; last error: {self._last_error.name}: {self._last_error.detail}" if self._last_error else ""
        self.owner.fail(DeliveryTimeout(
            f"partition {self.partition}: no acknowledgement within delivery_timeout_ms={limit}{last}"))
        return True

    # -- answers -------------------------------------------------------------------------
    def _collect(self, now: float) -> None:
        """Read every answer that has arrived, in window order."""
        unresolved_before = False
        for b in self.in_flight:
            if b.done:
                continue
            r = b.response
            if r is None or not r.done():
                unresolved_before = True
                continue
            b.response = None
            exc: BaseException | None = r.exception() if not r.cancelled() else errors.ServerUnavailable("cancelled")
            if exc is None:
                resp = r.result()
                if resp.error_code in (errors.NONE, errors.DUPLICATE):
                    b.done = True
                    b.base_offset = resp.base_offset
                    b.duplicate = resp.error_code == errors.DUPLICATE
                    self._backoff.reset()
                    continue
                exc = errors.error_for_code(resp.error_code, resp.detail,
                                            expected_sequence=resp.expected_sequence,
                                            leader=resp.leader)
            if not isinstance(exc, errors.PidleaseError):
                exc = errors.ServerUnavailable(f"{type(exc).__name__}: {exc}")
            consequence = unresolved_before and isinstance(
                exc, (errors.OutOfOrderSequence, errors.UnknownPid))
            if _retriable(exc) or consequence:
                self._schedule_retry(exc, now)
                unresolved_before = True
                continue
            self.owner.fail(exc)
            return

    def _schedule_retry(self, exc: errors.PidleaseError, now: float) -> None:
        self._last_error = exc
        if exc.invalid_metadata:  # the leader moved or is gone: look the topic up again
            self._stale_metadata = True
        if self._retry_at is None:
            self._retry_at = now + self._backoff.next_ms()
        self.owner.note_retry(self.partition, exc)

    def _complete_head(self) -> None:
        topic = self.owner.topic
        p = self.partition
        cond = self.owner.future_condition
        while self.in_flight and self.in_flight[0].done:
            b = self.in_flight.popleft()
            base_off, dup, seq0 = b.base_offset, b.duplicate, b.base_sequence
            run = b.run
            if run.futures is None:  # the blocking Producer's RecordFutures: one store per batch
                assert cond is not None
                resolve_run(cond, run, BatchAck(topic, p, base_off, seq0, dup))
            else:
                for i, fut in enumerate(run.futures):
                    off = base_off + i if base_off >= 0 else -1
                    settle(fut, RecordMetadata(topic, p, off, seq0 + i, dup))
            self.last_acked = max(self.last_acked, b.last_sequence)
            self._count_resolved(b.count)

    def _count_resolved(self, n: int) -> None:
        if not n:
            return
        self.resolved += n
        self.owner.records_resolved(n)
        if self._waiters:
            still = []
            for target, fut in self._waiters:
                if self.resolved >= target:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((target, fut))
            self._waiters = still

    # -- sending -------------------------------------------------------------------------
    def _can_send_new(self, now: float) -> bool:
        cfg = self.owner.config
        if len(self.in_flight) >= cfg.max_in_flight or not self.owner.token_ok(now):
            return False
        if not self.pending:
            # The blocking Producer's open run: taken when its first record has lingered
            # long enough (or it is full; a flush or close hands it over itself).
            run = self.source.open_run(self.partition) if self.source is not None else None
            return run is not None and (now - run.first_ms >= cfg.linger_ms or run.full())
        head = self.pending[0]
        return (head.closed or len(self.pending) > 1     # a run is closed when the next one starts
                or head.full(_SMALLEST_RECORD)
                or now - head.first_ms >= cfg.linger_ms
                or self.closing
                or self.enqueued - self.pending_records < self._flush_upto)

    async def _send_new(self) -> None:
        try:
            conn = await self.owner.connection_for(self.partition)
        except errors.PidleaseError as exc:
            if not _retriable(exc):  # e.g. a server certificate the CA does not vouch for
                self.owner.fail(exc)
                return
            self._schedule_retry(exc, self.owner.clock_ms())
            return
        if self.owner.fatal is not None or self._retry_at is not None:
            return
        if self.in_flight and conn is not self._conn:
            # The leader map moved under us (any sender's refresh moves every partition's
            # leader) while batches are unanswered on the old connection. Sending the next
            # one on the new connection could get it written before an earlier one that
            # then fails: on a monotonic topic that one's resend is answered DUPLICATE,
            # never written. Wait for every answer, then resend in order (_resend).
            self._retry_at = self.owner.clock_ms()
            return
        if not self.pending and self.source is not None:
            self.source.take_open(self.partition)
        if not self.pending:
            return
        b = self._build_batch()
        self.in_flight.append(b)
        self._transmit(b, conn)

    def _build_batch(self) -> InFlightBatch:
        run = self.pending.popleft()
        run.closed = True
        n = len(run.values)
        self.pending_records -= n
        if run.first_seq >= 0:
            base = run.first_seq
            self.next_sequence = max(self.next_sequence, run.last_seq + 1)
        else:
            base = self.next_sequence
            self.next_sequence += n
        owner = self.owner
        batch = run.batch(pid=owner.pid, generation=owner.generation, base_sequence=base,
                          timestamp_ms=int(owner.wall_ms()))
        # The batch is frozen from here on (a resend is the same bytes): the payloads are
        # not needed any more, and the records' futures keep the run alive.
        run.values = []
        run.keyed = None
        return InFlightBatch(run, n, base, batch, run.first_ms)

    def _transmit(self, b: InFlightBatch, conn: Any) -> None:
        owner = self.owner
        corr = conn.next_correlation_id()
        data = protocol.produce_request(corr, owner.topic, self.partition, owner.token, b.batch)
        b.attempts += 1
        self._conn = conn
        b.response = conn.send(protocol.PRODUCE, corr, data, timeout_ms=owner.config.request_timeout_ms)
        b.response.add_done_callback(self._on_answer)

    def _on_answer(self, _fut: asyncio.Future[protocol.Response]) -> None:
        self._wake.set()

    async def _resend(self) -> None:
        owner = self.owner
        try:
            if self._stale_metadata:
                await owner.refresh_metadata()
                self._stale_metadata = False
            conn = await owner.connection_for(self.partition)
        except errors.PidleaseError as exc:
            self._retry_at = None
            if not _retriable(exc):
                owner.fail(exc)
                return
            self._schedule_retry(exc, owner.clock_ms())
            return
        if owner.fatal is not None or not owner.token_ok(owner.clock_ms()):
            return
        for b in self.in_flight:
            if not b.done and b.response is None:
                self._transmit(b, conn)
                owner.stats["batches_resent"] += 1
        self._retry_at = None
