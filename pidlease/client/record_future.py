"""``RecordFuture``: the ``concurrent.futures.Future`` that ``Producer.send`` returns, made
cheap enough to create one per record, and resolved a batch at a time with no work per
record.

A plain ``concurrent.futures.Future`` builds a ``threading.Condition`` (and its lock) in
``__init__`` and takes it again in ``set_result``: profiling showed those two at more than
half of the producer's CPU per record. Kafka's Java producer answers the same problem with
one latch per batch behind light per-record futures (``FutureRecordMetadata`` points at
its batch's ``ProduceRequestResult``). This module does the same:

- A ``RecordFuture`` holds only where its record is: ``batch_outcome`` (the ``BatchOutcome`` of
  its batch, in practice the ``ProducerBatch`` the record was appended to) and
  ``record_index`` (the record's index in it). Its state is read from the batch: resolving
  a batch is one store on the batch (``resolve_outcome`` / ``fail_outcome``), whatever the number
  of records.
- Where its record is is the future's public contract with whoever makes it: set once,
  before the future is handed out (``place``; the blocking producer's inline send path
  makes the two stores itself, since a call per record costs it ~8 % of ``send()``'s CPU:
  bench/bench_send.py), read only here afterwards.
- All the futures of one producer share one Condition (a class attribute of a subclass
  made per producer, ``future_class``); a batch is resolved under one acquisition of it
  with one ``notify_all``.
- The ``RecordMetadata`` of a record is built only when someone asks for it
  (``result()``), from the batch's answer, and kept.
- The two lists the base class keeps (``_waiters`` for ``concurrent.futures.wait``,
  ``_done_callbacks``) are made on first use, and a future that gets one is noted on its
  batch (``watched``), so resolution visits only those.

Sharing a Condition means a waiter can be woken by another batch's resolution, so
``result``/``exception`` re-check their own state in a loop (``Condition.wait_for``) where
the base class waits once. Everything else (``done``, ``cancel``, ``add_done_callback``,
``concurrent.futures.wait``/``as_completed``, ``asyncio.wrap_future``) is the base
class's own code working on ``_state`` (a property here: the future's own state when it was
cancelled or set by hand, else its batch's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future

# -- the one place that leans on concurrent.futures internals ----------------------------
# Why: a RecordFuture must *be* a concurrent.futures.Future (``asyncio.wrap_future`` checks
# isinstance; ``concurrent.futures.wait``/``as_completed`` read ``_condition``, ``_state``
# and ``_waiters`` of any future they are given, and ``add_done_callback`` calls
# ``_invoke_callbacks``). Being one without the base class's ``__init__`` (a Condition per
# record, the cost this module exists to avoid) means speaking its private protocol: the
# state strings below, the attributes ``_condition``, ``_state``, ``_waiters``,
# ``_done_callbacks``, ``_result``, ``_exception``, and the waiters' ``add_result`` /
# ``add_exception``. No public API offers it (composition with a real Future per record
# is the cost we avoid), so it is named here once, and
# tests/unit/client/test_record_future.py pins it against the running Python
# (``test_the_future_internals_this_module_uses_are_there``).
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import Any

from pidlease.client.structs import BatchAck, RecordMetadata

_SETTLED = (FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED)

__all__ = [
    "BatchAck",
    "RecordFuture",
    "BatchOutcome",
    "fail_all",
    "fail_outcome",
    "future_class",
    "place",
    "resolve_outcome",
    "settle",
    "settled_outcome",
]

_INVALID_STATE = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)


class BatchOutcome:
    """The shared outcome of a batch's records: PENDING, then FINISHED with ``outcome`` a
    ``BatchAck`` or an exception. ``watched``: futures of the batch with waiters or callbacks."""

    __slots__ = ("outcome", "state", "watched")

    def __init__(self) -> None:
        self.state = PENDING
        self.outcome: BatchAck | BaseException | None = None
        self.watched: list[RecordFuture] | None = None


def settled_outcome(outcome: BatchAck | BaseException) -> BatchOutcome:
    """An outcome that is already resolved (``outcome``: a BatchAck or an exception)."""
    batch = BatchOutcome()
    batch.outcome = outcome
    batch.state = FINISHED
    return batch


class RecordFuture(Future[RecordMetadata]):
    """The future of one record's ``RecordMetadata``; see the module docstring. Use the
    class ``future_class(condition)`` returns: it carries the shared Condition. Whoever
    makes one places it on its batch at once (sets ``batch_outcome`` and ``record_index``, or
    calls ``place``) and never again."""

    _condition: threading.Condition
    batch_outcome: BatchOutcome  # the outcome of this future's record's batch
    record_index: int = 0  # the record's index in it
    _own: str | None = None  # the state set on this future itself (cancel, set_result)
    _result: Any = None  # RecordMetadata once built (or set by hand)
    _exception: BaseException | None = None

    # Deliberately not Future.__init__ (it builds a Condition per record): creating one
    # costs what an empty object costs.
    __init__ = object.__init__

    @property
    def _state(self) -> str:
        own = self._own
        return own if own in _SETTLED else self.batch_outcome.state

    @_state.setter
    def _state(self, value: str) -> None:
        self._own = value

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes never set: the base class's lists, made on first
        # use (under the shared Condition, as the base class uses them), and the future is
        # noted on its batch so that resolving the batch reaches its waiters and callbacks.
        if name in {"_waiters", "_done_callbacks"}:
            made: list[Any] = []
            object.__setattr__(self, name, made)
            batch = self.batch_outcome
            if batch.state == PENDING:  # a resolved batch never looks at them again
                if batch.watched is None:
                    batch.watched = [self]
                else:
                    batch.watched.append(self)
            return made
        raise AttributeError(name)

    def _settled(self) -> bool:
        return self._state in _SETTLED

    def _outcome(self) -> Any:
        if self._state != FINISHED:
            raise CancelledError
        r = self._result
        if r is not None:
            return r
        if self._own == FINISHED:  # set by hand with set_result / set_exception
            if self._exception is not None:
                raise self._exception
            return r
        out = self.batch_outcome.outcome
        if isinstance(out, BaseException):
            raise out
        assert out is not None  # FINISHED: an outcome was stored with the state
        r = self._result = out.metadata(self.record_index)
        return r

    def result(self, timeout: float | None = None) -> Any:
        if self._own is None and self.batch_outcome.state == FINISHED:  # no lock needed: final
            return self._outcome()
        with self._condition:
            if not self._condition.wait_for(self._settled, timeout):
                raise TimeoutError
            return self._outcome()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._own is None and self.batch_outcome.state == FINISHED:
            out = self.batch_outcome.outcome
            return out if isinstance(out, BaseException) else None
        with self._condition:
            if not self._condition.wait_for(self._settled, timeout):
                raise TimeoutError
            if self._state != FINISHED:
                raise CancelledError
            if self._own == FINISHED:
                return self._exception
            out = self.batch_outcome.outcome
            return out if isinstance(out, BaseException) else None

    def __repr__(self) -> str:
        return f"<RecordFuture at {id(self):#x} state={self._state.lower()}>"


def future_class(condition: threading.Condition) -> type[RecordFuture]:
    """A RecordFuture class whose instances share ``condition`` (one per producer)."""
    return type("RecordFuture", (RecordFuture,), {"_condition": condition})


def _settle(condition: threading.Condition, batch: BatchOutcome, outcome: Any) -> None:
    failed = isinstance(outcome, BaseException)
    with_callbacks = []
    with condition:
        if batch.state != PENDING:
            return  # resolved already: it keeps its outcome
        batch.outcome = outcome
        batch.state = FINISHED
        if batch.watched:
            for f in dict.fromkeys(batch.watched):
                if f._own in _SETTLED:  # noqa: SLF001 - RecordFuture's own module
                    continue  # cancelled (or set) by the user: stays so
                d = f.__dict__
                for w in d.get("_waiters", ()):
                    if failed:
                        w.add_exception(f)
                    else:
                        w.add_result(f)
                if d.get("_done_callbacks"):
                    with_callbacks.append(f)
        condition.notify_all()
    for f in with_callbacks:
        f._invoke_callbacks()  # noqa: SLF001 - Future's private protocol, see the top


def resolve_outcome(condition: threading.Condition, batch: BatchOutcome, ack: BatchAck) -> None:
    """Resolve every future of ``batch`` (record ``i`` gets ``ack.metadata(i)``) at once;
    futures the user cancelled stay cancelled. A batch already resolved is left alone."""
    _settle(condition, batch, ack)


def fail_outcome(condition: threading.Condition, batch: BatchOutcome, exc: BaseException) -> None:
    """Fail every still-open future of ``batch`` with ``exc``."""
    _settle(condition, batch, exc)


def place(future: RecordFuture, batch: BatchOutcome, i: int) -> None:
    """Make ``future`` the future of record ``i`` of ``batch`` (its state and outcome are the
    batch's from now on). Only for a future not handed to anyone yet: no lock needed."""
    future.batch_outcome = batch
    future.record_index = i


def fail_all(
    condition: threading.Condition, batches: Iterable[BatchOutcome], exc: BaseException
) -> None:
    """Fail every batch of ``batches`` that is still open."""
    for batch in batches:
        _settle(condition, batch, exc)


def settle(
    fut: asyncio.Future[Any] | Future[Any], result: Any = None, exc: BaseException | None = None
) -> None:
    """Resolve one user future (an ``AsyncProducer``'s asyncio future, or any
    ``concurrent.futures.Future``) unless the user already cancelled it."""
    if fut.done():
        return
    try:
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)
    except _INVALID_STATE:
        pass  # cancelled by the user in another thread between done() and here
