"""``Accumulator``: the records a producer admitted that its senders have not taken yet.

Per partition it owns the open batch (records are appended to it; ``producer_batch.py``),
the closed batches waiting for the partition's sender, in admission order, and the linger
deadline (the first record of the oldest waiting batch, plus ``linger_ms``). For the whole
producer it owns one buffer counter, ``used``: records admitted and not resolved yet, plus
the room an open batch has reserved for records the blocking ``Producer.send`` appends
itself. Admission waits while ``used`` reaches ``buffer_records_max``.

Both sides of it take the producer's lock (``lock``) to change it, except where a
method says why it need not:

- the producer appends (``append``, ``append_closed``; ``Producer.send``'s inline case
  appends to ``open[p]`` itself, within the room the batch reserved);
- a partition's sender takes its batches (``next_batch`` then ``pop``, in that order so a
  batch whose build fails stays here, where ``take_all`` finds it), reads the deadlines
  (``linger_deadline_ms``, ``oldest_ms``: a read of one slot, without the lock), and gives
  the room back when records resolve (``release``).

Nothing here calls the producer. When a partition gets something to send (a new open
batch, whose linger timer its sender must arm, or a closed batch), its sender is woken
(``attach``): directly on the event loop, or, when records are appended on callers'
threads (the blocking ``Producer``), once per burst through ``call_soon_threadsafe``.

The shape is aiokafka's ``MessageAccumulator`` (batches per partition, drained by the
sender, which never sees the producer), with the futures resolved a batch at a time by one
store (``record_future.py``) and, for the blocking producer, the buffer counted per batch
(the room an open batch reserves), not per record.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from pidlease.client.config import RECORD_OVERHEAD, ProducerConfig
from pidlease.client.producer_batch import ProducerBatch

__all__ = ["Accumulator"]


class Accumulator:
    """The batches of every partition of one producer that its senders have not taken
    (see the module docstring). The producer's methods run with ``lock`` held by the
    caller; the sender's take it themselves, or say why they need not."""

    def __init__(
        self,
        config: ProducerConfig,
        partitions: int,
        *,
        lock: threading.Lock,
        clock_ms: Callable[[], float],
        linked: bool,
        call_soon_threadsafe: Callable[[Callable[[], None]], Any] | None = None,
    ) -> None:
        self.lock = lock
        self._clock_ms = clock_ms
        # Linked batches: their records' futures are RecordFutures pointing at the batch
        # (the blocking Producer), and an open batch reserves room for send's inline case.
        self._linked = linked
        self._linger_ms = config.linger_ms
        self._records_max = config.batch_records_max
        self._bytes_max = config.batch_bytes_max
        self.buffer_max = config.buffer_records_max
        # per partition: the open batch (read by Producer.send's inline case), the closed
        # ones in admission order, and how many records ever closed (flush's targets)
        self.open: list[ProducerBatch | None] = [None] * partitions
        self.closed: list[deque[ProducerBatch]] = [deque() for _ in range(partitions)]
        self.closed_records = [0] * partitions
        # The one buffer counter: unresolved records, plus each open batch's room
        # reserved beyond its records (cap - len(values)).
        self.used = 0
        self.space = threading.Condition(lock)  # blocking waits for room
        self.space_event = asyncio.Event()  # asyncio waits for room (set: maybe room)
        self.space_event.set()
        self._wakers: list[Callable[[], None]] = [_nothing] * partitions
        self._call_soon = call_soon_threadsafe
        self._touched: set[int] = set()
        self._wakeup_scheduled = False

    # -- set-up ---------------------------------------------------------------------------
    def attach(self, partition: int, wake: Callable[[], None]) -> None:
        """``wake`` (loop thread) tells the partition's sender it has something new."""
        self._wakers[partition] = wake

    def grow(self, partitions: int) -> None:
        """Slots for partitions added to the topic."""
        more = partitions - len(self.open)
        self.open.extend([None] * more)
        self.closed.extend(deque() for _ in range(more))
        self.closed_records.extend([0] * more)
        self._wakers.extend([_nothing] * more)

    # -- the producer's side ----------------------------------------------------------------
    def has_room(self, partition: int | None = None) -> bool:
        """Whether a record may be admitted now: ``used`` is below buffer_records_max, or
        the open batch of ``partition`` has room reserved already."""
        if self.used < self.buffer_max:
            return True
        if type(partition) is int and 0 <= partition < len(self.open):
            batch = self.open[partition]
            return batch is not None and len(batch.values) < batch.cap
        return False

    def append(
        self, partition: int, key: bytes | None, value: bytes, future: Any, seq: int
    ) -> None:
        """Append one admitted record (``seq`` -1 unless the caller numbers records) to the
        partition's open batch; a new one when it cannot take it (full, or a hole in
        explicit ids), the old one closed. Reserves room: one record, or for a linked
        batch up to the batch limits for records as long as its first, within what is
        free of buffer_records_max (Producer.send's inline case fills it)."""
        batch = self.open[partition]
        if batch is None or not batch.add(key, value, future, seq):
            if batch is not None:
                self._close(partition, batch)
            batch = ProducerBatch(
                self._clock_ms(), seq, self._records_max, self._bytes_max, linked=self._linked
            )
            batch.add(key, value, future, seq)
            self.open[partition] = batch
            self._wake(partition)  # its sender arms the linger timer
        n = len(batch.values)
        if self._linked:
            fits = min(
                self._records_max,
                n + (self._bytes_max - batch.total()) // (batch.vlen + RECORD_OVERHEAD),
            )
            cap = max(n, min(fits, batch.cap + self.buffer_max - self.used))
        else:
            cap = n
        self.used += cap - batch.cap
        batch.cap = cap

    def append_closed(self, partition: int, batches: list[ProducerBatch]) -> None:
        """Closed batches of one call (``send_batch``), after the records appended before
        it: the open batch closes first."""
        if not batches:
            return
        batch = self.open[partition]
        if batch is not None:
            self._close(partition, batch, wake=False)  # one wake-up below for both
        queue = self.closed[partition]
        n = 0
        for b in batches:
            queue.append(b)
            n += len(b.values)
        self.used += n
        self.closed_records[partition] += n
        self._wake(partition)

    def close_all(self) -> list[int]:
        """Close every open batch (a flush or a close: nothing lingers any more); returns,
        per partition, how many records ever closed there."""
        for p, batch in enumerate(self.open):
            if batch is not None:
                self._close(p, batch)
        return list(self.closed_records)

    def unresolved(self) -> int:
        """Records admitted and not resolved yet."""
        reserved = sum(b.cap - len(b.values) for b in self.open if b is not None)
        return self.used - reserved

    def _close(self, partition: int, batch: ProducerBatch, *, wake: bool = True) -> None:
        n = len(batch.values)
        self.used -= batch.cap - n  # its unused room is free again
        batch.cap = 0
        if self.open[partition] is batch:
            self.open[partition] = None
        self.closed[partition].append(batch)
        self.closed_records[partition] += n
        self.space.notify_all()
        if wake:
            self._wake(partition)

    def _wake(self, partition: int) -> None:
        call_soon = self._call_soon
        if call_soon is None:
            self._wakers[partition]()
            return
        self._touched.add(partition)
        if not self._wakeup_scheduled:
            self._wakeup_scheduled = True
            call_soon(self._wake_touched)

    def _wake_touched(self) -> None:
        """Loop thread: wake the senders of the partitions touched since the last call."""
        with self.lock:
            self._wakeup_scheduled = False
            touched, self._touched = self._touched, set()
        for p in touched:
            self._wakers[p]()

    # -- a sender's side --------------------------------------------------------------------
    def linger_deadline_ms(self, partition: int) -> float | None:
        """When the partition's oldest waiting batch may go, lingering over (without the
        lock: a read of one slot). None: nothing waits."""
        closed = self.closed[partition]
        batch = closed[0] if closed else self.open[partition]
        return None if batch is None else batch.first_ms + self._linger_ms

    def oldest_ms(self, partition: int) -> float | None:
        """Admission time of the partition's oldest waiting record (without the lock)."""
        closed = self.closed[partition]
        batch = closed[0] if closed else self.open[partition]
        return None if batch is None else batch.first_ms

    def sendable(self, partition: int, now_ms: float, force: bool) -> bool:
        """Whether the partition has a batch that may go now (without the lock): a closed
        one, or an open one that is full, has lingered ``linger_ms``, or ``force``
        (the producer closes)."""
        if self.closed[partition]:
            return True
        batch = self.open[partition]
        return batch is not None and (
            force or now_ms - batch.first_ms >= self._linger_ms or batch.full()
        )

    def empty(self, partition: int) -> bool:
        return not self.closed[partition] and self.open[partition] is None

    def next_batch(self, partition: int) -> ProducerBatch | None:
        """The partition's next batch to send, still queued (``pop`` it once built): the
        oldest closed one, else the open one, which closes (nothing joins it any more)."""
        closed = self.closed[partition]
        if closed:  # only this partition's sender takes from the left: no lock needed
            return closed[0]
        with self.lock:
            if not closed:
                batch = self.open[partition]
                if batch is None:
                    return None
                self._close(partition, batch, wake=False)
            return closed[0]

    def pop(self, partition: int, batch: ProducerBatch) -> None:
        """``batch`` (from ``next_batch``) was built into a request: it leaves the queue.
        Without the lock: a deque's popleft and the producer's appends (on the right, under
        the lock) are each atomic, and only the partition's sender pops."""
        taken = self.closed[partition].popleft()
        assert taken is batch, "a sender pops the batch next_batch gave it"

    def take_all(self, partition: int) -> list[ProducerBatch]:
        """Every batch of the partition, open and closed, in admission order (its sender
        fails them: the producer failed)."""
        with self.lock:
            batch = self.open[partition]
            if batch is not None:
                self._close(partition, batch, wake=False)
            queue = self.closed[partition]
            taken = list(queue)
            queue.clear()
        return taken

    def release(self, n: int) -> None:
        """``n`` records resolved (acked or failed): their room is free (loop thread)."""
        with self.lock:
            self.used -= n
            self.space.notify_all()
        self.space_event.set()


def _nothing() -> None:
    pass
