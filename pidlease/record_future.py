"""``RecordFuture``: the ``concurrent.futures.Future`` that ``Producer.send`` returns, made
cheap enough to create one per record.

A plain ``concurrent.futures.Future`` builds a ``threading.Condition`` (and its lock) in
``__init__`` and takes it again in ``set_result``: profiling showed those two at more than
half of the producer's CPU per record. Kafka's Java producer answers the same problem with
one latch per batch behind light per-record futures; here all the futures of one producer
share one Condition, a batch is resolved under one acquisition of it with one
``notify_all``, and the ``RecordMetadata`` of a record is only built when someone asks
for it (``result()``), from the batch's answer.

Creating one costs about as much as creating an empty object: the Condition is a class
attribute of a subclass made per producer (``future_class``), the fields start as class
attributes (``_state`` PENDING, no result), and the two lists the base class keeps
(``_waiters`` for ``concurrent.futures.wait``, ``_done_callbacks``) are made on first use.

Sharing a Condition means a waiter can be woken by another future's resolution, so
``result``/``exception`` re-check their own state in a loop (``Condition.wait_for``) where
the base class waits once. Everything else (``done``, ``cancel``, ``add_done_callback``,
``concurrent.futures.wait``/``as_completed``, ``asyncio.wrap_future``) is the base
class's own code working on the same fields, which this module sets exactly as
``Future.set_result``/``set_exception`` do.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING, RUNNING
from typing import Any

_SETTLED = (FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED)
_OPEN = (PENDING, RUNNING)


class BatchAck:
    """What the server answered for one batch; each record's metadata is derived from it."""

    __slots__ = ("base_offset", "base_sequence", "duplicate", "partition", "topic")

    def __init__(self, topic: str, partition: int, base_offset: int, base_sequence: int,
                 duplicate: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = base_offset
        self.base_sequence = base_sequence
        self.duplicate = duplicate

    def metadata(self, i: int) -> Any:
        from pidlease.sender import RecordMetadata  # sender imports this module

        off = self.base_offset + i if self.base_offset >= 0 else -1
        return RecordMetadata(self.topic, self.partition, off, self.base_sequence + i,
                              self.duplicate)


class RecordFuture(Future):  # type: ignore[type-arg]
    """The future of one record's ``RecordMetadata``; see the module docstring. Use the
    class ``future_class(condition)`` returns: it carries the shared Condition."""

    _condition: threading.Condition
    _state = PENDING
    _result: Any = None      # RecordMetadata, or (BatchAck, index) until first asked for
    _exception: BaseException | None = None

    def __init__(self) -> None:
        # Deliberately not calling Future.__init__: it would build a Condition per record.
        pass

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes never set: the base class's lists, made on first use.
        if name == "_waiters" or name == "_done_callbacks":
            made: list[Any] = []
            object.__setattr__(self, name, made)
            return made
        raise AttributeError(name)

    def _settled(self) -> bool:
        return self._state in _SETTLED

    def _outcome(self) -> Any:
        if self._state != FINISHED:
            raise CancelledError()
        if self._exception is not None:
            raise self._exception
        r = self._result
        if type(r) is tuple:
            ack, i = r
            r = self._result = ack.metadata(i)
        return r

    def result(self, timeout: float | None = None) -> Any:
        with self._condition:
            if not self._condition.wait_for(self._settled, timeout):
                raise TimeoutError()
            return self._outcome()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        with self._condition:
            if not self._condition.wait_for(self._settled, timeout):
                raise TimeoutError()
            if self._state != FINISHED:
                raise CancelledError()
            return self._exception

    def __repr__(self) -> str:
        return f"<RecordFuture at {id(self):#x} state={self._state.lower()}>"


def future_class(condition: threading.Condition) -> type[RecordFuture]:
    """A RecordFuture class whose instances share ``condition`` (one per producer)."""
    return type("RecordFuture", (RecordFuture,), {"_condition": condition, "__slots__": ()})


def resolve_batch(condition: threading.Condition, futures: Sequence[RecordFuture],
                  ack: BatchAck) -> None:
    """Resolve the futures of one batch (record ``i`` is ``futures[i]``) under one
    acquisition of the shared Condition; futures the user cancelled stay cancelled."""
    with_callbacks = []
    with condition:
        for i, f in enumerate(futures):
            d = f.__dict__   # not f._waiters: that would make the lists
            if not d:
                # Untouched since it was made (the usual case): pending, nobody waits,
                # no callbacks. Two stores, nothing else, for each record of the batch.
                d["_result"] = (ack, i)
                d["_state"] = FINISHED
                continue
            if f._state in _OPEN:
                f._result = (ack, i)
                f._state = FINISHED
                if "_waiters" in d:
                    for w in d["_waiters"]:
                        w.add_result(f)
                if d.get("_done_callbacks"):
                    with_callbacks.append(f)
        condition.notify_all()
    for f in with_callbacks:
        f._invoke_callbacks()


def settle_unseen(future: RecordFuture, ack: BatchAck, i: int) -> None:
    """Resolve a future that has not been handed to anyone yet (no waiter, no callback
    can exist), without taking the Condition: as record ``i`` of ``ack``."""
    d = future.__dict__
    d["_result"] = (ack, i)
    d["_state"] = FINISHED


def fail_all(condition: threading.Condition, futures: Iterable[RecordFuture],
             exc: BaseException) -> None:
    """Fail every still-open future with ``exc``."""
    with_callbacks = []
    with condition:
        for f in futures:
            if f._state in _OPEN:
                f._exception = exc
                f._state = FINISHED
                d = f.__dict__
                if "_waiters" in d:
                    for w in d["_waiters"]:
                        w.add_exception(f)
                if d.get("_done_callbacks"):
                    with_callbacks.append(f)
        condition.notify_all()
    for f in with_callbacks:
        f._invoke_callbacks()
