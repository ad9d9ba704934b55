"""``RecordRun``: records of one partition, admitted one after the other, already encoded,
that fit in one batch.

This is how a record travels from ``send`` to the wire without per-record work on the
producer's event loop: ``send`` encodes the record (``protocol.encode_record``) and appends
it to the partition's open run (a new run starts when the open one is full by
``batch_records_max`` / ``batch_bytes_max``, or, with explicit sequence ids, when the id
does not follow the previous one); the loop moves whole runs into the partition's sender,
which turns the head run into a batch with one join and one header. Like Kafka's
``RecordAccumulator``, the batch boundaries are decided when records are appended.

A run keeps only what a batch needs: the encoded records, their futures, the admission
time of its first record (linger and delivery timeout count from it) and, in explicit
mode, its first and last sequence ids.
"""

from __future__ import annotations

from typing import Any

from pidlease.protocol import BATCH_HEADER_SIZE


class RecordRun:
    __slots__ = ("bytes_max", "encoded", "first_ms", "first_seq", "futures", "last_seq",
                 "records_max", "size")

    def __init__(self, first_ms: float, first_seq: int, records_max: int, bytes_max: int) -> None:
        self.encoded: list[bytes] = []
        self.futures: list[Any] = []
        self.size = BATCH_HEADER_SIZE   # bytes of the batch this run would make
        self.first_ms = first_ms
        self.first_seq = first_seq      # -1: the producer numbers records itself
        self.last_seq = first_seq - 1
        self.records_max = records_max
        self.bytes_max = bytes_max

    @property
    def count(self) -> int:
        return len(self.futures)

    def add(self, encoded: bytes, future: Any, seq: int) -> bool:
        """Append one record (``seq`` -1 unless the caller numbers records) when it fits:
        the run is not full and, in explicit mode, ``seq`` follows the last id. False
        when it does not (the caller starts a new run); an empty run takes any record
        (the producer refuses records larger than a batch before they get here)."""
        futures = self.futures
        size = self.size + len(encoded)
        if futures and (len(futures) >= self.records_max or size > self.bytes_max
                        or (seq >= 0 and seq != self.last_seq + 1)):
            return False
        self.encoded.append(encoded)
        futures.append(future)
        self.size = size
        if seq >= 0:
            self.last_seq = seq
        return True

    def can_absorb(self, other: RecordRun) -> bool:
        """Whether ``other`` (the run after this one) fits in this run's batch."""
        return (len(self.futures) + len(other.futures) <= self.records_max
                and self.size + other.size - BATCH_HEADER_SIZE <= self.bytes_max
                and (other.first_seq < 0 or other.first_seq == self.last_seq + 1))

    def absorb(self, other: RecordRun) -> None:
        self.encoded += other.encoded
        self.futures += other.futures
        self.size += other.size - BATCH_HEADER_SIZE
        if other.first_seq >= 0:
            self.last_seq = other.last_seq

    def full(self, smallest_record: int) -> bool:
        """No further record can join (by count, or by bytes for the smallest record)."""
        return len(self.futures) >= self.records_max or self.size + smallest_record > self.bytes_max
