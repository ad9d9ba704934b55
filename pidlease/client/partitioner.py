"""Which partition a record goes to when the caller does not say.

A key picks ``crc32(key) mod partitions`` (``zlib.crc32``, unsigned): stable across
processes, machines and Python versions, unlike ``hash()``, so every producer of the
same key lands on the same partition and keeps that key's records in order. Records
without a key go round robin, one partition after the other.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable

__all__ = ["Partitioner", "partition_for_key"]


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (the documented, stable hash)."""
    return zlib.crc32(key) % partitions


class Partitioner:
    """Key hash for keyed records, round robin for the rest. Not thread-safe: the
    producer calls it under its own lock."""

    def __init__(self, partitions: int, *, start: int = 0) -> None:
        if partitions < 1:
            raise ValueError("a topic has at least one partition")
        self.partitions = partitions
        first = start % partitions
        order = [*range(first, partitions), *range(first)]
        # The next partition of the round robin, as a callable: the iterator's own
        # ``__next__``, so the producer's send path takes a partition with one C call.
        self.next_round_robin: Callable[[], int] = itertools.cycle(order).__next__

    def partition(self, key: bytes | None) -> int:
        if key is not None:
            return partition_for_key(key, self.partitions)
        return self.next_round_robin()
