"""How a Spark row becomes a pidlease record: its producer, its topic partition and its
sequence id, and whether an earlier attempt already wrote it.

Everything here is pure, so retries can be reasoned about (and tested) without Spark:

- **producer**: Spark partition ``k`` of job ``J`` publishes as the named producer
  ``J:k``. A retry or a speculative copy of the task uses the same name, so leasing it is
  a takeover: the coordinator raises the generation and fences the older attempt.
- **topic partition** (``route``): by default (``auto``) a row with a key goes where the
  SDK's own key hash sends it (crc32 mod N, so a key's records share a partition, as in
  Kafka) and a row without a key goes to ``k mod N``; ``spark`` sends every row of Spark
  partition ``k`` to ``k mod N``; ``key`` requires a key on every row.
- **sequence id**: sequences are per (PID, topic partition). Batch writes
  (``BatchSequencer``) number the rows of one Spark partition that go to one topic
  partition 0, 1, 2, ... in row order, which a strict topic requires (no holes).
  Streaming writes (``StreamSequencer``) use ``batch_id * 2**32 + position`` on a
  ``monotonic`` topic, where ``position`` counts the rows of the Spark partition that go
  to that topic partition in this micro-batch (0, 1, 2, ...): later micro-batches get
  larger ids, a replayed micro-batch produces the same ids (which the partition answers
  as duplicates), and the ids of one micro-batch in one topic partition are consecutive,
  so the SDK packs them into whole batches (it starts a new batch at every id that does
  not follow the previous one).
- **resume** (``Resume``): a takeover tells the new attempt the durable highwater of its
  PID in every topic partition; a row whose sequence is at or below it was written by an
  earlier attempt and is skipped.

All of this assumes what Pulsar's effectively-once publishing assumes of a replayable
source: a re-run of a task sees the same rows in the same order.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from pidlease.client.partitioner import partition_for_key
from pidlease.wire.protocol import MAX_SEQUENCE

STREAM_POSITION_BITS = 32
STREAM_POSITIONS_MAX = 1 << STREAM_POSITION_BITS
STREAM_BATCH_ID_MAX = MAX_SEQUENCE >> STREAM_POSITION_BITS


class Routing(enum.Enum):
    AUTO = "auto"
    SPARK = "spark"
    KEY = "key"


def producer_name(job_name: str, spark_partition: int) -> str:
    return f"{job_name}:{spark_partition}"


def route(routing: Routing, spark_partition: int, key: bytes | None, partitions: int) -> int:
    """The topic partition of one row."""
    if routing is Routing.SPARK or (routing is Routing.AUTO and key is None):
        return spark_partition % partitions
    if key is None:
        raise ValueError("partitioning 'key' needs a key on every row; this row has none")
    return partition_for_key(key, partitions)


class BatchSequencer:
    """Contiguous sequences per topic partition, from 0, in row order (strict topics)."""

    def __init__(self, partitions: int) -> None:
        self._next = [0] * partitions

    def assign(self, topic_partition: int) -> int:
        seq = self._next[topic_partition]
        self._next[topic_partition] = seq + 1
        return seq


def stream_sequence(batch_id: int, position: int) -> int:
    """The sequence id of the row at ``position`` of a Spark partition in micro-batch
    ``batch_id``."""
    if not 0 <= position < STREAM_POSITIONS_MAX:
        raise ValueError(
            f"a micro-batch partition holds at most 2**32 rows; row {position} is beyond"
        )
    if not 0 <= batch_id <= STREAM_BATCH_ID_MAX:
        raise ValueError(f"batch id {batch_id} is outside 0..{STREAM_BATCH_ID_MAX}")
    return (batch_id << STREAM_POSITION_BITS) | position


class StreamSequencer:
    """``batch_id * 2**32 + position``, ``position`` counted per topic partition: within
    a micro-batch each topic partition sees consecutive ids from ``batch_id * 2**32``, and
    between micro-batches the ids jump (holes, which a monotonic topic accepts).

    Numbering per topic partition rather than across the whole Spark partition keeps the
    ids of one topic partition consecutive when keyed rows spread over all partitions;
    ids counted across the Spark partition made every id of a topic partition a new SDK
    batch (one request per record). It is as deterministic: a replay of the micro-batch
    sees the same rows in the same order, so each row gets the same id again."""

    def __init__(self, batch_id: int) -> None:
        self.batch_id = batch_id
        self._next: dict[int, int] = {}
        stream_sequence(batch_id, 0)  # reject a bad batch id before any row

    def assign(self, topic_partition: int) -> int:
        position = self._next.get(topic_partition, 0)
        seq = stream_sequence(self.batch_id, position)
        self._next[topic_partition] = position + 1
        return seq


class Resume:
    """The durable highwater per topic partition that a (takeover) lease reported."""

    def __init__(self, last_sequence: Mapping[int, int]) -> None:
        self.last_sequence = dict(last_sequence)

    def written(self, topic_partition: int, sequence: int) -> bool:
        return sequence <= self.last_sequence.get(topic_partition, -1)


class PlannedRecord(NamedTuple):  # a tuple: one is made per row, so it must be cheap
    position: int  # the row's position in its Spark partition
    topic_partition: int
    sequence: int
    key: bytes | None
    value: bytes
    written: bool  # an earlier attempt already wrote it: skip


def plan(
    rows: Iterable[tuple[bytes | None, bytes]],
    *,
    routing: Routing,
    spark_partition: int,
    partitions: int,
    sequencer: BatchSequencer | StreamSequencer,
    resume: Resume,
) -> Iterator[PlannedRecord]:
    """Every row of a Spark partition, in order, with its destination and sequence."""
    for position, (key, value) in enumerate(rows):
        tp = route(routing, spark_partition, key, partitions)
        seq = sequencer.assign(tp)
        yield PlannedRecord(position, tp, seq, key, value, resume.written(tp, seq))
