"""``ProducerBatch``: one batch of one partition being filled, record by record, and sent
as one produce request; with the ``BatchOutcome`` its records' futures share.

A record reaches the wire without per-record work on the producer's event loop:
``Accumulator.append`` (or ``Producer.send``'s inline case) appends the record's value (a
keyed record: key and value, its key length noted) to the partition's open batch; a new
batch starts when the open one is full by ``batch_records_max`` / ``batch_bytes_max`` or,
with explicit sequence ids, when the id does not follow the previous one. The partition's
sender takes closed batches from the accumulator and turns each into the request's batch
with one join, one CRC and one header (``batch``). As in Kafka's ``RecordAccumulator``,
batch boundaries are decided when records are appended: a ``ProducerBatch`` is exactly
one batch on the wire.

It is also a ``BatchOutcome`` (``record_future.py``): the blocking ``Producer``'s
``RecordFuture``s point at it (a linked batch), so resolving the batch is one store,
whatever the number of records. An ``AsyncProducer``'s asyncio futures are kept in
``futures`` and resolved one by one.

It keeps only what a batch needs: the payloads, which of them carry a key, the admission
time of its first record (linger and delivery timeout count from it) and, in explicit
mode, its first and last sequence ids.
"""

from __future__ import annotations

import itertools
import threading
from functools import partial
from typing import Any

from pidlease.client.config import RECORD_OVERHEAD
from pidlease.client.record_future import BatchOutcome, fail_outcome, place, resolve_outcome, settle
from pidlease.client.structs import BatchAck
from pidlease.wire import protocol
from pidlease.wire.protocol import BATCH_HEADER_SIZE

__all__ = ["RECORD_OVERHEAD", "ProducerBatch"]

_REC_HEAD = protocol.REC_HEAD
_head_no_key = partial(_REC_HEAD.pack, -1)


class ProducerBatch(BatchOutcome):
    __slots__ = (
        "bytes_max",
        "cap",
        "counted",
        "first_ms",
        "first_seq",
        "futures",
        "keyed",
        "last_seq",
        "records_max",
        "size",
        "timestamp_ms",
        "values",
        "vlen",
    )

    def __init__(
        self,
        first_ms: float,
        first_seq: int,
        records_max: int,
        bytes_max: int,
        *,
        linked: bool = False,
    ) -> None:
        super().__init__()
        self.values: list[bytes] = []  # per record: its value, or key + value when keyed
        self.keyed: dict[int, int] | None = None  # record index -> key length
        # The asyncio futures of the records (AsyncProducer); None when the records'
        # RecordFutures point at this batch instead (``linked``: the blocking Producer).
        self.futures: list[Any] | None = None if linked else []
        self.size = BATCH_HEADER_SIZE  # bytes of the batch made of the first `counted` records
        self.counted = 0
        # The blocking Producer's send appends records with no key whose value is `vlen`
        # bytes long (the first record's) itself, while fewer than `cap` records are in the
        # batch (cap: what it reserved of buffer_records_max, within the batch limits), and
        # leaves size/counted alone: each such record adds vlen + 8 bytes (see total()).
        self.vlen = -1
        self.cap = 0
        self.first_ms = first_ms
        self.first_seq = first_seq  # -1: the producer numbers records itself
        self.last_seq = first_seq - 1
        self.records_max = records_max
        self.bytes_max = bytes_max
        # The batch's timestamp when the caller gave one (``send_batch(timestamp_ms=)``,
        # a mirror keeping its source's); None: the producer's clock when it is built.
        self.timestamp_ms: int | None = None

    @property
    def count(self) -> int:
        return len(self.values)

    def add(self, key: bytes | None, value: bytes, future: Any, seq: int) -> bool:
        """Append one record (``seq`` -1 unless the caller numbers records) when it fits:
        the batch is not full and, in explicit mode, ``seq`` follows the last id. False
        when it does not (the caller starts a new batch); an empty batch takes any record
        (the producer refuses records larger than a batch before they get here)."""
        values = self.values
        n = len(values)
        size = self.total() + len(value) + RECORD_OVERHEAD + (0 if key is None else len(key))
        if n and (
            n >= self.records_max
            or size > self.bytes_max
            or (seq >= 0 and seq != self.last_seq + 1)
        ):
            return False
        if not n:
            self.vlen = len(value)
        if key is not None:
            if self.keyed is None:
                self.keyed = {}
            self.keyed[n] = len(key)
            value = key + value
        if self.futures is None:
            place(future, self, n)
        else:
            self.futures.append(future)
        values.append(value)
        self.size = size
        self.counted = n + 1
        if seq >= 0:
            self.last_seq = seq
        return True

    def total(self) -> int:
        """Bytes of the batch this batch would make (the records appended by send itself
        included)."""
        return self.size + (len(self.values) - self.counted) * (self.vlen + RECORD_OVERHEAD)

    def full(self, smallest_record: int = RECORD_OVERHEAD) -> bool:
        """No further record can join (by count, or by bytes for the smallest record)."""
        return (
            len(self.values) >= self.records_max or self.total() + smallest_record > self.bytes_max
        )

    def body_parts(self) -> list[bytes]:
        """The records encoded as the batch format has them, as buffers to concatenate."""
        values = self.values
        keyed = self.keyed
        self.size = self.total()
        self.counted = len(values)
        if not keyed:
            n0 = len(values[0])
            if (
                self.size - BATCH_HEADER_SIZE == len(values) * (n0 + RECORD_OVERHEAD)
                and min(map(len, values)) == n0
            ):
                # Every value has the same length (the usual case): one record head,
                # repeated by the join itself.
                head = _head_no_key(n0)
                return [head, head.join(values)]
            return [
                b"".join(
                    itertools.chain.from_iterable(
                        zip(map(_head_no_key, map(len, values)), values, strict=True)
                    )
                )
            ]
        parts = []
        pack = _REC_HEAD.pack
        for i, v in enumerate(values):
            k = keyed.get(i)
            parts.append(pack(-1, len(v)) if k is None else pack(k, len(v) - k))
            parts.append(v)
        return parts

    def batch(self, *, pid: int, generation: int, base_sequence: int, timestamp_ms: int) -> bytes:
        """The batch of this batch, ready to send (``protocol.batch_from_records`` bytes)."""
        return protocol.batch_from_parts(
            self.body_parts(),
            len(self.values),
            pid=pid,
            generation=generation,
            base_sequence=base_sequence,
            timestamp_ms=timestamp_ms,
        )

    # -- the outcome of its records -------------------------------------------------------
    def resolve(self, ack: BatchAck, condition: threading.Condition | None) -> None:
        """The batch of this batch was acknowledged: record ``i`` gets ``ack.metadata(i)``.
        Linked futures (the blocking Producer's, sharing ``condition``) by one store on the
        batch; asyncio futures one by one."""
        if self.futures is None:
            assert condition is not None, "linked batches need the futures' Condition"
            resolve_outcome(condition, self, ack)
        else:
            for i, fut in enumerate(self.futures):
                settle(fut, ack.metadata(i))

    def fail(self, exc: BaseException, condition: threading.Condition | None) -> None:
        """Fail the records of this batch that are still open."""
        if self.futures is None:
            assert condition is not None, "linked batches need the futures' Condition"
            fail_outcome(condition, self, exc)
        else:
            for fut in self.futures:
                settle(fut, exc=exc)
