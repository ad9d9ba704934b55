"""The Kafka face of a partition: what the Kafka listener calls to produce a RecordBatch v2
and to fetch batches as Kafka consumers read them. Pure partition logic, no sockets; the
listener owns requests, connections, routing (NOT_LEADER_OR_FOLLOWER when this server does
not lead the partition) and the long poll of Fetch (``Partition.wait_for_data``).

A Kafka batch goes through the same produce path as ours (``produce.py``: route, check,
append at the routed epoch, bookkeeping; the rules tell the two apart by generation,
append_rules.py) and is stored as sent. What differs is the answer:
Kafka's error codes, and a DUPLICATE answered NO_ERROR with its original offsets once those
offsets are committed (Kafka's producers treat a retried batch's answer as the first one's,
so it must not come before the data is as safe as an ack says).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from partition_server.partition import Partition
from partition_server.produce import NotRouted, ProducePath
from partition_server.producer_state import Outcome
from pidlease.errors import (
    CorruptRecord,
    NotEnoughReplicas,
    NotLeader,
    OffsetOutOfRange,
    ServerUnavailable,
    TooManyPids,
)
from pidlease.wire import kafka_batch as K
from pidlease.wire.protocol import BatchHeader, iter_batches

__all__ = [
    "KafkaFetchResult",
    "KafkaProduceResult",
    "Unauthorized",
    "kafka_fetch",
    "kafka_produce",
]

# Kafka's code for each refusal the rules decide.
_REFUSALS = {
    Outcome.FENCED: K.INVALID_PRODUCER_EPOCH,
    Outcome.OUT_OF_ORDER: K.OUT_OF_ORDER_SEQUENCE_NUMBER,
    Outcome.UNKNOWN_PID: K.UNKNOWN_PRODUCER_ID,
    # Never decided for a Kafka batch (durability is by offset there); retriable if it were.
    Outcome.SEQUENCE_UNKNOWN: K.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
}
CLUSTER_AUTHORIZATION_FAILED = 31  # Kafka's code (the listener's others: kafka/codes.py)
# Fetches that find only our control batches (fence records, left out for Kafka
# consumers) read on past them, at most this many times, so a consumer is never handed an
# empty answer below the high watermark.
_CONTROL_SKIPS_MAX = 64


@dataclass(frozen=True, slots=True)
class KafkaProduceResult:
    error_code: int
    base_offset: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class KafkaFetchResult:
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: bytes


class Unauthorized(Exception):
    """The batch's PID belongs to another principal (SASL on)."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"producer id {pid} belongs to another principal")


def kafka_produce(
    path: ProducePath,
    topic: str,
    partition: int,
    records: bytes | memoryview,
    *,
    acks: int,
    batch_bytes_max: int,
    authorize: Callable[[BatchHeader], None] | None = None,
) -> KafkaProduceResult | asyncio.Future[KafkaProduceResult] | NotRouted:
    """Route, validate, authorize, decide and write one partition's batch of a Produce,
    through the one produce path (``produce.py``: no await between the route and the
    append; see the interface in docs/kafka.md). ``authorize`` raises ``Unauthorized``
    for a batch whose PID the principal may not use (decided before the call: the
    listener awaits the owner lookup first). NotRouted when this server does not lead the
    partition. The returned future (appends and duplicates) resolves by ``acks``: -1 once
    committed (the high watermark covers it, as our PRODUCE), 1 once fsynced here, 0 at
    once. It never raises."""
    data = memoryview(records)

    def check(part: Partition) -> BatchHeader:
        h = K.validate_kafka_batch(data, max_bytes=batch_bytes_max)
        if authorize is not None:
            authorize(h)
        return h

    route = path.route(topic, partition)
    if isinstance(route, NotRouted):
        return route
    part = route.part
    try:
        r = path.produce(topic, partition, data, check, lambda base, last: base)
    except K.KafkaBatchError as exc:
        return _refused(part, exc.kafka_code, exc.detail)
    except Unauthorized as exc:
        return _refused(part, CLUSTER_AUTHORIZATION_FAILED, str(exc))
    except TooManyPids as exc:
        # Our TOO_MANY_PIDS is retriable, nothing written; Kafka has no such code, and the
        # one every Kafka producer retries with the same sequence for "nothing written,
        # retry" is NOT_ENOUGH_REPLICAS (docs/kafka.md). The message says why.
        return _refused(part, K.NOT_ENOUGH_REPLICAS, f"TOO_MANY_PIDS: {exc.detail}")
    except NotEnoughReplicas as exc:
        return _refused(part, K.NOT_ENOUGH_REPLICAS, exc.detail)
    except NotLeader as exc:
        return _refused(part, K.NOT_LEADER_OR_FOLLOWER, exc.detail)
    except ServerUnavailable as exc:
        return _refused(part, K.KAFKA_STORAGE_ERROR, exc.detail)
    if isinstance(r, NotRouted):
        return r
    h, d, fut = r.header, r.decision, r.durable
    if fut is not None:
        # Written by this call: its base offset is the log's end before it.
        return _answer_when(part, fut, part.log.next_offset - h.count, h.count, acks)
    if d.outcome is Outcome.DUPLICATE and d.base_offset >= 0:
        return _answer_when(
            part, part.wait_durable(d.last_offset + 1), d.base_offset, h.count, acks
        )
    code = _REFUSALS.get(d.outcome, K.UNKNOWN_SERVER_ERROR)
    return _refused(part, code, d.detail)


def _refused(part: Partition, code: int, detail: str) -> KafkaProduceResult:
    return KafkaProduceResult(code, -1, part.log.log_start_offset, detail)


def _answer_when(
    part: Partition,
    committed: asyncio.Future[Any],
    base: int,
    count: int,
    acks: int,
) -> asyncio.Future[KafkaProduceResult]:
    """The answer of the batch at ``base`` in the log, whose commit ``committed`` resolves
    (or fails, when leadership goes or the in-sync set shrinks), given by ``acks``."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[KafkaProduceResult] = loop.create_future()
    if acks == -1:
        wait = committed
    else:
        # The commit future still runs (it fails when leadership goes); its outcome is
        # not this answer's, but it must be retrieved.
        committed.add_done_callback(_retrieve)
        if acks == 0:
            wait = loop.create_future()
            wait.set_result(None)
        else:
            wait = part.wait_flushed(base + count)

    def done(f: asyncio.Future[Any]) -> None:
        if out.done():
            return
        out.set_result(_result_of(f, part, base))

    wait.add_done_callback(done)
    return out


def _retrieve(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


def _result_of(f: asyncio.Future[Any], part: Partition, base: int) -> KafkaProduceResult:
    start = part.log.log_start_offset
    if f.cancelled():
        return KafkaProduceResult(K.NOT_LEADER_OR_FOLLOWER, -1, start, "cancelled")
    exc = f.exception()
    if exc is None:
        return KafkaProduceResult(K.NONE, base, start)
    code = _code_of_wait_failure(exc)
    return KafkaProduceResult(code, -1, start, str(exc))


def _code_of_wait_failure(exc: BaseException) -> int:
    if isinstance(exc, NotEnoughReplicas):
        return K.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    if isinstance(exc, (NotLeader, ServerUnavailable)):
        # Leadership lost or the server stopping: the client refreshes metadata and resends
        # to the new leader, whose rules answer the resend.
        return K.NOT_LEADER_OR_FOLLOWER
    return K.UNKNOWN_SERVER_ERROR


def kafka_fetch(part: Partition, offset: int, max_bytes: int) -> KafkaFetchResult:
    """Committed batches from the one holding ``offset`` as Kafka RecordBatch v2 bytes (at
    least one whole batch when there is one); OFFSET_OUT_OF_RANGE outside [log start, high
    watermark]; KAFKA_STORAGE_ERROR when a stored batch fails its checksum. Never raises."""
    start, hw = part.log.log_start_offset, part.high_watermark
    if offset < start or offset > hw:
        return KafkaFetchResult(K.OFFSET_OUT_OF_RANGE, hw, start, b"")
    records = b""
    at = offset
    for _ in range(_CONTROL_SKIPS_MAX):
        try:
            chunks = part.fetch(at, max_bytes)
        except OffsetOutOfRange:
            return KafkaFetchResult(K.OFFSET_OUT_OF_RANGE, hw, part.log.log_start_offset, b"")
        except CorruptRecord:
            # A stored batch fails its checksum (logged by the log): Kafka's answer for a
            # replica whose disk lost data; the client retries, another replica may lead.
            return KafkaFetchResult(K.KAFKA_STORAGE_ERROR, hw, part.log.log_start_offset, b"")
        if not chunks:
            break
        records = K.native_to_kafka(chunks)
        if records:
            break
        at = _end_of(chunks)  # only fence records: read on past them
    return KafkaFetchResult(K.NONE, part.high_watermark, part.log.log_start_offset, records)


def _end_of(chunks: list[bytes]) -> int:
    end = -1
    for c in chunks:
        for h, _ in iter_batches(c, check_crc=False):
            end = h.base_offset + h.count
    return end
