"""The Kafka RecordBatch v2 codec (pidlease/wire/kafka_batch.py and the both-format header
decode of protocol.py): round trips, CRC-32C against the independent ``crc32c`` package,
each refusal with its Kafka code, garbage never raising anything but KafkaBatchError, and
the conversion of our batches for Kafka consumers."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease.cli.verify import audit
from pidlease.errors import CorruptRecord
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P

GEN0 = P.KAFKA_GENERATION_BASE


def kbatch(n: int = 3, **kw: object) -> bytes:
    recs = [(b"k%d" % i if i % 2 else None, b"value-%d" % i) for i in range(n)]
    args: dict[str, object] = {
        "producer_id": 9,
        "producer_epoch": 2,
        "base_sequence": 10,
        "base_timestamp_ms": 1_700_000_000_000,
    }
    args.update(kw)
    return K.encode_kafka_batch(recs, **args)  # type: ignore[arg-type]


def recrc(buf: bytearray) -> bytes:
    """Fix the CRC-32C after a deliberate change (to test the checks behind the CRC)."""
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def test_round_trip_header_and_records() -> None:
    raw = kbatch(3, headers=[(b"trace", b"abc"), (b"empty", None)])
    h = K.validate_kafka_batch(raw)
    assert h == P.decode_batch_header(raw)
    assert (h.pid, h.generation, h.base_sequence, h.count) == (9, GEN0 + 2, 10, 3)
    assert P.is_kafka(h) and P.kafka_epoch(h) == 2 and h.size == len(raw)
    assert h.timestamp_ms == 1_700_000_000_000
    stored = bytearray(raw)
    P.set_base_offset(stored, 40)
    h = P.decode_batch_header(bytes(stored))
    recs = list(P.iter_records(bytes(stored), h, 0, "t", 1))
    assert [(r.offset, r.key, r.value, r.sequence_id) for r in recs] == [
        (40, None, b"value-0", 10),
        (41, b"k1", b"value-1", 11),
        (42, None, b"value-2", 12),
    ]
    assert all(r.pid == 9 and r.generation == GEN0 + 2 and not r.is_control for r in recs)
    # base offset is outside the CRC, as ours: the stored batch still checks
    assert P.batch_crc_ok(bytes(stored), h)


def test_sequences_wrap_in_records() -> None:
    raw = kbatch(3, base_sequence=2**31 - 2)
    h = K.validate_kafka_batch(raw)
    assert [r.sequence_id for r in P.iter_records(raw, h, 0)] == [2**31 - 2, 2**31 - 1, 0]


def test_no_producer_id_is_pid_0() -> None:
    raw = kbatch(2, producer_id=-1, producer_epoch=-1, base_sequence=-1)
    h = K.validate_kafka_batch(raw)
    assert (h.pid, h.generation, h.base_sequence) == (0, 0, 0)


@pytest.mark.parametrize(
    "data", [b"", b"123456789", bytes(range(256)) * 17, b"\x00" * 32, b"\xff" * 33]
)
def test_crc32c_matches_the_crc32c_package(data: bytes) -> None:
    assert P.kafka_crc(data, 0, len(data)) == crc32c.crc32c(data)
    assert P.kafka_crc(memoryview(b"xx" + data), 2, 2 + len(data)) == crc32c.crc32c(data)


def test_crc32c_known_vector() -> None:
    assert P.kafka_crc(b"123456789", 0, 9) == 0xE3069283  # the CRC-32C check value


def test_stored_crc_is_crc32c_of_attributes_to_end() -> None:
    raw = kbatch(5)
    assert struct.unpack_from(">I", raw, 17)[0] == crc32c.crc32c(raw[21:])


def codes(raw: bytes, **kw: int) -> int:
    with pytest.raises(K.KafkaBatchError) as info:
        K.validate_kafka_batch(raw, **kw)
    assert isinstance(info.value, CorruptRecord) and str(info.value)
    return info.value.kafka_code


def test_refusals_carry_kafka_codes() -> None:
    raw = kbatch(3)
    flipped = bytearray(raw)
    flipped[-1] ^= 1
    assert codes(bytes(flipped)) == K.CORRUPT_MESSAGE  # CRC
    assert codes(raw[:-1]) == K.CORRUPT_MESSAGE  # batchLength vs bytes
    assert codes(raw + b"\x00") == K.CORRUPT_MESSAGE  # a second (partial) batch
    assert codes(raw[:30]) == K.CORRUPT_MESSAGE  # short header
    magic1 = bytearray(raw)
    magic1[16] = 1
    assert codes(bytes(magic1)) == K.UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert codes(raw, max_bytes=len(raw) - 1) == K.MESSAGE_TOO_LARGE
    for codec in (1, 2, 3, 4):  # flagged compressed, records not: they do not decompress
        assert codes(kbatch(2, attributes=codec)) == K.CORRUPT_MESSAGE
    for codec in (5, 6, 7):  # not Kafka's (tests/unit/wire/test_kafka_codecs.py: the codecs)
        assert codes(kbatch(2, attributes=codec)) == K.UNSUPPORTED_COMPRESSION_TYPE
    assert codes(kbatch(2, attributes=0x10)) == K.INVALID_RECORD  # transactional
    assert codes(kbatch(2, attributes=0x20)) == K.INVALID_RECORD  # control
    wrong_count = bytearray(raw)
    struct.pack_into(">i", wrong_count, 57, 4)  # recordCount 4, lastOffsetDelta 2
    assert codes(recrc(wrong_count)) == K.INVALID_RECORD
    both = bytearray(raw)
    struct.pack_into(">i", both, 57, 2)
    struct.pack_into(">i", both, 23, 1)  # consistent, but the records are 3
    assert codes(recrc(both)) == K.INVALID_RECORD
    assert codes(kbatch(1, producer_epoch=-5)) == K.INVALID_RECORD
    assert codes(kbatch(1, base_sequence=-7)) == K.INVALID_RECORD
    assert codes(kbatch(1, producer_id=-1, producer_epoch=-1, base_sequence=3)) == (
        K.INVALID_RECORD
    )


def test_negative_record_length_is_invalid() -> None:
    raw = bytearray(kbatch(1))
    raw[61] = 0x01  # zig-zag -1
    assert codes(recrc(raw)) == K.INVALID_RECORD


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 120), st.binary(min_size=1, max_size=4))
def test_garbage_is_refused_not_crashed(noise: bytes, at: int, patch: bytes) -> None:
    for raw in (noise, K.encode_kafka_batch([(None, noise)]), kbatch(3)):
        buf = bytearray(raw)
        buf[at : at + len(patch)] = patch
        for candidate in (bytes(buf), recrc(buf) if len(buf) > 21 else bytes(buf)):
            try:
                h = K.validate_kafka_batch(candidate)
            except K.KafkaBatchError:
                continue
            # accepted: then every reader must read it whole
            assert len(list(P.iter_records(candidate, h, 0))) == h.count


def test_byte_16_tells_the_formats_apart() -> None:
    ours = P.encode_batch([(None, b"x")], pid=3, generation=1, base_sequence=0, timestamp_ms=1)
    ctl = P.encode_control_batch(pid=3, generation=2, timestamp_ms=1)
    assert (ours[16], ctl[16]) == (0, P.FLAG_CONTROL)
    assert not P.is_kafka(P.validate_batch(ours))
    assert P.is_kafka(P.decode_batch_header(kbatch()))
    # our PRODUCE path refuses a Kafka batch, and any flag byte it does not know
    with pytest.raises(CorruptRecord, match="flags"):
        P.validate_batch(kbatch())
    odd = bytearray(ours)
    odd[16] = 4
    odd[12:16] = struct.pack(">I", __import__("zlib").crc32(bytes(odd[16:])))
    with pytest.raises(CorruptRecord, match="flags"):
        P.validate_batch(bytes(odd))


def test_iter_batches_over_a_mixed_buffer_stops_at_a_cut_kafka_header() -> None:
    ours = P.encode_batch([(b"a", b"1")], pid=3, generation=1, base_sequence=0, timestamp_ms=1)
    k = kbatch(2)
    mixed = ours + k + ours
    assert [P.is_kafka(h) for h, _ in P.iter_batches(mixed)] == [False, True, False]
    cut = ours + k[:55]  # more than our header's 49 bytes, less than Kafka's 61
    assert [h.count for h, _ in P.iter_batches(cut)] == [1]


def test_native_to_kafka_converts_ours_and_keeps_kafkas() -> None:
    ours = bytearray(
        P.encode_batch(
            [(b"a", b"1"), (None, b"22")], pid=3, generation=1, base_sequence=0, timestamp_ms=77
        )
    )
    ctl = bytearray(P.encode_control_batch(pid=3, generation=2, timestamp_ms=1))
    k = bytearray(kbatch(2))
    P.set_base_offset(ours, 0)
    P.set_base_offset(ctl, 2)
    P.set_base_offset(k, 3)
    out = K.native_to_kafka([bytes(ours + ctl), bytes(k)])
    batches = list(P.iter_batches(out))
    assert [(h.base_offset, h.count, P.is_kafka(h)) for h, _ in batches] == [
        (0, 2, True),
        (3, 2, True),
    ]
    first = out[: batches[0][0].size]
    hdr = K.validate_kafka_batch(first)  # a valid Kafka batch, CRC-32C and all
    assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in P.iter_records(first, hdr, 0)] == [
        (0, b"a", b"1", 77),
        (1, None, b"22", 77),
    ]
    assert out[batches[1][1] :] == bytes(k)  # Kafka's own batch: byte for byte


def test_verify_audits_kafka_streams_per_epoch_and_across_the_wrap() -> None:
    def records(*batches: bytes) -> list[P.Record]:
        out = []
        off = 0
        for raw in batches:
            buf = bytearray(raw)
            P.set_base_offset(buf, off)
            h = P.decode_batch_header(bytes(buf))
            out.extend(P.iter_records(bytes(buf), h, 0, "t", 0))
            off += h.count
        return out

    good = records(
        kbatch(2, producer_epoch=0, base_sequence=0),
        kbatch(3, producer_epoch=0, base_sequence=2),
        kbatch(2, producer_epoch=1, base_sequence=0),  # the client's epoch bump
    )
    assert audit("t", 1, "strict", lambda p: iter(good)).ok
    wrap = records(
        kbatch(2, producer_epoch=0, base_sequence=2**31 - 1),
        kbatch(1, producer_epoch=0, base_sequence=1),
    )
    assert audit("t", 1, "strict", lambda p: iter(wrap)).ok
    twice = records(
        kbatch(2, producer_epoch=0, base_sequence=0),
        kbatch(2, producer_epoch=0, base_sequence=0),
    )
    report = audit("t", 1, "strict", lambda p: iter(twice))
    assert not report.ok and report.total("duplicates") == 2


# --- the strided check of uniform records (kafka_batch._uniform_prefix) -------------------


def reference_ok(buf: bytes, count: int) -> bool:
    """The record rules of validate_kafka_batch written plainly, one varint at a time: the
    oracle the strided check must agree with."""
    end, p = len(buf), P.KAFKA_HEADER_SIZE
    try:
        for i in range(count):
            length, p = P.read_varint(buf, p)
            rec_end = p + length
            if length < 1 or rec_end > end:
                return False
            _, p = P.read_varint(buf, p + 1)  # attributes, then timestampDelta
            delta, p = P.read_varint(buf, p)
            if delta != i:
                return False
            for _ in range(2):  # key, value
                n, p = P.read_varint(buf, p)
                if n < -1:
                    return False
                p += max(n, 0)
            nheaders, p = P.read_varint(buf, p)
            if nheaders < 0:
                return False
            for _ in range(nheaders):
                hk, p = P.read_varint(buf, p)
                if hk < 0:
                    return False
                hv, p = P.read_varint(buf, p + hk)
                p += max(hv, 0)
            if p != rec_end:
                return False
    except (IndexError, CorruptRecord):
        return False
    return p == end


def uniform_batch(
    count: int,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[bytes, bytes | None]],
    ts_deltas: list[int],
) -> bytes:
    """``count`` records of one shape, timestampDelta per record (cycling ``ts_deltas``)."""
    body = b"".join(
        K.encode_record(i, key, value, ts_delta=ts_deltas[i % len(ts_deltas)], headers=headers)
        for i in range(count)
    )
    return K._assemble(
        body,
        count,
        base_offset=0,
        producer_id=9,
        producer_epoch=2,
        base_sequence=0,
        base_timestamp_ms=1_700_000_000_000,
        max_timestamp_ms=1_700_000_000_000,
    )


def accepted(buf: bytes) -> bool:
    try:
        K.validate_kafka_batch(buf)
    except K.KafkaBatchError:
        return False
    return True


def test_uniform_batches_take_the_strided_check_whole() -> None:
    # 100 records of 100 B as librdkafka sends them: both segments, [0, 64) and [64, 100)
    buf = uniform_batch(100, None, b"v" * 100, [], [0, 3, 1])
    assert K._uniform_prefix(buf, 100, len(buf)) == (100, len(buf))
    assert accepted(buf) and accepted(memoryview(buf))  # type: ignore[arg-type]
    # a two-byte timestampDelta changes the size: no strided attempt, the walk checks all
    late = uniform_batch(100, None, b"v" * 100, [], [0] * 70 + [100] * 30)
    assert K._uniform_prefix(late, 100, len(late))[0] == 0 and accepted(late)
    # from record 64 on values of 99 and 101 B by turns: the size fits, the second segment
    # is not uniform, so the walk takes over at record 64
    body = b"".join(
        K.encode_record(i, None, b"v" * (100 if i < 64 else 99 + 2 * (i % 2))) for i in range(100)
    )
    mixed = K._assemble(
        body,
        100,
        base_offset=0,
        producer_id=9,
        producer_epoch=2,
        base_sequence=0,
        base_timestamp_ms=0,
        max_timestamp_ms=0,
    )
    assert K._uniform_prefix(mixed, 100, len(mixed))[0] == 64 and accepted(mixed)


def test_batches_past_8192_records_take_three_byte_offset_deltas() -> None:
    # librdkafka's default 1 MB batches hold ~9,000 records of 100 B: all three widths
    n = 9000
    buf = uniform_batch(n, None, b"v" * 8, [], [1])
    assert K._uniform_prefix(buf, n, len(buf)) == (n, len(buf))
    assert accepted(buf) and reference_ok(buf, n)
    # record 8500's offsetDelta made 8501: same width, wrong index; refused
    at = buf.index(K.encode_varint(8500) + b"\x01\x10" + b"v" * 8)
    bad = bytearray(buf)
    bad[at : at + 3] = K.encode_varint(8501)
    assert codes(recrc(bad)) == K.INVALID_RECORD


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 140),
    st.one_of(st.none(), st.binary(max_size=12)),
    st.binary(max_size=150),
    st.lists(st.tuples(st.binary(max_size=4), st.none() | st.binary(max_size=4)), max_size=2),
    st.lists(st.integers(0, 70), min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
)
def test_strided_check_agrees_with_the_plain_rules(
    count: int,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[bytes, bytes | None]],
    ts_deltas: list[int],
    patches: list[tuple[int, int]],
) -> None:
    buf = bytearray(uniform_batch(count, key, value, headers, ts_deltas))
    body = len(buf) - P.KAFKA_HEADER_SIZE
    for at, byte in patches:
        buf[P.KAFKA_HEADER_SIZE + at % body] = byte
    raw = recrc(buf)
    assert accepted(raw) == reference_ok(raw, count)


def test_padded_offset_delta_in_the_first_record_is_not_a_template() -> None:
    # Record 0's offsetDelta padded to two bytes (0x80 0x00), the others' one byte followed
    # by a stray byte where record 0 has its padding: every varint byte the others share
    # with record 0 matches, sizes fit, but a reader would take the stray byte as the key
    # length. Refused: the offsetDelta compare covers record 0 as well.
    value = b"v" * 20

    def rec(od: bytes) -> bytes:
        body = b"\x00" + b"\x00" + od + b"\x01" + K.encode_varint(len(value)) + value + b"\x00"
        return K.encode_varint(len(body)) + body

    recs = [rec(b"\x80\x00")] + [rec(bytes([2 * i, 0x05])) for i in range(1, 20)]
    buf = K._assemble(
        b"".join(recs),
        20,
        base_offset=0,
        producer_id=9,
        producer_epoch=2,
        base_sequence=0,
        base_timestamp_ms=0,
        max_timestamp_ms=0,
    )
    assert K._sizes_fit(buf, 20, len(buf))  # so the strided check is tried
    assert not reference_ok(buf, 20)
    assert codes(buf) == K.INVALID_RECORD
