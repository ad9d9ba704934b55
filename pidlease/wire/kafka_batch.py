"""Kafka RecordBatch v2 on the partition side: validation with Kafka's error codes, encoding
(for conversions and tests) and the conversion of our stored batches for Kafka consumers.

The header of a stored Kafka batch is decoded where ours is (``protocol.decode_batch_header``,
one switch on byte 16); this module adds what only the Kafka listener needs. A Produce's batch
is checked here (lengths, magic, CRC-32C, record count, every record's fields) and then
stored byte for byte as sent (docs/kafka.md, "On-disk format"), so the produce path costs one
C checksum and one walk of the records, never a re-encoding.

Layout (Kafka's, big-endian; offsets from the batch start):

    0  baseOffset i64 | 8 batchLength i32 | 12 partitionLeaderEpoch i32 | 16 magic i8 = 2
    17 crc u32 (CRC-32C of bytes 21..end) | 21 attributes i16 | 23 lastOffsetDelta i32
    27 baseTimestamp i64 | 35 maxTimestamp i64 | 43 producerId i64 | 51 producerEpoch i16
    53 baseSequence i32 | 57 recordCount i32 | 61 records

    record = length varint, attributes i8, timestampDelta varlong, offsetDelta varint,
             keyLength varint (-1: null), key, valueLength varint, value,
             headerCount varint, headers (keyLength varint, key, valueLength varint, value)

Varints are zig-zag encoded (signed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import google_crc32c

from pidlease.errors import CorruptRecord
from pidlease.wire import kafka_codecs as KC
from pidlease.wire import protocol as P
from pidlease.wire.kafka_errors import (
    CORRUPT_MESSAGE,
    DUPLICATE_SEQUENCE_NUMBER,
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    KAFKA_STORAGE_ERROR,
    MESSAGE_TOO_LARGE,
    NONE,
    NOT_ENOUGH_REPLICAS,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    UNKNOWN_PRODUCER_ID,
    UNKNOWN_SERVER_ERROR,
    UNSUPPORTED_COMPRESSION_TYPE,
    UNSUPPORTED_FOR_MESSAGE_FORMAT,
)

__all__ = [
    "CORRUPT_MESSAGE",
    "DUPLICATE_SEQUENCE_NUMBER",
    "INVALID_PRODUCER_EPOCH",
    "INVALID_RECORD",
    "KAFKA_STORAGE_ERROR",
    "MESSAGE_TOO_LARGE",
    "NONE",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "NOT_LEADER_OR_FOLLOWER",
    "OFFSET_OUT_OF_RANGE",
    "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "UNKNOWN_PRODUCER_ID",
    "UNKNOWN_SERVER_ERROR",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "UNSUPPORTED_FOR_MESSAGE_FORMAT",
    "KafkaBatchError",
    "encode_kafka_batch",
    "encode_varint",
    "native_to_kafka",
    "validate_kafka_batch",
]


# attributes: bits 0-2 compression codec, 3 timestamp type, 4 transactional, 5 control.
_CODEC_MASK = 0x07
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
SUPPORTED_CODECS = frozenset(KC.CODEC_NAMES)  # none, gzip, snappy, lz4, zstd
_SEQUENCE_MAX = 2**31 - 1


class KafkaBatchError(CorruptRecord):
    """A Produce's batch that is refused; ``kafka_code`` is the Kafka error to answer."""

    def __init__(self, kafka_code: int, detail: str) -> None:
        super().__init__(detail)
        self.kafka_code = kafka_code


def validate_kafka_batch(
    buf: bytes | memoryview,
    *,
    max_bytes: int | None = None,
    max_decompressed: int = KC.DECOMPRESSED_BYTES_MAX,
) -> P.BatchHeader:
    """Check that ``buf`` is exactly one well-formed, non-transactional Kafka RecordBatch
    v2 and return its header (``protocol.decode_kafka_header``'s shape). A compressed
    batch (gzip, snappy, lz4, zstd) is decompressed, at most ``max_decompressed`` bytes, and
    its records checked as an uncompressed batch's; it is stored as sent. Raises
    KafkaBatchError with the Kafka code to answer."""
    n = len(buf)
    if max_bytes is not None and n > max_bytes:
        raise KafkaBatchError(MESSAGE_TOO_LARGE, f"batch of {n} bytes is over {max_bytes}")
    if n < P.KAFKA_HEADER_SIZE:
        if n > 16 and buf[16] != P.KAFKA_MAGIC:
            raise KafkaBatchError(UNSUPPORTED_FOR_MESSAGE_FORMAT, f"magic {buf[16]}, not 2")
        raise KafkaBatchError(CORRUPT_MESSAGE, f"{n} bytes is shorter than a batch header")
    (_, length, _, magic, crc, attributes, delta, _, _, pid, epoch, seq, count) = (
        P.KAFKA_HEADER.unpack_from(buf, 0)
    )
    if magic != P.KAFKA_MAGIC:
        raise KafkaBatchError(
            UNSUPPORTED_FOR_MESSAGE_FORMAT, f"magic {magic}: only RecordBatch v2 is taken"
        )
    if length + 12 != n:
        raise KafkaBatchError(
            CORRUPT_MESSAGE, f"batchLength says {length + 12} bytes, the request holds {n}"
        )
    if P.kafka_crc(buf, P.KAFKA_CRC_START, n) != crc:
        raise KafkaBatchError(CORRUPT_MESSAGE, "batch CRC-32C mismatch")
    codec = attributes & _CODEC_MASK
    if codec not in SUPPORTED_CODECS:
        raise KafkaBatchError(
            UNSUPPORTED_COMPRESSION_TYPE, f"compression codec {codec} is not one of Kafka's"
        )
    if attributes & (_TRANSACTIONAL | _CONTROL):
        raise KafkaBatchError(INVALID_RECORD, "transactional and control batches are not taken")
    if count < 1 or count != delta + 1:
        raise KafkaBatchError(
            INVALID_RECORD, f"recordCount {count} with lastOffsetDelta {delta}: not contiguous"
        )
    if pid >= 0:
        if not 0 <= epoch <= P.KAFKA_EPOCH_MAX or not 0 <= seq <= _SEQUENCE_MAX:
            raise KafkaBatchError(INVALID_RECORD, f"producer epoch {epoch} or sequence {seq}")
        if pid == 0 or pid > P.MAX_PID:
            raise KafkaBatchError(INVALID_RECORD, f"producer id {pid} out of range")
    elif pid != -1 or seq != -1:
        raise KafkaBatchError(INVALID_RECORD, "no producer id but a sequence")
    if codec:
        plain = _decompressed(buf, codec, max_decompressed)
        # The records as the producer wrote them, behind the header, walked as if stored so.
        _walk_records(
            bytes(buf[: P.KAFKA_HEADER_SIZE]) + plain, count, P.KAFKA_HEADER_SIZE + len(plain)
        )
    else:
        _walk_records(buf, count, n)
    return P.decode_kafka_header(buf, 0)


def _decompressed(buf: bytes | memoryview, codec: int, limit: int) -> bytes:
    """The records of a compressed batch, or KafkaBatchError: a codec not served here
    UNSUPPORTED_COMPRESSION_TYPE, over ``limit`` (a bomb) MESSAGE_TOO_LARGE, data that does
    not decompress CORRUPT_MESSAGE."""
    try:
        return KC.decompress(codec, memoryview(buf)[P.KAFKA_HEADER_SIZE :], limit)
    except KC.CodecError as exc:
        code = {
            "unsupported": UNSUPPORTED_COMPRESSION_TYPE,
            "unavailable": UNSUPPORTED_COMPRESSION_TYPE,
            "too_large": MESSAGE_TOO_LARGE,
        }.get(exc.kind, CORRUPT_MESSAGE)
        raise KafkaBatchError(code, str(exc)) from None


# offsetDelta i as its zig-zag varint, for the strided check of uniform records: index i
# takes one byte below 64, two below 8192, three below 2**20 (batches of up to 1 MB of tiny
# records stay well under). _OD_BYTES[w] holds byte k of every index's w-byte encoding, so
# a segment of one width is checked by w compares of slices.
_OD_ENDS = (64, 8192, 2**20)
_OD_MAX = 2**17  # the tables' reach; records beyond are walked one by one


def _od_tables(width: int) -> tuple[bytes, ...]:
    out = []
    for k in range(width):
        shift = 7 * k
        last = k == width - 1
        out.append(
            bytes(
                ((2 * i) >> shift) & 0x7F | (0 if last else 0x80)
                for i in range(min(_OD_ENDS[width - 1], _OD_MAX))
            )
        )
    return tuple(out)


_OD_BYTES = {w: _od_tables(w) for w in (1, 2, 3)}
_UNIFORM_MIN = 16  # records in a segment below which the strided check costs more than it saves


def _walk_records(buf: bytes | memoryview, count: int, end: int) -> None:
    """Every record must parse, fill its length exactly, and carry offsetDelta = its index;
    the records must fill the batch in ``count`` steps. A batch taken is then readable by
    every reader (Kafka's brokers check as much). The format has no record index. Producers
    mostly send runs of records of one shape (same sizes, no or same-sized headers), so
    ``_uniform_prefix`` first checks such runs a few C-level strided compares at a time;
    whatever it does not cover is walked one Python loop per record, kept tight: varints of
    one or two bytes (every field of a record under 8 KiB) are decoded inline, longer ones
    by ``read_varint``."""
    # (small batches skip the attempt without a call: a call is what they would save)
    if count >= _UNIFORM_MIN:
        start, p = _uniform_prefix(buf, count, end)
    else:
        start, p = 0, P.KAFKA_HEADER_SIZE
    read = P.read_varint
    try:
        for i in range(start, count):
            # length
            b = buf[p]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                r = (b & 0x7F) | (buf[p + 1] << 7)
                length = (r >> 1) ^ -(r & 1)
                p += 2
            else:
                length, p = read(buf, p)
            rec_end = p + length
            if length < 1 or rec_end > end:
                raise KafkaBatchError(INVALID_RECORD, f"record {i} has a bad length {length}")
            # attributes (1 byte), then timestampDelta
            p += 1
            b = buf[p]
            if b < 0x80:
                p += 1
            else:
                _, p = read(buf, p)
            # offsetDelta
            b = buf[p]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                r = (b & 0x7F) | (buf[p + 1] << 7)
                delta = (r >> 1) ^ -(r & 1)
                p += 2
            else:
                delta, p = read(buf, p)
            if delta != i:
                raise KafkaBatchError(INVALID_RECORD, f"record {i} says offsetDelta {delta}")
            # key
            b = buf[p]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                klen, p = read(buf, p)
            if klen > 0:
                p += klen
            # value
            b = buf[p]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                r = (b & 0x7F) | (buf[p + 1] << 7)
                vlen = (r >> 1) ^ -(r & 1)
                p += 2
            else:
                vlen, p = read(buf, p)
            if vlen > 0:
                p += vlen
            if klen < -1 or vlen < -1:
                raise KafkaBatchError(INVALID_RECORD, f"record {i} has a negative length")
            # headers
            b = buf[p]
            if b == 0:
                p += 1
            else:
                p = _walk_headers(buf, p, i)
            if p != rec_end:
                raise KafkaBatchError(INVALID_RECORD, f"record {i} does not fill its length")
    except IndexError:
        raise KafkaBatchError(INVALID_RECORD, "a record runs past the batch") from None
    except KafkaBatchError:
        raise
    except CorruptRecord as exc:  # read_varint's
        raise KafkaBatchError(INVALID_RECORD, str(exc)) from None
    if p != end:
        raise KafkaBatchError(
            INVALID_RECORD, "records do not fill the batch (recordCount or lengths wrong)"
        )


def _uniform_prefix(buf: bytes | memoryview, count: int, end: int) -> tuple[int, int]:
    """How many leading records (and the position after them) are proved well formed by
    strided compares. Records [0, 64) share the width of their offsetDelta, as do
    [64, 8192) and [8192, 2**20); in each such segment the first record is parsed in full
    (``_record_shape``) and the rest are taken if, at every varint byte of that first
    record, they hold the same byte (so the same lengths, header counts, and the same record
    size), except the timestampDelta, which must be a one-byte varint, and the offsetDelta,
    which must be the record's index. Each such record then parses exactly as the first
    did. Stops at the first segment that is not uniform (or too short to be worth it); the
    caller walks the rest record by record."""
    i, p = 0, P.KAFKA_HEADER_SIZE
    if not _sizes_fit(buf, count, end):
        return i, p
    data = buf if isinstance(buf, bytes) else bytes(buf)
    width = 1
    while i < count and i < _OD_MAX:
        while i >= _OD_ENDS[width - 1]:
            width += 1
        seg_end = min(count, _OD_ENDS[width - 1], _OD_MAX)
        m = seg_end - i
        if m < _UNIFORM_MIN:
            break
        shape = _record_shape(data, p, i, end)
        if shape is None:
            break
        size, fixed, ts_at, od_at = shape
        stop = p + m * size
        if stop > end:
            break
        if max(data[p + ts_at : stop : size]) >= 0x80:
            break
        if any(
            data[p + od_at + k : stop : size] != table[i:seg_end]
            for k, table in enumerate(_OD_BYTES[width])
        ):
            break
        if any(data[p + at : stop : size].count(byte) != m for at, byte in fixed):
            break
        i, p = seg_end, stop
    return i, p


def _sizes_fit(buf: bytes | memoryview, count: int, end: int) -> bool:
    """Whether the batch is as long as if every record were the first one's size (one byte
    more from index 64 on, for the wider offsetDelta): a check in constant time that spares
    batches of mixed sizes the strided attempt. Only a filter; it proves nothing."""
    if count < _UNIFORM_MIN:
        return False
    p = P.KAFKA_HEADER_SIZE
    try:
        length, q = P.read_varint(buf, p)
    except (IndexError, CorruptRecord):
        return False
    size = q - p + length
    wider = sum(max(0, count - e) for e in _OD_ENDS[:2])  # one byte more past each
    return end - p == count * size + wider


def _record_shape(
    data: bytes, p: int, i: int, end: int
) -> tuple[int, list[tuple[int, int]], int, int] | None:
    """The record at ``p`` (index ``i``) parsed in full: its size, the (offset, byte) of
    every varint byte in it but the timestampDelta's and offsetDelta's, and the offsets of
    those two. None if it is not well formed or its timestampDelta is not one byte (the
    record walk then says what is wrong)."""
    fixed: list[tuple[int, int]] = []

    def varint(q: int) -> tuple[int, int]:
        value, after = P.read_varint(data, q)
        fixed.extend((k - p, data[k]) for k in range(q, after))
        return value, after

    try:
        length, q = varint(p)
        rec_end = q + length
        if length < 1 or rec_end > end:
            return None
        ts_at = q + 1 - p
        if data[q + 1] >= 0x80:
            return None
        od_at = q + 2 - p
        # The strided compare covers this record too, so its offsetDelta must be the
        # canonical varint of i, of the segment's width, as the others' (a padded varint
        # here would shift every field after it in them).
        delta, q = P.read_varint(data, q + 2)
        if delta != i:
            return None
        klen, q = varint(q)
        q += max(klen, 0)
        vlen, q = varint(q)
        q += max(vlen, 0)
        if klen < -1 or vlen < -1:
            return None
        nheaders, q = varint(q)
        if nheaders < 0:
            return None
        for _ in range(nheaders):
            hk, q = varint(q)
            if hk < 0:
                return None
            q += hk
            hv, q = varint(q)
            q += max(hv, 0)
    except (IndexError, CorruptRecord):
        return None
    if q != rec_end:
        return None
    return rec_end - p, fixed, ts_at, od_at


def _walk_headers(buf: bytes | memoryview, p: int, i: int) -> int:
    read = P.read_varint
    nheaders, p = read(buf, p)
    if nheaders < 0:
        raise KafkaBatchError(INVALID_RECORD, f"record {i} has {nheaders} headers")
    for _ in range(nheaders):
        hk, p = read(buf, p)
        if hk < 0:
            raise KafkaBatchError(INVALID_RECORD, f"record {i}: a header has no key")
        p += hk
        hv, p = read(buf, p)
        if hv > 0:
            p += hv
    return p


def encode_varint(value: int) -> bytes:
    """Kafka's zig-zag varint of a signed 64-bit ``value``."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def encode_record(
    offset_delta: int,
    key: bytes | None,
    value: bytes | None,
    ts_delta: int = 0,
    headers: Sequence[tuple[bytes, bytes | None]] = (),
) -> bytes:
    parts = [
        b"\x00",
        encode_varint(ts_delta),
        encode_varint(offset_delta),
        encode_varint(-1) if key is None else encode_varint(len(key)) + key,
        encode_varint(-1) if value is None else encode_varint(len(value)) + value,
        encode_varint(len(headers)),
    ]
    for hk, hv in headers:
        parts.append(encode_varint(len(hk)) + hk)
        parts.append(encode_varint(-1) if hv is None else encode_varint(len(hv)) + hv)
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def encode_kafka_batch(
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_timestamp_ms: int = 0,
    attributes: int = 0,
    partition_leader_epoch: int = -1,
    headers: Sequence[tuple[bytes, bytes | None]] = (),
    compression: int = 0,
) -> bytes:
    """A RecordBatch v2 of ``records`` ((key, value) pairs), as a Kafka producer builds it
    (``headers`` on every record, for tests of readers that must skip them; ``compression``
    a codec of ``kafka_codecs``, set in the attributes and applied to the records)."""
    body = b"".join([encode_record(i, k, v, headers=headers) for i, (k, v) in enumerate(records)])
    if compression:
        body = KC.compress(compression, body)
        attributes = (attributes & ~_CODEC_MASK) | compression
    return _assemble(
        body,
        len(records),
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_timestamp_ms=base_timestamp_ms,
        max_timestamp_ms=base_timestamp_ms,
        attributes=attributes,
        partition_leader_epoch=partition_leader_epoch,
    )


def _assemble(
    body: bytes,
    count: int,
    *,
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    base_timestamp_ms: int,
    max_timestamp_ms: int,
    attributes: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    head = P.KAFKA_HEADER.pack(
        base_offset,
        P.KAFKA_HEADER_SIZE - 12 + len(body),
        partition_leader_epoch,
        P.KAFKA_MAGIC,
        0,
        attributes,
        count - 1,
        base_timestamp_ms,
        max_timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    crc = google_crc32c.extend(google_crc32c.value(head[P.KAFKA_CRC_START :]), body)
    return head[:17] + int(crc).to_bytes(4, "big") + head[21:] + body


def native_to_kafka(chunks: Iterable[bytes | memoryview]) -> bytes:
    """Stored batches (``Partition.fetch``'s chunks) as Kafka RecordBatch v2 bytes: Kafka
    batches as stored, ours converted one for one (producerId -1: a Kafka consumer has no
    use for our PID and generation, which do not fit Kafka's int16 epoch), our control
    batches left out (the consumer sees a gap in offsets, as in a compacted log)."""
    out: list[bytes | memoryview] = []
    for chunk in chunks:
        mv = memoryview(chunk)
        for h, pos in P.iter_batches(mv, check_crc=False):  # the log checked them
            if h.flags & P.FLAG_KAFKA:
                out.append(mv[pos : pos + h.size])
            elif not h.is_control:
                out.append(_convert(mv, h, pos))
    return b"".join(out)


def _convert(mv: memoryview, h: P.BatchHeader, pos: int) -> bytes:
    """One batch of ours as a Kafka batch with the same offsets (per-record Python: the
    formats differ record by record)."""
    parts: list[bytes] = []
    for i, rec in enumerate(P.iter_records(mv, h, pos)):
        parts.append(encode_record(i, rec.key, rec.value))
    return _assemble(
        b"".join(parts),
        h.count,
        base_offset=h.base_offset,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        base_timestamp_ms=h.timestamp_ms,
        max_timestamp_ms=h.timestamp_ms,
    )
