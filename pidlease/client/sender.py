"""The send pipeline of one partition: batching, the in-flight window, resends.

One ``PartitionSender`` task per partition owns everything about that partition's
records once the producer has admitted them:

- records wait in the producer's ``Accumulator`` (``accumulator.py``), as batches being
  filled (``producer_batch.py``), until the partition's oldest batch is closed (the next
  one started, or a flush or close closed it), full (``batch_records_max`` /
  ``batch_bytes_max``), or its first record has waited ``linger_ms``; the sender takes
  them from there, in admission order;
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

When the producer fails, a batch answered OK still resolves as acknowledged; when it is
fenced, every other batch fails with its own ``ProducerFenced`` (partition, sequences,
``indeterminate``): not written when it never left or every attempt of it was refused
before an append, else may have been written. An attempt still in flight is waited for
first: once fenced, its answer is final.

A sender is given what it uses and does not own, in one ``SenderContext`` shared by the
senders of a producer: the accumulator it drains (and gives the room of resolved records
back to), the leaders (``Leaders``: ``LeaderPool``), the lease (``LeaseView``:
``LeaseKeeper``), the settings, the clocks and the randomness, and callbacks for what it
reports (a fatal error, a retry, resent batches). It never sees the producer; the producer
drives it through ``wake``, ``wait_resolved``, ``close`` and ``fail_all``. Its lifecycle
is ``SenderState``.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from pidlease import errors
from pidlease.client.accumulator import Accumulator
from pidlease.client.config import ProducerConfig
from pidlease.client.connection import Connection
from pidlease.client.producer_batch import ProducerBatch
from pidlease.client.retry import Backoff, retriable
from pidlease.client.structs import BatchAck, RecordMetadata
from pidlease.errors import DeliveryTimeout, ProducerClosed, ProducerFenced
from pidlease.wire import protocol

__all__ = [
    "Backoff",
    "DeliveryTimeout",
    "InFlightBatch",
    "Leaders",
    "LeaseView",
    "PartitionSender",
    "ProducerClosed",
    "RecordMetadata",
    "SenderContext",
    "SenderState",
    "fenced_batch",
    "timed_out_batch",
    "unsent_failure",
]

log = logging.getLogger("pidlease.client.producer")
# After a lost leader (NOT_LEADER, a refused or dropped connection) the backoff stops
# doubling here: a failover takes about a ZooKeeper session timeout (1.2 s by default), and
# each retry looks the leaders up again (at most one lookup per metadata_refresh_min_ms,
# shared by the producer's partitions), so this is a short poll of the lookup for the new
# leader rather than a backoff. At 250 ms the SDK learned of a new leader 0-300 ms after
# its election (most of what a failover spent after it); at 100 ms, 0-120 ms. An outage
# costs the coordinator about ten lookups a second per producer (about 13 a failover).
_LEADER_RETRY_MAX_MS = 100.0

# Answers a partition server gives before it appends anything (the append rules' refusals,
# the tracked-PID limit, a partition still loading): an attempt answered with one of these
# wrote nothing. Every other outcome of an attempt may have written its batch: no answer
# (lost connection, timeout), and NOT_LEADER or SERVER_UNAVAILABLE too, since a leader
# answers those for a batch it appended and can no longer acknowledge (deposed, log cut).
_REFUSED_BEFORE_APPEND = frozenset(
    {
        errors.ProducerFenced.code,
        errors.SequenceUnknown.code,
        errors.TooManyPids.code,
        errors.OutOfOrderSequence.code,
        errors.UnknownPid.code,
        errors.UnknownTopicOrPartition.code,
    }
)


def _batch_outcome(
    *,
    pid: int,
    partition: int,
    first: int | None,
    last: int | None,
    indeterminate: bool,
    why: str,
    resend: str,
) -> str:
    """What became of one batch, and what to do: the part of a fenced or timed-out
    batch's message that names its partition and sequences."""
    seqs = f"sequences {first}..{last}" if first is not None else "records not numbered yet"
    if indeterminate:
        return (
            f"partition {partition}, {seqs}: may have been written ({why}). To learn "
            f"whether: take the name over with a new producer and compare its "
            f"last_sequence_id({partition}) with {last}, or read partition {partition} "
            f"for pid {pid}; resend only what is missing"
        )
    return f"partition {partition}, {seqs}: not written ({why}); {resend}"


_E = TypeVar("_E", ProducerFenced, DeliveryTimeout)


def _batch_error(
    cls: type[_E],
    message: str,
    cause: _E,
    *,
    partition: int,
    first: int | None,
    last: int | None,
    indeterminate: bool,
) -> _E:
    err = cls(
        message,
        **{
            **cause.extra,
            "partition": partition,
            "first_sequence": first,
            "last_sequence": last,
            "indeterminate": indeterminate,
        },
    )
    err.__cause__ = cause
    return err


def fenced_batch(
    cause: ProducerFenced,
    *,
    pid: int,
    generation: int,
    partition: int,
    first: int | None,
    last: int | None,
    indeterminate: bool,
    why: str,
) -> ProducerFenced:
    """The error for one batch of a fenced producer: ``cause`` (the FENCED answer or lease
    refusal) with the batch's partition, sequences and whether it may have been written,
    and a message that says what to do."""
    outcome = _batch_outcome(
        pid=pid,
        partition=partition,
        first=first,
        last=last,
        indeterminate=indeterminate,
        why=why,
        resend="resend them with a producer that holds the name",
    )
    return _batch_error(
        ProducerFenced,
        f"producer pid {pid} generation {generation} was fenced (another producer took "
        f"the PID over): {outcome}. Fenced by: {cause.detail}",
        cause,
        partition=partition,
        first=first,
        last=last,
        indeterminate=indeterminate,
    )


def timed_out_batch(
    cause: DeliveryTimeout,
    *,
    pid: int,
    generation: int,
    partition: int,
    first: int | None,
    last: int | None,
    indeterminate: bool,
    why: str,
) -> DeliveryTimeout:
    """The error for one batch of a producer closed by ``delivery_timeout_ms``: ``cause``
    with the batch's partition, sequences and whether it may have been written, as
    ``fenced_batch`` says them for a fenced producer."""
    outcome = _batch_outcome(
        pid=pid,
        partition=partition,
        first=first,
        last=last,
        indeterminate=indeterminate,
        why=why,
        resend="resend them",
    )
    return _batch_error(
        DeliveryTimeout,
        f"producer pid {pid} generation {generation} gave up: {cause.detail}: {outcome}",
        cause,
        partition=partition,
        first=first,
        last=last,
        indeterminate=indeterminate,
    )


def unsent_failure(
    exc: BaseException,
    *,
    pid: int,
    generation: int,
    partition: int,
    first_seq: int,
    last_seq: int,
) -> BaseException:
    """What admitted records that never left the producer fail with (``first_seq`` ..
    ``last_seq``: their explicit sequence ids, -1 when the producer numbers them as it
    sends): ``exc``, or for a fenced or timed-out producer an error of its type saying
    they were not written."""
    numbered = first_seq >= 0
    if isinstance(exc, DeliveryTimeout):
        return timed_out_batch(
            exc,
            pid=pid,
            generation=generation,
            partition=partition,
            first=first_seq if numbered else None,
            last=last_seq if numbered else None,
            indeterminate=False,
            why="they never left the producer",
        )
    if not isinstance(exc, ProducerFenced):
        return exc
    return fenced_batch(
        exc,
        pid=pid,
        generation=generation,
        partition=partition,
        first=first_seq if numbered else None,
        last=last_seq if numbered else None,
        indeterminate=False,
        why="they never left the producer: it was fenced before sending them",
    )


def _may_have_written(answer: asyncio.Future[protocol.Response]) -> bool:
    """Whether the attempt behind ``answer`` (not an OK one) may have written its batch."""
    if not answer.done() or answer.cancelled() or answer.exception() is not None:
        return True
    return answer.result().error_code not in _REFUSED_BEFORE_APPEND


def _ok_answer(answer: asyncio.Future[protocol.Response] | None) -> protocol.Response | None:
    if answer is None or not answer.done() or answer.cancelled() or answer.exception():
        return None
    resp = answer.result()
    return resp if resp.error_code in (errors.NONE, errors.DUPLICATE) else None


# -- what a sender needs from the rest of the engine, given explicitly -------------------
class Leaders(Protocol):
    """Where each partition's leader is, and a connection to it (``LeaderPool``)."""

    async def connection_for(self, partition: int) -> Connection: ...

    async def refresh(self) -> None: ...


class LeaseView(Protocol):
    """The PID lease batches are sent under (``LeaseKeeper``)."""

    @property
    def pid(self) -> int: ...

    @property
    def generation(self) -> int: ...

    @property
    def token(self) -> str: ...

    def token_ok(self, now_ms: float) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SenderContext:
    """Everything a ``PartitionSender`` uses that it does not own, shared by the senders of
    one producer. The sender never sees the producer: what it reports goes through the
    ``on_*`` callbacks."""

    topic: str
    config: ProducerConfig
    accumulator: Accumulator  # the batches it sends, and the room it gives back
    leaders: Leaders
    lease: LeaseView
    clock_ms: Callable[[], float]  # monotonic, for linger/timeouts/backoff
    wall_ms: Callable[[], float]  # the batches' timestamps
    rng: random.Random  # backoff jitter
    future_condition: threading.Condition | None  # shared by linked batches' RecordFutures
    on_fatal: Callable[[errors.PidleaseError], None]  # fail the producer (and every sender)
    on_retry: Callable[[int, errors.PidleaseError], None]  # (partition, error): stats, log
    on_resent: Callable[[int], None]  # this many batches were sent again


class SenderState(enum.Enum):
    """A sender's lifecycle: RUNNING -> CLOSING (the producer closes: send what is
    pending, then stop) and RUNNING/CLOSING -> FAILED (the producer failed: every record
    was failed, nothing more is sent)."""

    RUNNING = "running"
    CLOSING = "closing"
    FAILED = "failed"


_NEXT_STATES = {
    SenderState.RUNNING: {SenderState.CLOSING, SenderState.FAILED},
    SenderState.CLOSING: {SenderState.FAILED},
    SenderState.FAILED: set(),
}


@dataclass(slots=True, eq=False)
class InFlightBatch:
    source: ProducerBatch  # what it was built from: its records' futures (payloads dropped)
    count: int
    base_sequence: int
    batch: bytes
    first_ms: float  # admission time of its first record
    response: asyncio.Future[protocol.Response] | None = None
    attempts: int = 0
    done: bool = False
    base_offset: int = -1
    duplicate: bool = False
    # An earlier attempt ended without proof that it wrote nothing (see
    # _REFUSED_BEFORE_APPEND): if the producer fails now, the batch's outcome is unknown.
    maybe_written: bool = False

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + self.count - 1


class PartitionSender:
    """The send pipeline of one partition (see the module docstring), written against
    ``SenderContext``: it is given its collaborators and never sees the producer."""

    def __init__(self, ctx: SenderContext, partition: int, *, next_sequence: int) -> None:
        self.ctx = ctx
        self.partition = partition
        self.next_sequence = next_sequence  # auto numbering
        self.last_acked = next_sequence - 1  # highest sequence known durable
        self.acc = ctx.accumulator
        self.in_flight: deque[InFlightBatch] = deque()
        self.resolved = 0  # records of this partition acked or failed
        self.state = SenderState.RUNNING
        self.task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._retry_at: float | None = None
        self._stale_metadata = False
        self._leader_lost = False  # the last retriable answer was about a lost leader
        self._last_error: errors.PidleaseError | None = None
        # The connection the unresolved batches went out on (see _send_new).
        self._conn: Connection | None = None
        cfg = self._config = ctx.config
        self._backoff = Backoff(
            base_ms=cfg.retry_backoff_ms, cap_ms=cfg.retry_backoff_max_ms, rng=ctx.rng
        )
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    # -- called by the producer and the accumulator (loop thread) --------------------------
    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        """The producer is closing: send what waits in the accumulator (no linger), then
        stop."""
        if self.state is SenderState.RUNNING:
            self._move_to(SenderState.CLOSING)
        self._wake.set()

    def failed(self) -> bool:
        return self.state is SenderState.FAILED

    def _move_to(self, state: SenderState) -> None:
        if state not in _NEXT_STATES[self.state]:
            raise RuntimeError(
                f"sender of partition {self.partition}: "
                f"{self.state.value} -> {state.value} is not a transition"
            )
        self.state = state

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"sender-{self.partition}"
        )

    async def wait_resolved(self, target: int) -> None:
        """Until ``target`` records of this partition are resolved (acked or failed); the
        caller closed the open batch first (``Accumulator.close_all``), so they all may
        go now."""
        if self.resolved >= target:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, fut))
        self._wake.set()
        await fut

    def fail_all(self, exc: BaseException) -> None:
        """The producer failed: fail every record here, send nothing more. A batch already
        answered OK (waiting behind an earlier one, or its answer not read yet) was
        written: it resolves as acknowledged. For a fenced producer every other batch gets
        its own ``ProducerFenced`` saying whether it may have been written
        (``_failure_of``), after the answer of an attempt still in flight (acknowledged or
        refused: either is final once fenced)."""
        if self.state is not SenderState.FAILED:
            self._move_to(SenderState.FAILED)
        n = 0
        lease = self.ctx.lease
        for b in self.in_flight:
            if isinstance(exc, ProducerFenced) and b.response is not None and not b.response.done():
                # Fenced: the takeover fenced every partition before it answered, so the
                # answer to this attempt, when it comes, says for sure whether it was
                # written. Wait for it (the connection's request_timeout_ms bounds the wait:
                # no answer by then fails the connection, and the batch as indeterminate).
                b.response.add_done_callback(functools.partial(self._settle_drained, b, exc))
                continue
            self._settle_failed(b, exc)
            n += b.count
        for source in self.acc.take_all(self.partition):
            self._fail_batch(
                source,
                unsent_failure(
                    exc,
                    pid=lease.pid,
                    generation=lease.generation,
                    partition=self.partition,
                    first_seq=source.first_seq,
                    last_seq=source.last_seq,
                ),
            )
            n += len(source.values)
        self.in_flight.clear()
        self._count_resolved(n)
        self._wake.set()

    def _fail_batch(self, source: ProducerBatch, exc: BaseException) -> None:
        source.fail(exc, self.ctx.future_condition)

    def _settle_failed(self, b: InFlightBatch, exc: BaseException) -> None:
        """Resolve a sent batch of a failed producer: acknowledged when it was answered
        OK, else failed with what is known of it (``_failure_of``)."""
        ack = self._ack_of(b)
        if ack is not None:
            b.source.resolve(ack, self.ctx.future_condition)
            self.last_acked = max(self.last_acked, b.last_sequence)
        else:
            self._fail_batch(b.source, self._failure_of(exc, b))

    def _settle_drained(
        self, b: InFlightBatch, exc: BaseException, _answer: asyncio.Future[protocol.Response]
    ) -> None:
        """The answer a fenced producer waited for (see fail_all) arrived, or its
        connection failed."""
        self._settle_failed(b, exc)
        self._count_resolved(b.count)

    def _ack_of(self, b: InFlightBatch) -> BatchAck | None:
        """The acknowledgement of a sent batch, if it was answered OK or DUPLICATE."""
        if not b.done:
            resp = _ok_answer(b.response)
            if resp is None:
                return None
            b.done = True
            b.base_offset = resp.base_offset
            b.duplicate = resp.error_code == errors.DUPLICATE
        return BatchAck(self.ctx.topic, self.partition, b.base_offset, b.base_sequence, b.duplicate)

    def _failure_of(self, exc: BaseException, b: InFlightBatch) -> BaseException:
        """What a sent, unacknowledged batch fails with when the producer fails with
        ``exc``: for a fenced producer (or one closed by ``delivery_timeout_ms``), whether
        the batch may have been written. It was not when every attempt of it was refused
        before an append (its own FENCED answer, say); it may have been when an attempt is
        unanswered or ended otherwise."""
        if not isinstance(exc, (ProducerFenced, DeliveryTimeout)):
            return exc
        if b.response is not None and _may_have_written(b.response):
            b.maybe_written = True
        lease = self.ctx.lease
        if isinstance(exc, DeliveryTimeout):
            return timed_out_batch(
                exc,
                pid=lease.pid,
                generation=lease.generation,
                partition=self.partition,
                first=b.base_sequence,
                last=b.last_sequence,
                indeterminate=b.maybe_written,
                why=(
                    "it was sent and an attempt of it got no answer that rules a write out"
                    if b.maybe_written
                    else "every attempt of it was refused before any append"
                ),
            )
        return fenced_batch(
            exc,
            pid=lease.pid,
            generation=lease.generation,
            partition=self.partition,
            first=b.base_sequence,
            last=b.last_sequence,
            indeterminate=b.maybe_written,
            why=(
                "it was sent and an attempt of it got no answer that rules a write out"
                if b.maybe_written
                else "every attempt of it was refused before any append"
            ),
        )

    # -- the task ------------------------------------------------------------------------
    async def _run(self) -> None:
        ctx = self.ctx
        try:
            while not self.failed():
                self._wake.clear()
                now = ctx.clock_ms()
                self._collect(now)
                if self.failed():
                    break
                self._complete_head()
                if self._check_delivery_timeout(now):
                    break
                if (
                    self.state is SenderState.CLOSING
                    and not self.in_flight
                    and self.acc.empty(self.partition)
                ):
                    break
                if self._retry_at is not None:
                    if any(b.response is not None for b in self.in_flight):
                        # Answers still coming: each wakes the task (_on_answer); the
                        # backoff's deadline, already past or not, is no reason to.
                        await self._wait(self._delivery_deadline_s(now))
                    elif now < self._retry_at or not ctx.lease.token_ok(now):
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
            ctx.on_fatal(
                errors.PidleaseError(f"sender of partition {self.partition} crashed: {exc!r}")
            )
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
        cfg = self._config
        deadlines: list[float] = []
        if not self.ctx.lease.token_ok(now):
            # Nothing may be sent before the renewal, which wakes every sender: a retry
            # time or a linger already past is no reason to wake (it spun until then).
            pass
        elif self._retry_at is not None:
            deadlines.append(self._retry_at)
        elif len(self.in_flight) < cfg.max_in_flight:
            linger = self.acc.linger_deadline_ms(self.partition)
            if linger is not None:
                deadlines.append(linger)
        oldest = self._oldest_ms()
        if cfg.delivery_timeout_ms is not None and oldest is not None:
            deadlines.append(oldest + cfg.delivery_timeout_ms)
        if not deadlines:
            return None
        return max(0.0, (min(deadlines) - now) / 1000)

    def _delivery_deadline_s(self, now: float) -> float | None:
        limit = self._config.delivery_timeout_ms
        oldest = self._oldest_ms()
        if limit is None or oldest is None:
            return None
        return max(0.0, (oldest + limit - now) / 1000)

    def _oldest_ms(self) -> float | None:
        if self.in_flight:
            return self.in_flight[0].first_ms
        return self.acc.oldest_ms(self.partition)

    def _check_delivery_timeout(self, now: float) -> bool:
        limit = self._config.delivery_timeout_ms
        oldest = self._oldest_ms()
        if limit is None or oldest is None or now - oldest < limit:
            return False
        last = (
            f"; last error: {self._last_error.name}: {self._last_error.detail}"
            if self._last_error
            else ""
        )
        self.ctx.on_fatal(
            DeliveryTimeout(
                f"partition {self.partition}: no acknowledgement within "
                f"delivery_timeout_ms={limit}{last}"
            )
        )
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
            if _may_have_written(r):
                b.maybe_written = True  # unless an OK answer settles it just below
            exc: BaseException | None = (
                r.exception() if not r.cancelled() else errors.ServerUnavailable("cancelled")
            )
            if exc is None:
                resp = r.result()
                if resp.error_code in (errors.NONE, errors.DUPLICATE):
                    b.done = True
                    b.base_offset = resp.base_offset
                    b.duplicate = resp.error_code == errors.DUPLICATE
                    self._backoff.reset()
                    self._leader_lost = False
                    continue
                exc = errors.error_for_code(
                    resp.error_code,
                    resp.detail,
                    expected_sequence=resp.expected_sequence,
                    leader=resp.leader,
                )
            if not isinstance(exc, errors.PidleaseError):
                exc = errors.ServerUnavailable(f"{errors.describe(exc)}")
            consequence = unresolved_before and isinstance(
                exc, (errors.OutOfOrderSequence, errors.UnknownPid)
            )
            if retriable(exc) or consequence:
                self._schedule_retry(exc, now)
                unresolved_before = True
                continue
            self.ctx.on_fatal(exc)
            return

    def _schedule_retry(self, exc: errors.PidleaseError, now: float) -> None:
        self._last_error = exc
        if exc.invalid_metadata:  # the leader moved or is gone: look the topic up again
            self._stale_metadata = True
            self._leader_lost = True
        elif self._leader_lost:
            # A leader answers again (the new one, after a failover): the failures that
            # doubled the backoff were about finding it, not about this answer. Typically
            # SEQUENCE_UNKNOWN for a batch it holds above its high watermark, which its
            # followers' next fetch settles in milliseconds; with the outage's backoff
            # carried over it waited up to retry_backoff_max_ms (0.9 s in one of 60 traced
            # failovers).
            self._leader_lost = False
            self._backoff.reset()
        if self._retry_at is None:
            delay = self._backoff.next_ms()
            if exc.invalid_metadata:
                delay = min(delay, max(self._config.retry_backoff_ms, _LEADER_RETRY_MAX_MS))
            self._retry_at = now + delay
        self.ctx.on_retry(self.partition, exc)

    def _complete_head(self) -> None:
        topic = self.ctx.topic
        p = self.partition
        cond = self.ctx.future_condition
        while self.in_flight and self.in_flight[0].done:
            b = self.in_flight.popleft()
            b.source.resolve(BatchAck(topic, p, b.base_offset, b.base_sequence, b.duplicate), cond)
            self.last_acked = max(self.last_acked, b.last_sequence)
            self._count_resolved(b.count)

    def _count_resolved(self, n: int) -> None:
        if not n:
            return
        self.resolved += n
        self.acc.release(n)
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
        cfg = self._config
        if len(self.in_flight) >= cfg.max_in_flight or not self.ctx.lease.token_ok(now):
            return False
        return self.acc.sendable(self.partition, now, force=self.state is SenderState.CLOSING)

    async def _send_new(self) -> None:
        ctx = self.ctx
        try:
            conn = await ctx.leaders.connection_for(self.partition)
        except errors.PidleaseError as exc:
            if not retriable(exc):  # e.g. a server certificate the CA does not vouch for
                ctx.on_fatal(exc)
                return
            self._schedule_retry(exc, ctx.clock_ms())
            return
        if self.failed() or self._retry_at is not None:
            return
        if self.in_flight and conn is not self._conn:
            # The leader map moved under us (any sender's refresh moves every partition's
            # leader) while batches are unanswered on the old connection. Sending the next
            # one on the new connection could get it written before an earlier one that
            # then fails: on a monotonic topic that one's resend is answered DUPLICATE,
            # never written. Wait for every answer, then resend in order (_resend).
            self._retry_at = ctx.clock_ms()
            return
        # Other tasks ran during the await: the batch to send is the partition's oldest now
        # (the open one closes here, so nothing joins it while it is built).
        source = self.acc.next_batch(self.partition)
        if source is None:
            return
        b = self._build_batch(source)
        # Built: only now does the batch leave the accumulator. A build that raises leaves
        # it there, where the crash handler's fail_all fails and counts its records (held
        # only here, they were never resolved and flush() waited for ever).
        self.acc.pop(self.partition, source)
        self.in_flight.append(b)
        self._transmit(b, conn)

    def _build_batch(self, source: ProducerBatch) -> InFlightBatch:
        n = len(source.values)
        base = source.first_seq if source.first_seq >= 0 else self.next_sequence
        lease = self.ctx.lease
        stamp = source.timestamp_ms  # the caller's (send_batch(timestamp_ms=)), or None
        wire = source.batch(
            pid=lease.pid,
            generation=lease.generation,
            base_sequence=base,
            timestamp_ms=int(self.ctx.wall_ms()) if stamp is None else stamp,
        )
        if source.first_seq >= 0:
            self.next_sequence = max(self.next_sequence, source.last_seq + 1)
        else:
            self.next_sequence += n
        # The batch is frozen from here on (a resend is the same bytes): the payloads are
        # not needed any more, and the records' futures keep it alive.
        source.values = []
        source.keyed = None
        return InFlightBatch(source, n, base, wire, source.first_ms)

    def _transmit(self, b: InFlightBatch, conn: Connection) -> None:
        ctx = self.ctx
        corr = conn.next_correlation_id()
        data = protocol.produce_request(corr, ctx.topic, self.partition, ctx.lease.token, b.batch)
        b.attempts += 1
        self._conn = conn
        b.response = conn.send(
            protocol.PRODUCE, corr, data, timeout_ms=self._config.request_timeout_ms
        )
        b.response.add_done_callback(self._on_answer)

    def _on_answer(self, _fut: asyncio.Future[protocol.Response]) -> None:
        self._wake.set()

    async def _resend(self) -> None:
        ctx = self.ctx
        try:
            if self._stale_metadata:
                await ctx.leaders.refresh()
                self._stale_metadata = False
            conn = await ctx.leaders.connection_for(self.partition)
        except errors.PidleaseError as exc:
            self._retry_at = None
            if not retriable(exc):
                ctx.on_fatal(exc)
                return
            self._schedule_retry(exc, ctx.clock_ms())
            return
        if self.failed() or not ctx.lease.token_ok(ctx.clock_ms()):
            return
        resent = 0
        for b in self.in_flight:
            if not b.done and b.response is None:
                self._transmit(b, conn)
                resent += 1
        if resent:
            log.debug(
                "partition %s: resent %d batch(es) to %s", self.partition, resent, conn.address
            )
            ctx.on_resent(resent)
        self._retry_at = None
