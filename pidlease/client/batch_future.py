"""The outcome of one ``send_batch`` call: ``BatchTracker`` collects the outcome of each of
the call's batches (one ``EncodedBatch`` each, plus the replayed ids resolved at once) and
completes the call's one future when the last is settled: ``BatchFuture`` (the blocking
``Producer``'s, a ``concurrent.futures.Future``) or ``AsyncBatchFuture``. Their result,
``BatchMetadata``, is a lazy sequence: a record's ``RecordMetadata`` is made from its
batch's ``BatchAck`` when someone looks at it, so a call of a million records costs
nothing per record until then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from pidlease.client.structs import BatchAck, RecordMetadata

__all__ = ["AsyncBatchFuture", "BatchFuture", "BatchMetadata", "BatchTracker", "Positions"]

Positions = Any  # range, list[int] or a numpy int array: input indices, increasing


@dataclass(slots=True)
class _Segment:
    positions: Positions  # input positions of its records, in order
    indices: list[int] | None  # record j is metadata(indices[j]) (replays); None: j
    outcome: BatchAck | BaseException | None = None


class BatchTracker:
    """The outcome of one ``send_batch`` call: one segment per run (and per partition's
    replayed ids); ``on_done`` runs once, when the call is sealed and every segment is
    settled (on whichever thread settles last)."""

    def __init__(self, n: int, on_done: Callable[[BatchTracker], None]) -> None:
        self.n = n
        self.segments: list[_Segment] = []
        self._pending = 1  # the seal: nothing completes before every run is known
        self._lock = threading.Lock()
        self._on_done = on_done

    def add(self, positions: Positions, indices: list[int] | None = None) -> int:
        self.segments.append(_Segment(positions, indices))
        with self._lock:
            self._pending += 1
        return len(self.segments) - 1

    def add_settled(self, positions: Positions, indices: list[int], ack: BatchAck) -> None:
        self.segments.append(_Segment(positions, indices, ack))

    def settle(self, slot: int, outcome: BatchAck | BaseException) -> None:
        seg = self.segments[slot]
        with self._lock:
            if seg.outcome is not None:
                return
            seg.outcome = outcome
            self._pending -= 1
            done = self._pending == 0
        if done:
            self._on_done(self)

    def seal(self) -> None:
        with self._lock:
            self._pending -= 1
            done = self._pending == 0
        if done:
            self._on_done(self)

    def first_error(self) -> BaseException | None:
        """The error of the failed record that comes first in input order, if any."""
        first: tuple[int, BaseException] | None = None
        for seg in self.segments:
            if isinstance(seg.outcome, BaseException) and len(seg.positions):
                at = int(seg.positions[0])
                if first is None or at < first[0]:
                    first = (at, seg.outcome)
        return None if first is None else first[1]


class BatchMetadata(Sequence[Any]):
    """Per record of a ``send_batch`` call, in input order: its ``RecordMetadata`` (or, from
    ``outcomes()``, the exception it failed with). Lazy: a record's metadata is made when
    it is looked at. ``duplicates``: how many records the server already had."""

    def __init__(self, tracker: BatchTracker) -> None:
        self._t = tracker
        self._where: tuple[list[int], list[int]] | None = None

    def __len__(self) -> int:
        return self._t.n

    @property
    def duplicates(self) -> int:
        return sum(
            len(s.positions)
            for s in self._t.segments
            if isinstance(s.outcome, BatchAck) and s.outcome.duplicate
        )

    def _locate(self) -> tuple[list[int], list[int]]:
        if self._where is None:
            seg_of = [0] * self._t.n
            idx_of = [0] * self._t.n
            for k, seg in enumerate(self._t.segments):
                pos = seg.positions
                if isinstance(pos, range):
                    seg_of[pos.start : pos.stop] = [k] * len(pos)
                    idx_of[pos.start : pos.stop] = seg.indices or range(len(pos))
                    continue
                pos_list = pos if isinstance(pos, list) else pos.tolist()
                indices = seg.indices or range(len(pos_list))
                for i, j in zip(pos_list, indices, strict=True):
                    seg_of[i] = k
                    idx_of[i] = j
            self._where = (seg_of, idx_of)
        return self._where

    def _item(self, i: int) -> RecordMetadata | BaseException:
        seg_of, idx_of = self._locate()
        out = self._t.segments[seg_of[i]].outcome
        if isinstance(out, BatchAck):
            return out.metadata(idx_of[i])
        assert out is not None  # a done call has every segment settled
        return out

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._item(j) for j in range(*i.indices(self._t.n))]
        if i < 0:
            i += self._t.n
        if not 0 <= i < self._t.n:
            raise IndexError(i)
        return self._item(i)

    def __iter__(self) -> Iterator[Any]:
        return (self._item(i) for i in range(self._t.n))

    def __repr__(self) -> str:
        return f"<BatchMetadata of {self._t.n} records>"


class BatchFuture(concurrent.futures.Future[BatchMetadata]):
    """``Producer.send_batch``'s future: its result is the ``BatchMetadata`` of the call's
    records in input order; when any record failed, ``result()`` raises the error of the
    first failed record (in input order) and ``outcomes()`` says, per record, what
    happened to it (each batch of a fenced producer carries its own ``ProducerFenced``)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.tracker = BatchTracker(n, self._done)

    def _done(self, tracker: BatchTracker) -> None:
        exc = tracker.first_error()
        try:
            if exc is None:
                self.set_result(BatchMetadata(tracker))
            else:
                self.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            pass  # cancelled by the user

    def outcomes(self) -> BatchMetadata:
        """Per record, its RecordMetadata or its exception (once the future is done)."""
        if not self.done():
            raise concurrent.futures.InvalidStateError("the batch is not resolved yet")
        return BatchMetadata(self.tracker)


class AsyncBatchFuture(asyncio.Future[BatchMetadata]):
    """``AsyncProducer.send_batch``'s future (see ``BatchFuture``)."""

    def __init__(self, n: int, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.tracker = BatchTracker(n, self._done)

    def _done(self, tracker: BatchTracker) -> None:
        if self.done():
            return
        exc = tracker.first_error()
        if exc is None:
            self.set_result(BatchMetadata(tracker))
        else:
            self.set_exception(exc)

    def outcomes(self) -> BatchMetadata:
        if not self.done():
            raise asyncio.InvalidStateError("the batch is not resolved yet")
        return BatchMetadata(self.tracker)
