"""The SDK's small value types: what a sent record's future resolves to, and what the
server answered for a batch (from which each record's metadata is derived).

Plain data with no behaviour beyond deriving one value from another, so every other
module of the engine can import them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchAck", "RecordMetadata"]


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


class BatchAck:
    """What the server answered for one batch; record ``i`` of the batch is at
    ``base_offset + i`` with sequence ``base_sequence + i`` (``metadata(i)``)."""

    __slots__ = ("base_offset", "base_sequence", "duplicate", "partition", "topic")

    def __init__(
        self, topic: str, partition: int, base_offset: int, base_sequence: int, duplicate: bool
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = base_offset  # -1: a duplicate whose offsets are forgotten
        self.base_sequence = base_sequence
        self.duplicate = duplicate

    def metadata(self, i: int) -> RecordMetadata:
        off = self.base_offset + i if self.base_offset >= 0 else -1
        return RecordMetadata(
            self.topic, self.partition, off, self.base_sequence + i, self.duplicate
        )
