"""The binary wire protocol between producers, readers, coordinators and partition servers.

Shared by the SDK and the servers (the server imports it from here, as Kafka's broker
imports ``clients``). ``docs/protocol.md`` is the prose version of this module.

Framing: every message is ``u32 length`` followed by ``length`` bytes, big-endian.

    request  = u8 api_key, u32 correlation_id, payload
    response = u32 correlation_id, u16 error_code, str detail, payload

``str`` is ``u16 length`` + UTF-8 bytes. A response payload is always present and has
the same shape whatever the error code, so a reader never branches on the error to parse.

The unit of data is a *batch*, stored on disk exactly as it travels (the server only
fills in ``base_offset``, which the checksum does not cover, so it never recomputes it):

    off  size  field
    0    8     base_offset   i64   set by the server; a producer sends 0
    8    4     batch_len     u32   bytes after this field
    12   4     crc           u32   CRC-32 of every byte from offset 16 to the end
    16   1     flags         u8    bit 0: control batch (a fence record)
    17   8     pid           u64   0 = not idempotent
    25   4     generation    u32   < 2**31
    29   8     base_sequence i64   sequence of the first record; -1 on control batches
    37   4     count         u32   records in the batch, >= 1
    41   8     timestamp_ms  i64   producer's clock when the batch was closed
    49   ...   records: i32 key_len (-1 = no key), u32 value_len, key, value

Record ``i`` of a batch has offset ``base_offset + i`` and sequence ``base_sequence + i``.
A control batch holds one record (key ``b"fence"``), takes one offset, has no sequence,
and readers skip it unless asked for control records.

A log also holds Kafka RecordBatch v2 batches, stored as a Kafka producer sent them
(docs/kafka.md, "On-disk format"). Their lead (``baseOffset i64, batchLength i32``) has our
shape, and byte 16 tells the two apart: our ``flags`` is only ever 0 or 1 (``validate_batch``
refuses any other value), Kafka's ``magic`` is 2. ``decode_batch_header`` reads either into
one ``BatchHeader`` (flag ``FLAG_KAFKA`` set, the epoch mapped onto a generation from
``KAFKA_GENERATION_BASE``), so the log, recovery, replication and the readers see one
kind of header; ``batch_crc_ok`` checks CRC-32C over a Kafka batch, and ``iter_records``
reads its varint records. Validation with Kafka's error codes is ``kafka_batch.py``.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c

from pidlease.errors import CorruptRecord, InvalidRequest
from pidlease.wire import kafka_codecs
from pidlease.wire.framing import encode_frame, pack_header

# --- API keys -----------------------------------------------------------------------------
PRODUCE = 1
FETCH = 2
FENCE = 3
PRODUCER_STATE = 4
METADATA = 5
REPLICA_FETCH = 6
EPOCH_END = 7
LIST_OFFSETS = 8
# PRODUCER_STATE and FENCE for one PID on many partitions in one request (issue 24): what a
# lease needs from one leader server, one round trip whatever the partition count.
PRODUCER_STATES = 9
FENCES = 10
API_NAMES = {
    PRODUCE: "produce",
    FETCH: "fetch",
    FENCE: "fence",
    PRODUCER_STATE: "producer_state",
    METADATA: "metadata",
    REPLICA_FETCH: "replica_fetch",
    EPOCH_END: "epoch_end",
    LIST_OFFSETS: "list_offsets",
    PRODUCER_STATES: "producer_states",
    FENCES: "fences",
}
MANY_APIS = (PRODUCER_STATES, FENCES)
# Partitions one PRODUCER_STATES / FENCES request may name (a coordinator splits more).
PARTITIONS_PER_REQUEST_MAX = 10_000
# LIST_OFFSETS asks for an offset by time; these two negative "times" ask for the ends of
# the log instead (the values Kafka's ListOffsets uses, so they read the same to its users).
LATEST_TIMESTAMP = -1  # the high watermark: the next record to be committed
EARLIEST_TIMESTAMP = -2  # the log start: the oldest record still held

FLAG_CONTROL = 0x01
# Never written by us: set in a decoded header when the batch is a Kafka RecordBatch v2
# (byte 16 is Kafka's ``magic``, 2, where ours holds ``flags``, 0 or 1).
FLAG_KAFKA = 0x02
NATIVE_FLAGS = FLAG_CONTROL  # every flag bit a batch of ours may carry on the wire
KAFKA_MAGIC = 2
# A Kafka producer's int16 epoch ``e`` is generation ``KAFKA_GENERATION_BASE + e`` in the
# producer state: above every generation our leases give (< 2**31), so a native batch with
# a PID Kafka clients use is always from an older generation (FENCED), and the rules can
# tell a Kafka PID's state from ours by its generation alone (append_rules.py).
KAFKA_GENERATION_BASE = 2**31
KAFKA_EPOCH_MAX = 2**15 - 1
FENCE_CREATE_IF_ABSENT = 0x01

MAX_GENERATION = 2**31 - 1
MAX_SEQUENCE = 2**63 - 1
MAX_PID = 2**63 - 1  # PIDs are positive 64-bit integers; kept signed-safe for JSON users
FRAME_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
_LITTLE = sys.byteorder == "little"  # the wire is big-endian

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_REQ_HEAD = struct.Struct(">BI")
_RESP_HEAD = struct.Struct(">IH")
BATCH_HEADER = struct.Struct(">qIIBQIqIq")
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 49
_REC_HEAD = struct.Struct(">iI")
REC_HEAD = _REC_HEAD  # key_len (-1: no key), value_len
_BATCH_LEAD = struct.Struct(">qII")  # base_offset, batch_len, crc
_BATCH_TAIL = struct.Struct(">BQIqIq")  # flags .. timestamp_ms (the CRC covers these)
_CRC_START = 16
# Kafka RecordBatch v2 header: baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordCount; CRC-32C covers every byte from attributes to the end.
KAFKA_HEADER = struct.Struct(">qiibIhiqqqhii")
KAFKA_HEADER_SIZE = KAFKA_HEADER.size  # 61
KAFKA_CRC_START = 21
# Bytes enough to decode the header of a batch of either format (a caller reading headers
# from a file reads this much, or what is left of the file).
HEADER_BYTES_MAX = KAFKA_HEADER_SIZE
_MAGIC_AT = 16
# Fixed-size parts of responses.
_PRODUCE_RESP = struct.Struct(">qqq")  # base_offset, last_offset, expected_sequence
_FETCH_REQ = struct.Struct(">qI")  # offset, max_bytes
_FETCH_RESP = struct.Struct(">qq")  # high_watermark, log_start_offset (then bytes)
_FENCE_REQ = struct.Struct(">QIB")  # pid, generation, flags
_FENCE_RESP = struct.Struct(">Bqq")  # existed, durable_highwater, fence_offset
# Optional trailing i64s (docs/reliability.md, finding 6): a FENCE request's leased_since_ms,
# and the dropped_last_use_max_ms of FENCE and PRODUCER_STATE answers. Absent reads as 0: unknown.
_I64 = struct.Struct(">q")
_STATE_REQ = struct.Struct(">Q")  # pid
_FENCE_ENTRY = struct.Struct(">Bq")  # flags, leased_since_ms (a FENCES request's partition)
_U8 = struct.Struct(">B")
_STATE_RESP = struct.Struct(">BIqq")  # found, generation, durable_highwater, last_use_ms
_PARTITION = struct.Struct(">I")
_REPLICA_FETCH_REQ = struct.Struct(
    ">Iiq2I"
)  # replica_id, leader_epoch, offset, max_bytes, max_wait_ms
_REPLICA_FETCH_RESP = struct.Struct(">qiH")  # high_watermark, leader_epoch, epoch entries
_EPOCH_ENTRY = struct.Struct(">iq")  # epoch, start_offset
_EPOCH_END_REQ = struct.Struct(">Iii")  # replica_id, leader_epoch, epoch asked about
_EPOCH_END_RESP = struct.Struct(">iq")  # epoch, end_offset
_LIST_OFFSETS_REQ = struct.Struct(">q")  # timestamp_ms (or LATEST/EARLIEST_TIMESTAMP)
_LIST_OFFSETS_RESP = struct.Struct(">qqq")  # offset, log_start_offset, high_watermark
EPOCH_ENTRIES_MAX = 0xFFFF


# --- batches ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_len: int
    crc: int
    flags: int
    pid: int
    generation: int
    base_sequence: int
    count: int
    timestamp_ms: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes, header included."""
        return self.batch_len + 12

    @property
    def is_control(self) -> bool:
        return bool(self.flags & FLAG_CONTROL)

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + self.count - 1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1


@dataclass(frozen=True, slots=True)
class Record:
    """One record as a reader sees it."""

    topic: str
    partition: int
    offset: int
    pid: int
    generation: int
    sequence_id: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    is_control: bool = False


def encode_record(key: bytes | None, value: bytes) -> bytes:
    """One record as it sits in a batch (``i32 key_len``, ``u32 value_len``, key, value)."""
    if key is None:
        return _REC_HEAD.pack(-1, len(value)) + value
    return _REC_HEAD.pack(len(key), len(value)) + key + value


def batch_from_records(
    body: bytes,
    count: int,
    *,
    pid: int,
    generation: int,
    base_sequence: int,
    timestamp_ms: int,
    flags: int = 0,
) -> bytes:
    """A batch ready to send around ``body``, ``count`` records already encoded
    (``encode_record``) and concatenated. The producer encodes each record when it is
    sent and only this header when the batch closes."""
    tail = _BATCH_TAIL.pack(flags, pid, generation, base_sequence, count, timestamp_ms) + body
    return _BATCH_LEAD.pack(0, len(tail) + 4, zlib.crc32(tail)) + tail


def batch_from_parts(
    parts: Sequence[bytes],
    count: int,
    *,
    pid: int,
    generation: int,
    base_sequence: int,
    timestamp_ms: int,
    flags: int = 0,
) -> bytes:
    """``batch_from_records(b"".join(parts), ...)``, the same bytes, without building the
    body on its own first: the CRC runs over the parts in turn and the batch is one join."""
    tail_head = _BATCH_TAIL.pack(flags, pid, generation, base_sequence, count, timestamp_ms)
    crc = zlib.crc32(tail_head)
    size = len(tail_head) + 4
    for part in parts:
        crc = zlib.crc32(part, crc)
        size += len(part)
    return b"".join([_BATCH_LEAD.pack(0, size, crc), tail_head, *parts])


def encode_batch(
    records: Sequence[tuple[bytes | None, bytes]],
    *,
    pid: int,
    generation: int,
    base_sequence: int,
    timestamp_ms: int,
    flags: int = 0,
) -> bytes:
    """A batch ready to send (``base_offset`` 0). ``records`` are (key, value) pairs."""
    body = b"".join([encode_record(key, value) for key, value in records])
    return batch_from_records(
        body,
        len(records),
        pid=pid,
        generation=generation,
        base_sequence=base_sequence,
        timestamp_ms=timestamp_ms,
        flags=flags,
    )


def encode_control_batch(*, pid: int, generation: int, timestamp_ms: int) -> bytes:
    return encode_batch(
        [(b"fence", b"")],
        pid=pid,
        generation=generation,
        base_sequence=-1,
        timestamp_ms=timestamp_ms,
        flags=FLAG_CONTROL,
    )


def decode_batch_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Parse a header of either format without checking the checksum. Raises
    CorruptRecord when short."""
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise CorruptRecord(f"batch header needs {BATCH_HEADER_SIZE} bytes, got {len(buf) - pos}")
    if buf[pos + _MAGIC_AT] == KAFKA_MAGIC:
        return decode_kafka_header(buf, pos)
    return BatchHeader(*BATCH_HEADER.unpack_from(buf, pos))


def decode_kafka_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """A Kafka RecordBatch v2 header in our shape: ``count`` is the offsets it takes
    (lastOffsetDelta + 1), ``timestamp_ms`` its maxTimestamp, a producerId of -1 (not
    idempotent) is PID 0 with sequence 0, an epoch ``e`` is generation
    ``KAFKA_GENERATION_BASE + e``."""
    if len(buf) - pos < KAFKA_HEADER_SIZE:
        raise CorruptRecord(
            f"Kafka batch header needs {KAFKA_HEADER_SIZE} bytes, got {len(buf) - pos}"
        )
    (base, length, _, _, crc, _, delta, _, max_ts, pid, epoch, seq, _) = KAFKA_HEADER.unpack_from(
        buf, pos
    )
    if pid < 0:
        pid, generation, seq = 0, 0, 0
    else:
        generation = KAFKA_GENERATION_BASE + (epoch & 0xFFFF)
    return BatchHeader(
        base, length & 0xFFFF_FFFF, crc, FLAG_KAFKA, pid, generation, seq, delta + 1, max_ts
    )


def is_kafka(h: BatchHeader) -> bool:
    return bool(h.flags & FLAG_KAFKA)


def kafka_epoch(h: BatchHeader) -> int:
    """The Kafka producer epoch of a Kafka batch's header (-1 when it has no PID)."""
    return h.generation - KAFKA_GENERATION_BASE if h.pid else -1


def set_base_offset(batch: bytearray, base_offset: int, pos: int = 0) -> None:
    struct.pack_into(">q", batch, pos, base_offset)


def batch_crc_ok(buf: bytes | memoryview, header: BatchHeader, pos: int = 0) -> bool:
    end = pos + header.size
    if end > len(buf):
        return False
    if header.flags & FLAG_KAFKA:
        return kafka_crc(buf, pos + KAFKA_CRC_START, end) == header.crc
    return zlib.crc32(memoryview(buf)[pos + _CRC_START : end]) == header.crc


def kafka_crc(buf: bytes | memoryview, start: int, end: int) -> int:
    """CRC-32C of ``buf[start:end]`` (google_crc32c's C code; it takes only bytes)."""
    if type(buf) is bytes:
        return int(google_crc32c.value(buf[start:end]))
    return int(google_crc32c.value(bytes(memoryview(buf)[start:end])))


def validate_batch(
    buf: bytes | memoryview, pos: int = 0, *, max_bytes: int | None = None
) -> BatchHeader:
    """Check one complete batch at ``pos``: lengths, checksum, field ranges and that its
    records parse to exactly ``count`` records filling the batch. Raises CorruptRecord."""
    h = decode_batch_header(buf, pos)
    if h.flags & ~NATIVE_FLAGS:
        # Kafka batches (magic 2 at this byte) come only through the Kafka listener.
        raise CorruptRecord(f"unknown batch flags {h.flags:#x}")
    if h.batch_len < BATCH_HEADER_SIZE - 12:
        raise CorruptRecord(f"batch_len {h.batch_len} is shorter than a header")
    if max_bytes is not None and h.size > max_bytes:
        raise CorruptRecord(f"batch of {h.size} bytes is over the limit of {max_bytes}")
    if pos + h.size > len(buf):
        raise CorruptRecord(f"batch says {h.size} bytes but only {len(buf) - pos} arrived")
    if not batch_crc_ok(buf, h, pos):
        raise CorruptRecord("batch checksum mismatch")
    if h.count < 1:
        raise CorruptRecord(f"batch record count must be >= 1, got {h.count}")
    if h.generation > MAX_GENERATION:
        raise CorruptRecord(f"generation {h.generation} is over 2**31-1")
    if h.pid > MAX_PID:
        raise CorruptRecord(f"pid {h.pid} is over 2**63-1")
    if h.is_control:
        if h.count != 1 or h.base_sequence != -1:
            raise CorruptRecord("a control batch holds one record and no sequence")
    elif h.base_sequence < 0 or h.base_sequence + h.count - 1 > MAX_SEQUENCE:
        raise CorruptRecord(f"base_sequence {h.base_sequence} out of range")
    end = pos + h.size
    p = pos + BATCH_HEADER_SIZE
    # Producers mostly send records of one shape, so try the vectorised check first. It
    # only ever says "these records are certainly well formed"; anything else (including
    # a buffer it cannot reason about) goes through the record walk below, which is the
    # sole judge of what is corrupt and so also picks the error message.
    if _uniform_records_ok(buf, p, end, h.count):
        return h
    unpack_from = _REC_HEAD.unpack_from  # local: this loop runs once per record
    for _ in range(h.count):
        if p + 8 > end:
            raise CorruptRecord("record header runs past the batch")
        klen, vlen = unpack_from(buf, p)
        # a conditional, not max(): no builtin call per record
        p += 8 + (klen if klen > 0 else 0) + vlen  # noqa: FURB136
        if klen < -1 or p > end:
            raise CorruptRecord("record runs past the batch")
    if p != end:
        raise CorruptRecord(f"{end - p} bytes after the last record of the batch")
    return h


def _uniform_records_ok(buf: bytes | memoryview, p: int, end: int, count: int) -> bool:
    """True only if ``buf[p:end]`` is exactly ``count`` records that all carry the same
    8-byte record header as the first one (same key and value length, key_len >= -1).

    Such a body is exactly what the record walk in ``validate_batch`` accepts for that
    shape: record ``i`` starts at ``p + i*stride``, its header fits (stride >= 8), and the
    walk ends on ``end``. So True never accepts a body the walk would reject; False means
    "not proven", never "corrupt". The check is eight strided slices (byte ``j`` of every
    record header), each compared in C against that byte repeated ``count`` times, instead
    of ``count`` trips through the Python loop."""
    body_len = end - p
    # A negative position makes unpack_from and slicing wrap round the buffer's end in
    # ways that need not agree with each other, so only plain positions are vectorised.
    if p < 0 or body_len < 8:
        return False
    mv = memoryview(buf)
    # Slicing and lengths below count bytes; a buffer of wider items (or several
    # dimensions) would make them count something else, so leave it to the walk.
    if mv.itemsize != 1 or mv.ndim != 1:
        return False
    head = mv[p : p + 8].tobytes()
    klen, vlen = _REC_HEAD.unpack(head)
    if klen < -1:
        return False
    stride = 8 + max(klen, 0) + vlen
    if stride * count != body_len:
        return False
    if count == 1:
        return True  # the single header is the one just read
    # bytes/bytearray strided slices are a tight C copy; a memoryview slice is a view
    # (no copy of the body) whose comparison with bytes is element-wise in C.
    src = buf if type(buf) in (bytes, bytearray) else mv
    for j in range(8):  # noqa: SIM110 - a plain loop: no generator on the fast path
        # j < 8 <= stride, so the slice holds exactly ``count`` bytes: offset j of
        # each record header and nothing from the records' keys or values.
        if src[p + j : end : stride] != head[j : j + 1] * count:
            return False
    return True


def iter_batches(
    buf: bytes | memoryview, *, check_crc: bool = True
) -> Iterator[tuple[BatchHeader, int]]:
    """Yield (header, position) for each complete batch in ``buf``; raises CorruptRecord on
    a bad checksum, stops quietly at a trailing partial batch (a fetch may cut one)."""
    pos = 0
    n = len(buf)
    while n - pos >= BATCH_HEADER_SIZE:
        if buf[pos + _MAGIC_AT] == KAFKA_MAGIC and n - pos < KAFKA_HEADER_SIZE:
            return  # a Kafka batch's longer header, cut
        h = decode_batch_header(buf, pos)
        if pos + h.size > n:
            return
        if check_crc and not batch_crc_ok(buf, h, pos):
            raise CorruptRecord(f"checksum mismatch in batch at offset {h.base_offset}")
        yield h, pos
        pos += h.size


def iter_records(
    buf: bytes | memoryview, h: BatchHeader, pos: int, topic: str = "", partition: int = 0
) -> Iterator[Record]:
    """The records of the batch at ``pos`` (either format)."""
    if h.flags & FLAG_KAFKA:
        yield from _iter_kafka_records(buf, h, pos, topic, partition)
        return
    p = pos + BATCH_HEADER_SIZE
    mv = memoryview(buf)
    for i in range(h.count):
        klen, vlen = _REC_HEAD.unpack_from(buf, p)
        p += 8
        key = None
        if klen >= 0:
            key = bytes(mv[p : p + klen])
            p += klen
        value = bytes(mv[p : p + vlen])
        p += vlen
        seq = -1 if h.is_control else h.base_sequence + i
        yield Record(
            topic,
            partition,
            h.base_offset + i,
            h.pid,
            h.generation,
            seq,
            key,
            value,
            h.timestamp_ms,
            h.is_control,
        )


def _iter_kafka_records(
    buf: bytes | memoryview, h: BatchHeader, pos: int, topic: str, partition: int
) -> Iterator[Record]:
    """Records of a stored Kafka batch, compressed or not (``kafka_codecs``: the one
    decode, the Produce check's). Headers are parsed and dropped; a Record has no place
    for them."""
    end = pos + h.size
    (_, _, _, _, _, attributes, _, base_ts, _, _, _, _, n) = KAFKA_HEADER.unpack_from(buf, pos)
    p = pos + KAFKA_HEADER_SIZE
    if attributes & 0x07:
        try:
            buf = kafka_codecs.decompress(attributes & 0x07, memoryview(buf)[p:end])
        except kafka_codecs.CodecError as exc:
            raise CorruptRecord(f"Kafka batch at offset {h.base_offset}: {exc}") from None
        p, end = 0, len(buf)
    mv = memoryview(buf)
    # Offsets by position, not by each record's offsetDelta: validation walked only the
    # records' lengths, and position is what the log assigned (count = n offsets).
    for i in range(n):
        length, p = read_varint(buf, p)
        rec_end = p + length
        if length < 0 or rec_end > end:
            raise CorruptRecord(f"Kafka record runs past its batch at offset {h.base_offset}")
        p += 1  # attributes: unused by Kafka so far
        ts_delta, p = read_varint(buf, p)
        _, p = read_varint(buf, p)  # offsetDelta
        klen, p = read_varint(buf, p)
        key = None
        if klen >= 0:
            key = bytes(mv[p : p + klen])
            p += klen
        vlen, p = read_varint(buf, p)
        value = b"" if vlen < 0 else bytes(mv[p : p + vlen])
        p += max(vlen, 0)
        nheaders, p = read_varint(buf, p)
        for _ in range(nheaders):
            hk, p = read_varint(buf, p)
            p += max(hk, 0)
            hv, p = read_varint(buf, p)
            p += max(hv, 0)
        if p != rec_end:
            raise CorruptRecord(f"Kafka record of batch at offset {h.base_offset} is malformed")
        yield Record(
            topic,
            partition,
            h.base_offset + i,
            h.pid,
            h.generation,
            (h.base_sequence + i) % 2**31 if h.pid else -1,
            key,
            value,
            base_ts + ts_delta,
        )


def read_varint(buf: bytes | memoryview, p: int) -> tuple[int, int]:
    """A zig-zag varint (Kafka's signed varint/varlong) at ``p``: (value, next position).
    CorruptRecord when it runs off the buffer or past 10 bytes."""
    shift = 0
    raw = 0
    n = len(buf)
    while True:
        if p >= n or shift > 63:
            raise CorruptRecord("malformed varint in a Kafka record")
        b = buf[p]
        p += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), p
        shift += 7


# --- primitive encoders -------------------------------------------------------------------
def pack_str(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _U16.pack(len(b)) + b


class Cursor:
    """Reads fields off a payload; any overrun raises CorruptRecord (a malformed frame)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, st: struct.Struct) -> tuple[Any, ...]:
        if self.pos + st.size > len(self.buf):
            raise CorruptRecord("frame ends in the middle of a field")
        v = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def str(self) -> str:
        (n,) = self.take(_U16)
        if self.pos + n > len(self.buf):
            raise CorruptRecord("frame ends in the middle of a string")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecord("string field is not UTF-8") from exc

    def rest(self) -> memoryview:
        mv = memoryview(self.buf)[self.pos :]
        self.pos = len(self.buf)
        return mv


frame = encode_frame  # the name this module's callers know


# --- requests -----------------------------------------------------------------------------
def request(api_key: int, correlation_id: int, payload: bytes) -> bytes:
    return frame(_REQ_HEAD.pack(api_key, correlation_id) + payload)


def produce_request(
    correlation_id: int, topic: str, partition: int, token: str, batch: bytes
) -> bytes:
    head = (
        _REQ_HEAD.pack(PRODUCE, correlation_id)
        + pack_str(topic)
        + _PARTITION.pack(partition)
        + pack_str(token)
    )
    return pack_header(len(head) + len(batch)) + head + batch


def fetch_request(
    correlation_id: int, topic: str, partition: int, offset: int, max_bytes: int
) -> bytes:
    return request(
        FETCH,
        correlation_id,
        pack_str(topic) + _PARTITION.pack(partition) + _FETCH_REQ.pack(offset, max_bytes),
    )


def fence_request(
    correlation_id: int,
    topic: str,
    partition: int,
    pid: int,
    generation: int,
    token: str,
    *,
    create_if_absent: bool,
    leased_since_ms: int = 0,
) -> bytes:
    """``leased_since_ms``: no earlier than when the partition joined the PID's lease (by
    the server's clock); the server creates a fresh entry only if it dropped no PID used
    since. 0 = unknown (then the field is left out, as older coordinators send it)."""
    flags = FENCE_CREATE_IF_ABSENT if create_if_absent else 0
    return request(
        FENCE,
        correlation_id,
        pack_str(topic)
        + _PARTITION.pack(partition)
        + _FENCE_REQ.pack(pid, generation, flags)
        + pack_str(token)
        + _optional_i64(leased_since_ms),
    )


def producer_state_request(correlation_id: int, topic: str, partition: int, pid: int) -> bytes:
    return request(
        PRODUCER_STATE,
        correlation_id,
        pack_str(topic) + _PARTITION.pack(partition) + _STATE_REQ.pack(pid),
    )


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    """One partition of a PRODUCER_STATES / FENCES request (``flags`` and
    ``leased_since_ms``: FENCE's, per partition; 0 in PRODUCER_STATES)."""

    topic: str
    partition: int
    flags: int = 0
    leased_since_ms: int = 0


def _entries_count(n: int) -> bytes:
    if not 1 <= n <= PARTITIONS_PER_REQUEST_MAX:
        raise ValueError(f"1..{PARTITIONS_PER_REQUEST_MAX} partitions per request, not {n}")
    return _U32.pack(n)


def producer_states_request(
    correlation_id: int, pid: int, partitions: Sequence[tuple[str, int]]
) -> bytes:
    """PRODUCER_STATE of ``pid`` on each of ``partitions`` (topic, partition): ``u64 pid,
    u32 count``, then per partition ``str topic, u32 partition``. The answer holds one
    entry per partition, in this order."""
    return request(
        PRODUCER_STATES,
        correlation_id,
        _STATE_REQ.pack(pid)
        + _entries_count(len(partitions))
        + b"".join(pack_str(t) + _PARTITION.pack(p) for t, p in partitions),
    )


def fences_request(
    correlation_id: int,
    pid: int,
    generation: int,
    token: str,
    entries: Sequence[PartitionEntry],
) -> bytes:
    """FENCE of ``pid`` at ``generation`` on each entry's partition: ``u64 pid, u32
    generation, str token, u32 count``, then per partition ``str topic, u32 partition, u8
    flags, i64 leased_since_ms`` (each as in FENCE). One entry per partition in the answer,
    in this order, each sent once its own fence is durable: the answer waits for all."""
    return request(
        FENCES,
        correlation_id,
        _STATE_REQ.pack(pid)
        + _U32.pack(generation)
        + pack_str(token)
        + _entries_count(len(entries))
        + b"".join(
            pack_str(e.topic)
            + _PARTITION.pack(e.partition)
            + _U8.pack(e.flags)
            + _I64.pack(e.leased_since_ms)
            for e in entries
        ),
    )


def metadata_request(correlation_id: int) -> bytes:
    return request(METADATA, correlation_id, b"")


def replica_fetch_request(
    correlation_id: int,
    topic: str,
    partition: int,
    *,
    replica_id: int,
    leader_epoch: int,
    offset: int,
    max_bytes: int,
    max_wait_ms: int,
) -> bytes:
    """A follower's fetch: ``offset`` is its log end, every byte below it fsynced, which
    is what the leader counts towards the high watermark."""
    return request(
        REPLICA_FETCH,
        correlation_id,
        pack_str(topic)
        + _PARTITION.pack(partition)
        + _REPLICA_FETCH_REQ.pack(replica_id, leader_epoch, offset, max_bytes, max_wait_ms),
    )


def epoch_end_request(
    correlation_id: int,
    topic: str,
    partition: int,
    *,
    replica_id: int,
    leader_epoch: int,
    epoch: int,
) -> bytes:
    """ "Where does leader epoch ``epoch`` end in your log?" (a returning follower's question
    before it fetches; the answer is where its own log may diverge)."""
    return request(
        EPOCH_END,
        correlation_id,
        pack_str(topic)
        + _PARTITION.pack(partition)
        + _EPOCH_END_REQ.pack(replica_id, leader_epoch, epoch),
    )


def list_offsets_request(
    correlation_id: int, topic: str, partition: int, timestamp_ms: int
) -> bytes:
    """ "Which offset should a reader start at?": the first batch at or after
    ``timestamp_ms``, or the log's end (``LATEST_TIMESTAMP``) or start (``EARLIEST_TIMESTAMP``)."""
    return request(
        LIST_OFFSETS,
        correlation_id,
        pack_str(topic) + _PARTITION.pack(partition) + _LIST_OFFSETS_REQ.pack(timestamp_ms),
    )


@dataclass(slots=True)
class Request:
    api_key: int
    correlation_id: int
    topic: str = ""
    partition: int = 0
    token: str = ""
    batch: memoryview | None = None
    offset: int = 0
    max_bytes: int = 0
    pid: int = 0
    generation: int = 0
    flags: int = 0
    replica_id: int = 0
    leader_epoch: int = -1
    max_wait_ms: int = 0
    epoch: int = -1
    leased_since_ms: int = 0
    timestamp_ms: int = 0
    entries: list[PartitionEntry] | None = None  # PRODUCER_STATES, FENCES
    fetches: list[ReplicaFetchEntry] | None = None  # REPLICA_FETCH_MANY


def _decode_entries(c: Cursor, body: bytes | memoryview, fence: bool) -> list[PartitionEntry]:
    (n,) = c.take(_U32)
    if n == 0:
        raise InvalidRequest("a request for many partitions names none")
    if n > PARTITIONS_PER_REQUEST_MAX:
        raise InvalidRequest(
            f"{n} partitions in one request, over the limit of {PARTITIONS_PER_REQUEST_MAX}"
        )
    least = 6 + (9 if fence else 0)  # an empty topic name and the fixed fields
    if n * least > len(body) - c.pos:
        raise CorruptRecord(f"frame too short for {n} partitions")
    out: list[PartitionEntry] = []
    seen: set[tuple[str, int]] = set()
    for _ in range(n):
        topic = c.str()
        (partition,) = c.take(_PARTITION)
        flags, since = c.take(_FENCE_ENTRY) if fence else (0, 0)
        if (topic, partition) in seen:
            raise InvalidRequest(f"partition {topic}/{partition} named twice in one request")
        seen.add((topic, partition))
        out.append(PartitionEntry(topic, partition, flags, since))
    return out


def decode_request(body: bytes | memoryview) -> Request:
    """Parse a request frame's body. Raises CorruptRecord on anything malformed, and
    InvalidRequest on a well-formed request that breaks a request rule (a many-partition
    request naming none, more than ``PARTITIONS_PER_REQUEST_MAX``, or one twice); the
    caller answers with that error (using ``correlation_id`` when it was readable)."""
    c = Cursor(body)
    api_key, corr = c.take(_REQ_HEAD)
    req = Request(api_key, corr)
    if api_key == METADATA:
        return req
    if api_key == REPLICA_FETCH_MANY:
        return _decode_replica_fetch_many(c, req)
    if api_key == PRODUCER_LIST:
        return _decode_producer_list_request(c, req)
    if api_key not in API_NAMES:
        raise CorruptRecord(f"unknown api key {api_key}")
    if api_key in MANY_APIS:
        (req.pid,) = c.take(_STATE_REQ)
        if api_key == FENCES:
            (req.generation,) = c.take(_U32)
            req.token = c.str()
        req.entries = _decode_entries(c, body, api_key == FENCES)
        if c.pos != len(body):
            raise CorruptRecord(f"{len(body) - c.pos} unexpected bytes after the request")
        return req
    req.topic = c.str()
    (req.partition,) = c.take(_PARTITION)
    if api_key == PRODUCE:
        req.token = c.str()
        req.batch = c.rest()
    elif api_key == FETCH:
        req.offset, req.max_bytes = c.take(_FETCH_REQ)
    elif api_key == FENCE:
        req.pid, req.generation, req.flags = c.take(_FENCE_REQ)
        req.token = c.str()
        if c.pos < len(body):
            (req.leased_since_ms,) = c.take(_I64)
    elif api_key == PRODUCER_STATE:
        (req.pid,) = c.take(_STATE_REQ)
    elif api_key == REPLICA_FETCH:
        (req.replica_id, req.leader_epoch, req.offset, req.max_bytes, req.max_wait_ms) = c.take(
            _REPLICA_FETCH_REQ
        )
    elif api_key == EPOCH_END:
        req.replica_id, req.leader_epoch, req.epoch = c.take(_EPOCH_END_REQ)
    elif api_key == LIST_OFFSETS:
        (req.timestamp_ms,) = c.take(_LIST_OFFSETS_REQ)
    if c.pos != len(body):
        raise CorruptRecord(f"{len(body) - c.pos} unexpected bytes after the request")
    return req


# --- responses ----------------------------------------------------------------------------
def response(correlation_id: int, error_code: int, detail: str, payload: bytes) -> bytes:
    return frame(_RESP_HEAD.pack(correlation_id, error_code) + pack_str(detail[:1000]) + payload)


def produce_response(
    corr: int,
    code: int,
    detail: str = "",
    *,
    base_offset: int = -1,
    last_offset: int = -1,
    expected_sequence: int = -1,
    leader: str = "",
) -> bytes:
    return response(
        corr,
        code,
        detail,
        _PRODUCE_RESP.pack(base_offset, last_offset, expected_sequence) + pack_str(leader),
    )


def fetch_response(
    corr: int,
    code: int,
    detail: str = "",
    *,
    high_watermark: int = -1,
    log_start_offset: int = 0,
    data: bytes | Sequence[bytes] = b"",
    leader: str = "",
) -> bytes:
    """``data`` may be a list of buffers (whole stored batches) to avoid a join."""
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
    size = sum(len(x) for x in chunks)
    head = (
        _RESP_HEAD.pack(corr, code)
        + pack_str(detail[:1000])
        + _FETCH_RESP.pack(high_watermark, log_start_offset)
        + pack_str(leader)
        + _U32.pack(size)
    )
    return b"".join([pack_header(len(head) + size), head, *chunks])


def fence_response(
    corr: int,
    code: int,
    detail: str = "",
    *,
    existed: bool = False,
    durable_highwater: int = -1,
    fence_offset: int = -1,
    dropped_last_use_max_ms: int = 0,
) -> bytes:
    return response(
        corr,
        code,
        detail,
        _FENCE_RESP.pack(int(existed), durable_highwater, fence_offset)
        + _optional_i64(dropped_last_use_max_ms),
    )


def producer_state_response(
    corr: int,
    code: int,
    detail: str = "",
    *,
    found: bool = False,
    generation: int = 0,
    durable_highwater: int = -1,
    last_use_ms: int = 0,
    dropped_last_use_max_ms: int = 0,
) -> bytes:
    """``dropped_last_use_max_ms``: the newest last use of any PID the partition ever
    expired or evicted (with ``found`` false, whether "no state" may mean "state lost")."""
    return response(
        corr,
        code,
        detail,
        _STATE_RESP.pack(int(found), generation, durable_highwater, last_use_ms)
        + _optional_i64(dropped_last_use_max_ms),
    )


def state_entry(
    code: int,
    detail: str = "",
    *,
    found: bool = False,
    generation: int = 0,
    durable_highwater: int = -1,
    last_use_ms: int = 0,
    dropped_last_use_max_ms: int = 0,
) -> bytes:
    """One partition's answer in a PRODUCER_STATES answer: ``u16 error_code, str detail``
    and PRODUCER_STATE's fields, ``dropped_last_use_max_ms`` always present."""
    return (
        _U16.pack(code)
        + pack_str(detail[:1000])
        + _STATE_RESP.pack(int(found), generation, durable_highwater, last_use_ms)
        + _I64.pack(dropped_last_use_max_ms)
    )


def fence_entry(
    code: int,
    detail: str = "",
    *,
    existed: bool = False,
    durable_highwater: int = -1,
    fence_offset: int = -1,
    dropped_last_use_max_ms: int = 0,
) -> bytes:
    """One partition's answer in a FENCES answer: ``u16 error_code, str detail`` and
    FENCE's fields, ``dropped_last_use_max_ms`` always present."""
    return (
        _U16.pack(code)
        + pack_str(detail[:1000])
        + _FENCE_RESP.pack(int(existed), durable_highwater, fence_offset)
        + _I64.pack(dropped_last_use_max_ms)
    )


def entries_response(corr: int, code: int, detail: str, entries: Sequence[bytes]) -> bytes:
    """A PRODUCER_STATES / FENCES answer: ``u32 count`` and the entries (none when the
    request as a whole was refused: ``code`` says why)."""
    return response(corr, code, detail, _U32.pack(len(entries)) + b"".join(entries))


def _optional_i64(value: int) -> bytes:
    # Left out when 0 (its meaning when absent): frames stay as older versions sent them.
    return _I64.pack(value) if value else b""


def metadata_response(
    corr: int, code: int, detail: str = "", *, info: dict[str, Any] | None = None
) -> bytes:
    blob = json.dumps(info or {}).encode()
    return response(corr, code, detail, _U32.pack(len(blob)) + blob)


def replica_fetch_response(
    corr: int,
    code: int,
    detail: str = "",
    *,
    high_watermark: int = -1,
    leader_epoch: int = -1,
    epochs: Sequence[tuple[int, int]] = (),
    data: bytes | Sequence[bytes] = b"",
) -> bytes:
    """``epochs``: the leader's (epoch, start_offset) entries that the batches in ``data``
    fall in (so the follower's epoch history matches the leader's); at most 65535."""
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
    size = sum(len(x) for x in chunks)
    ep = b"".join(_EPOCH_ENTRY.pack(e, s) for e, s in epochs[:EPOCH_ENTRIES_MAX])
    head = (
        _RESP_HEAD.pack(corr, code)
        + pack_str(detail[:1000])
        + _REPLICA_FETCH_RESP.pack(
            high_watermark, leader_epoch, min(len(epochs), EPOCH_ENTRIES_MAX)
        )
        + ep
        + _U32.pack(size)
    )
    return b"".join([pack_header(len(head) + size), head, *chunks])


def epoch_end_response(
    corr: int, code: int, detail: str = "", *, epoch: int = -1, end_offset: int = -1
) -> bytes:
    return response(corr, code, detail, _EPOCH_END_RESP.pack(epoch, end_offset))


def list_offsets_response(
    corr: int,
    code: int,
    detail: str = "",
    *,
    offset: int = -1,
    log_start_offset: int = -1,
    high_watermark: int = -1,
    leader: str = "",
) -> bytes:
    return response(
        corr,
        code,
        detail,
        _LIST_OFFSETS_RESP.pack(offset, log_start_offset, high_watermark) + pack_str(leader),
    )


@dataclass(slots=True)
class Response:
    correlation_id: int
    error_code: int
    detail: str
    base_offset: int = -1
    last_offset: int = -1
    expected_sequence: int = -1
    leader: str = ""
    high_watermark: int = -1
    log_start_offset: int = 0
    data: memoryview | None = None
    found: bool = False
    existed: bool = False
    generation: int = 0
    durable_highwater: int = -1
    fence_offset: int = -1
    last_use_ms: int = 0
    dropped_last_use_max_ms: int = 0
    info: dict[str, Any] | None = None
    leader_epoch: int = -1
    epochs: list[tuple[int, int]] | None = None
    epoch: int = -1
    end_offset: int = -1
    offset: int = -1
    entries: list[Response] | None = None  # PRODUCER_STATES, FENCES: one per partition
    fetched: list[ReplicaFetched] | None = None  # REPLICA_FETCH_MANY
    rows: list[ProducerRows] | None = None  # PRODUCER_LIST (``existed``: more to ask)


def _decode_entry(c: Cursor, fence: bool) -> Response:
    (code,) = c.take(_U16)
    e = Response(0, code, c.str())
    if fence:
        existed, e.durable_highwater, e.fence_offset = c.take(_FENCE_RESP)
        e.existed = bool(existed)
    else:
        found, e.generation, e.durable_highwater, e.last_use_ms = c.take(_STATE_RESP)
        e.found = bool(found)
    (e.dropped_last_use_max_ms,) = c.take(_I64)
    return e


def decode_response(api_key: int, body: bytes | memoryview) -> Response:
    """Parse a response body for a request of ``api_key``. Raises CorruptRecord."""
    c = Cursor(body)
    corr, code = c.take(_RESP_HEAD)
    r = Response(corr, code, c.str())
    if api_key == REPLICA_FETCH_MANY:
        return _decode_replica_fetched(c, r)
    if api_key == PRODUCER_LIST:
        return _decode_producer_list(c, r)
    if api_key == PRODUCE:
        r.base_offset, r.last_offset, r.expected_sequence = c.take(_PRODUCE_RESP)
        r.leader = c.str()
    elif api_key == FETCH:
        r.high_watermark, r.log_start_offset = c.take(_FETCH_RESP)
        r.leader = c.str()
        (n,) = c.take(_U32)
        r.data = c.rest()
        if len(r.data) != n:
            raise CorruptRecord("fetch response data length mismatch")
    elif api_key == FENCE:
        existed, r.durable_highwater, r.fence_offset = c.take(_FENCE_RESP)
        r.existed = bool(existed)
        if c.pos < len(body):  # an older server leaves it out
            (r.dropped_last_use_max_ms,) = c.take(_I64)
    elif api_key == PRODUCER_STATE:
        found, r.generation, r.durable_highwater, r.last_use_ms = c.take(_STATE_RESP)
        r.found = bool(found)
        if c.pos < len(body):
            (r.dropped_last_use_max_ms,) = c.take(_I64)
    elif api_key == METADATA:
        (n,) = c.take(_U32)
        raw = bytes(c.rest())
        if len(raw) != n:
            raise CorruptRecord("metadata length mismatch")
        r.info = json.loads(raw) if raw else {}
    elif api_key == REPLICA_FETCH:
        r.high_watermark, r.leader_epoch, n_epochs = c.take(_REPLICA_FETCH_RESP)
        r.epochs = [c.take(_EPOCH_ENTRY) for _ in range(n_epochs)]
        (n,) = c.take(_U32)
        r.data = c.rest()
        if len(r.data) != n:
            raise CorruptRecord("replica fetch response data length mismatch")
    elif api_key == EPOCH_END:
        r.epoch, r.end_offset = c.take(_EPOCH_END_RESP)
    elif api_key == LIST_OFFSETS:
        r.offset, r.log_start_offset, r.high_watermark = c.take(_LIST_OFFSETS_RESP)
        r.leader = c.str()
    elif api_key in MANY_APIS:
        (n,) = c.take(_U32)
        if n > PARTITIONS_PER_REQUEST_MAX:
            raise CorruptRecord(f"answer of {n} partitions, over {PARTITIONS_PER_REQUEST_MAX}")
        r.entries = [_decode_entry(c, api_key == FENCES) for _ in range(n)]
    return r


def peek_correlation_id(body: bytes | memoryview) -> int:
    """The correlation id of a response body (first 4 bytes)."""
    correlation_id: int = _U32.unpack_from(body, 0)[0]
    return correlation_id


# --- REPLICA_FETCH_MANY (issue 24): one follower's fetch for every partition it follows
# on one leader server (a fetch session per server pair, after Kafka's KIP-227).
#
#   request  = u32 replica_id, u32 max_wait_ms, u32 max_bytes, u32 partition_max_bytes,
#              u32 n, n x (str topic, u32 partition, i32 leader_epoch, i64 offset,
#                          i64 high_watermark)
#   response = u32 n, n x (str topic, u32 partition, u16 error_code, str detail,
#                          i64 high_watermark, i32 leader_epoch, u16 n_epochs,
#                          n_epochs x (i32 epoch, i64 start_offset), u32 size, data)
#
# Each entry carries what REPLICA_FETCH carries for one partition, plus the follower's own
# high watermark: the leader answers only the partitions with something new for it (data,
# a higher high watermark, an error), and holds the request up to ``max_wait_ms`` while
# none has any (incremental answers; an idle pair costs one small round trip per wait).
REPLICA_FETCH_MANY = 11
API_NAMES[REPLICA_FETCH_MANY] = "replica_fetch_many"
# Partitions one request may name (a follower with more splits them over rounds).
REPLICA_FETCH_PARTITIONS_MAX = 20_000
_FETCH_MANY_REQ = struct.Struct(">IIIII")  # replica_id, max_wait_ms, max_bytes, part_max, n
_FETCH_MANY_ENTRY = struct.Struct(">Iiqq")  # partition, leader_epoch, offset, high_watermark
_FETCHED_HEAD = struct.Struct(">IH")  # partition, error_code (topic before, detail after)
_FETCHED_MID = struct.Struct(">qiH")  # high_watermark, leader_epoch, epoch entries
_FETCH_MANY_ENTRY_MIN = 2 + _FETCH_MANY_ENTRY.size  # an empty topic name
_FETCHED_ENTRY_MIN = 2 + _FETCHED_HEAD.size + 2 + _FETCHED_MID.size + 4


@dataclass(slots=True)
class ReplicaFetchEntry:
    """One partition of a REPLICA_FETCH_MANY request: the follower's log end (all of it
    fsynced), its high watermark, and the leader epoch it follows."""

    topic: str
    partition: int
    leader_epoch: int
    offset: int
    high_watermark: int


@dataclass(slots=True)
class ReplicaFetched:
    """One partition of a REPLICA_FETCH_MANY answer (REPLICA_FETCH's answer for it)."""

    topic: str
    partition: int
    error_code: int = 0
    detail: str = ""
    high_watermark: int = -1
    leader_epoch: int = -1
    epochs: list[tuple[int, int]] | None = None
    data: memoryview | bytes = b""


def replica_fetch_many_request(
    correlation_id: int,
    entries: Sequence[ReplicaFetchEntry],
    *,
    replica_id: int,
    max_wait_ms: int,
    max_bytes: int,
    partition_max_bytes: int,
) -> bytes:
    if len(entries) > REPLICA_FETCH_PARTITIONS_MAX:
        raise ValueError(
            f"{len(entries)} partitions in one fetch; at most {REPLICA_FETCH_PARTITIONS_MAX}"
        )
    parts = [
        _FETCH_MANY_REQ.pack(replica_id, max_wait_ms, max_bytes, partition_max_bytes, len(entries))
    ]
    for e in entries:
        parts.append(pack_str(e.topic))
        parts.append(
            _FETCH_MANY_ENTRY.pack(e.partition, e.leader_epoch, e.offset, e.high_watermark)
        )
    return request(REPLICA_FETCH_MANY, correlation_id, b"".join(parts))


def _decode_replica_fetch_many(c: Cursor, req: Request) -> Request:
    req.replica_id, req.max_wait_ms, req.max_bytes, req.flags, n = c.take(_FETCH_MANY_REQ)
    if n > REPLICA_FETCH_PARTITIONS_MAX:
        raise CorruptRecord(
            f"replica fetch names {n} partitions; at most {REPLICA_FETCH_PARTITIONS_MAX}"
        )
    if n * _FETCH_MANY_ENTRY_MIN > len(c.buf) - c.pos:
        raise CorruptRecord(f"replica fetch names {n} partitions but the frame is too short")
    entries = []
    for _ in range(n):
        topic = c.str()
        partition, epoch, offset, hw = c.take(_FETCH_MANY_ENTRY)
        entries.append(ReplicaFetchEntry(topic, partition, epoch, offset, hw))
    if c.pos != len(c.buf):
        raise CorruptRecord(f"{len(c.buf) - c.pos} unexpected bytes after the request")
    req.fetches = entries
    return req


def replica_fetch_many_response(
    corr: int, code: int, detail: str = "", fetched: Sequence[ReplicaFetched] = ()
) -> bytes:
    """``data`` of an entry may be a list of buffers (whole stored batches): joined once."""
    chunks: list[bytes | memoryview] = [
        _RESP_HEAD.pack(corr, code) + pack_str(detail[:1000]) + _U32.pack(len(fetched))
    ]
    for f in fetched:
        data = f.data
        bufs = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        epochs = (f.epochs or [])[:EPOCH_ENTRIES_MAX]
        chunks.append(
            pack_str(f.topic)
            + _FETCHED_HEAD.pack(f.partition, f.error_code)
            + pack_str(f.detail[:1000])
            + _FETCHED_MID.pack(f.high_watermark, f.leader_epoch, len(epochs))
            + b"".join(_EPOCH_ENTRY.pack(e, s) for e, s in epochs)
            + _U32.pack(sum(len(b) for b in bufs))
        )
        chunks.extend(bufs)
    body = sum(len(x) for x in chunks)
    return b"".join([pack_header(body), *chunks])


def _decode_replica_fetched(c: Cursor, r: Response) -> Response:
    (n,) = c.take(_U32)
    if n * _FETCHED_ENTRY_MIN > len(c.buf) - c.pos:
        raise CorruptRecord(f"replica fetch answer names {n} partitions but is too short")
    out = []
    for _ in range(n):
        topic = c.str()
        partition, code = c.take(_FETCHED_HEAD)
        detail = c.str()
        hw, epoch, n_epochs = c.take(_FETCHED_MID)
        epochs = [c.take(_EPOCH_ENTRY) for _ in range(n_epochs)]
        (size,) = c.take(_U32)
        if c.pos + size > len(c.buf):
            raise CorruptRecord("replica fetch answer ends in the middle of its data")
        data = memoryview(c.buf)[c.pos : c.pos + size]
        c.pos += size
        out.append(ReplicaFetched(topic, partition, code, detail, hw, epoch, epochs, data))
    if c.pos != len(c.buf):
        raise CorruptRecord(f"{len(c.buf) - c.pos} unexpected bytes after the answer")
    r.fetched = out
    return r


# --- PRODUCER_LIST (issue 29): every producer-state row a server holds for the partitions
# it leads, for the operator's view of all PIDs (one request per leader per refresh, not
# one PRODUCER_STATE per PID). Read-only: unlike PRODUCER_STATE it refreshes no PID's last
# use, so watching PIDs never keeps them alive.
#
#   request  = u32 rows_max, str after_topic, i32 after_partition, i64 after_pid
#   response = u8 more, u32 n, n x (str topic, u32 partition, i32 leader_epoch,
#                                    u32 tracked, u32 rows, rows x u64 pid,
#                                    rows x u32 generation, rows x i64 durable_highwater,
#                                    rows x i64 last_use_ms)
#
# Partitions come in (topic, partition) order and each one's rows in PID order, starting
# after the cursor (after_topic, after_partition, after_pid; "", -1, -1: from the start);
# at most ``rows_max`` rows per answer (a partition may be split over answers; ``more``
# says to ask again from the last row). ``tracked`` is the partition's whole row count.
# Rows travel as columns: a server encodes a million in a few array copies.
PRODUCER_LIST = 12
API_NAMES[PRODUCER_LIST] = "producer_list"
PRODUCER_LIST_ROWS_MAX = 200_000  # 28 bytes a row: 5.6 MB, well under a 16 MB frame
_LIST_REQ_ROWS = struct.Struct(">I")
_LIST_REQ_AFTER = struct.Struct(">iq")  # after_partition, after_pid
_LIST_PART = struct.Struct(">IiII")  # partition, leader_epoch, tracked, rows
_LIST_ROW_BYTES = 8 + 4 + 8 + 8


@dataclass(slots=True)
class ProducerRows:
    """One partition's rows in a PRODUCER_LIST answer, as columns in PID order."""

    topic: str
    partition: int
    leader_epoch: int
    tracked: int
    pids: array[int]
    generations: array[int]
    durable_highwaters: array[int]
    last_use_ms: array[int]


def _column(typecode: str, values: Sequence[int] | array[int]) -> bytes:
    col = array(typecode, values)
    if _LITTLE:
        col.byteswap()
    return col.tobytes()


def _read_column(c: Cursor, typecode: str, n: int) -> array[int]:
    col = array(typecode)
    size = col.itemsize * n
    if c.pos + size > len(c.buf):
        raise CorruptRecord("producer list answer ends in the middle of a column")
    col.frombytes(bytes(c.buf[c.pos : c.pos + size]))
    c.pos += size
    if _LITTLE:
        col.byteswap()
    return col


def producer_list_request(
    correlation_id: int,
    rows_max: int = PRODUCER_LIST_ROWS_MAX,
    after: tuple[str, int, int] = ("", -1, -1),
) -> bytes:
    topic, partition, pid = after
    return request(
        PRODUCER_LIST,
        correlation_id,
        _LIST_REQ_ROWS.pack(rows_max) + pack_str(topic) + _LIST_REQ_AFTER.pack(partition, pid),
    )


def _decode_producer_list_request(c: Cursor, req: Request) -> Request:
    (rows_max,) = c.take(_LIST_REQ_ROWS)
    if not 1 <= rows_max <= PRODUCER_LIST_ROWS_MAX:
        raise CorruptRecord(f"rows_max {rows_max} is not within 1..{PRODUCER_LIST_ROWS_MAX}")
    req.max_bytes = rows_max
    req.topic = c.str()
    req.partition, req.pid = c.take(_LIST_REQ_AFTER)
    if c.pos != len(c.buf):
        raise CorruptRecord(f"{len(c.buf) - c.pos} unexpected bytes after the request")
    return req


def producer_list_part(
    topic: str,
    partition: int,
    leader_epoch: int,
    tracked: int,
    columns: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]],
) -> bytes:
    """One partition of a PRODUCER_LIST answer: ``columns`` = (pids, generations,
    durable highwaters, last uses), equally long, in PID order."""
    pids, gens, dhws, lus = columns
    return (
        pack_str(topic)
        + _LIST_PART.pack(partition, leader_epoch, tracked, len(pids))
        + _column("Q", pids)
        + _column("I", gens)
        + _column("q", dhws)
        + _column("q", lus)
    )


def producer_list_response(
    corr: int, code: int, detail: str = "", parts: Sequence[bytes] = (), more: bool = False
) -> bytes:
    chunks = [
        _RESP_HEAD.pack(corr, code) + pack_str(detail[:1000]),
        _U8.pack(int(more)) + _U32.pack(len(parts)),
        *parts,
    ]
    return b"".join([pack_header(sum(len(x) for x in chunks)), *chunks])


def _decode_producer_list(c: Cursor, r: Response) -> Response:
    r.rows = []
    if c.pos == len(c.buf):  # an error answer carries no rows
        return r
    more, n = c.take(_U8) + c.take(_U32)
    r.existed = bool(more)
    if n * (2 + _LIST_PART.size) > len(c.buf) - c.pos:
        raise CorruptRecord(f"producer list answer names {n} partitions but is too short")
    for _ in range(n):
        topic = c.str()
        partition, epoch, tracked, rows = c.take(_LIST_PART)
        if rows * _LIST_ROW_BYTES > len(c.buf) - c.pos:
            raise CorruptRecord(f"producer list answer names {rows} rows but is too short")
        cols = [_read_column(c, t, rows) for t in ("Q", "I", "q", "q")]
        r.rows.append(ProducerRows(topic, partition, epoch, tracked, *cols))
    if c.pos != len(c.buf):
        raise CorruptRecord(f"{len(c.buf) - c.pos} unexpected bytes after the answer")
    return r
