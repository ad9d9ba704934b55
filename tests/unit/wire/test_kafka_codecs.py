"""Compressed Kafka batches (gzip, snappy, lz4, zstd): validated by decompressing and
walking every record as for an uncompressed batch, bounded (a bomb is refused
MESSAGE_TOO_LARGE without expanding past the bound), stored as sent, read back by the one
decode every reader uses (``protocol.iter_records``: Reader, verify, the Spark source), and
Kafka's idempotence rules hold for them (sequences come from the header)."""

from __future__ import annotations

import asyncio
import gzip
import struct
import sys
import zlib
from pathlib import Path

import cramjam
import lz4.frame
import pytest
import zstandard
from aiokafka import codec as aiocodec
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.kafka_partition import kafka_fetch
from partition_server.testing import log_batches, open_part
from pidlease.cli.verify import audit
from pidlease.errors import CorruptRecord
from pidlease.wire import kafka_batch as K
from pidlease.wire import kafka_codecs as KC
from pidlease.wire import protocol as P
from tests.unit.server.test_kafka_partition import close, produce

CODECS = [KC.GZIP, KC.SNAPPY, KC.LZ4, KC.ZSTD]
RECORDS = [(b"k%d" % i, b"value-%d-" % i + b"x" * (i % 7)) for i in range(40)]


def cbatch(
    codec: int, records: list[tuple[bytes | None, bytes | None]] = RECORDS, **kw: int
) -> bytes:
    return K.encode_kafka_batch(records, compression=codec, base_timestamp_ms=5, **kw)  # type: ignore[arg-type]


def refusal(raw: bytes, **kw: int) -> tuple[int, str]:
    with pytest.raises(K.KafkaBatchError) as info:
        K.validate_kafka_batch(raw, **kw)
    return info.value.kafka_code, str(info.value)


def with_body(codec: int, body: bytes, count: int) -> bytes:
    """A batch of ``count`` records whose (compressed) body is ``body``, CRC right."""
    head = bytearray(K.encode_kafka_batch([(None, b"v")] * count)[: P.KAFKA_HEADER_SIZE])
    struct.pack_into(">i", head, 8, P.KAFKA_HEADER_SIZE - 12 + len(body))
    struct.pack_into(">h", head, 21, codec)
    raw = bytearray(head + body)
    struct.pack_into(">I", raw, 17, P.kafka_crc(bytes(raw), P.KAFKA_CRC_START, len(raw)))
    return bytes(raw)


def records_of(raw: bytes) -> list[tuple[bytes | None, bytes]]:
    h = P.decode_batch_header(raw)
    return [(r.key, r.value) for r in P.iter_records(raw, h, 0, "t", 0)]


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_is_taken_stored_as_sent_and_read_back(codec: int) -> None:
    raw = cbatch(codec, producer_id=9, producer_epoch=0, base_sequence=0)
    assert len(raw) < len(cbatch(0))  # really compressed
    h = K.validate_kafka_batch(raw)
    assert (h.count, h.pid, h.base_sequence) == (40, 9, 0)
    assert struct.unpack_from(">h", raw, 21)[0] & 7 == codec
    assert records_of(raw) == [(k, v) for k, v in RECORDS]


def test_the_encodings_real_producers_write() -> None:
    """aiokafka's own encoders (snappy in xerial framing, lz4 frames, gzip, zstd) and
    gzip with several members: every form decodes."""
    body = b"".join(K.encode_record(i, k, v) for i, (k, v) in enumerate(RECORDS))
    forms = [
        (KC.GZIP, aiocodec.gzip_encode(body)),
        (KC.GZIP, gzip.compress(body[:100]) + gzip.compress(body[100:])),
        (KC.SNAPPY, aiocodec.snappy_encode(body)),  # xerial
        (KC.SNAPPY, aiocodec.snappy_encode(body, xerial_blocksize=64)),  # many blocks
        (KC.SNAPPY, bytes(cramjam.snappy.compress_raw(body))),
        (KC.LZ4, aiocodec.lz4_encode(body)),
        (KC.LZ4, lz4.frame.compress(body[:50]) + lz4.frame.compress(body[50:])),
        (KC.ZSTD, aiocodec.zstd_encode(body)),
    ]
    for codec, z in forms:
        raw = with_body(codec, z, len(RECORDS))
        K.validate_kafka_batch(raw)
        assert records_of(raw) == [(k, v) for k, v in RECORDS], codec


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_is_refused_message_too_large(codec: int) -> None:
    zeros = [(None, b"\0" * 60_000)] * 20  # 1.2 MB of records in a few KB
    raw = cbatch(codec, zeros)
    assert len(raw) < 100_000
    code, why = refusal(raw, max_decompressed=1_000_000)
    assert code == K.MESSAGE_TOO_LARGE
    assert "more than 1000000 bytes" in why
    K.validate_kafka_batch(raw, max_decompressed=2_000_000)  # under the bound: taken


def test_a_bomb_past_the_default_bound_stops_at_the_bound() -> None:
    """200 MB of zeros in a ~6 KB zstd frame and a ~200 KB gzip stream: refused at the
    64 MiB default, not expanded to 200 MB."""
    for codec, z in [
        (KC.ZSTD, zstandard.ZstdCompressor(level=3).compress(b"\0" * (200 << 20))),
        (KC.GZIP, zlib.compress(b"\0" * (200 << 20), 1, wbits=31)),
    ]:
        code, _ = refusal(with_body(codec, z, 1))
        assert code == K.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("codec", CODECS)
def test_damaged_compressed_data_is_corrupt_message(codec: int) -> None:
    body = b"".join(K.encode_record(i, k, v) for i, (k, v) in enumerate(RECORDS))
    z = KC.compress(codec, body)
    for bad in (z[: len(z) // 2], b"\x07" * 8 + z, b""):
        code, _ = refusal(with_body(codec, bad, len(RECORDS)))
        assert code == K.CORRUPT_MESSAGE, (codec, bad[:10])


@pytest.mark.parametrize("codec", CODECS)
def test_records_inside_are_checked_as_uncompressed_ones_are(codec: int) -> None:
    good = [K.encode_record(i, k, v) for i, (k, v) in enumerate(RECORDS)]
    wrong_delta = [*good[:3], K.encode_record(7, b"k", b"v"), *good[4:]]
    assert refusal(with_body(codec, KC.compress(codec, b"".join(wrong_delta)), 40))[0] == (
        K.INVALID_RECORD
    )
    # recordCount says 41, the compressed records are 40
    assert refusal(with_body(codec, KC.compress(codec, b"".join(good)), 41))[0] == (
        K.INVALID_RECORD
    )
    trailing = KC.compress(codec, b"".join(good) + b"\x00")
    assert refusal(with_body(codec, trailing, 40))[0] == K.INVALID_RECORD


def test_codecs_kafka_does_not_have_are_refused_unsupported() -> None:
    for codec in (5, 6, 7):
        raw = with_body(codec, b"".join(K.encode_record(0, None, b"v") for _ in range(1)), 1)
        code, why = refusal(raw)
        assert code == K.UNSUPPORTED_COMPRESSION_TYPE
        assert f"codec {codec}" in why


def test_a_codec_whose_package_is_missing_is_refused_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = cbatch(KC.ZSTD)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails
    code, why = refusal(raw)
    assert code == K.UNSUPPORTED_COMPRESSION_TYPE
    assert "zstandard" in why
    with pytest.raises(CorruptRecord, match="zstandard"):
        records_of(raw)  # readers say so too, never yield nothing


@settings(max_examples=150, deadline=None)
@given(
    codec=st.sampled_from([*CODECS, 5]),
    body=st.binary(max_size=300),
    count=st.integers(1, 5),
    prefix=st.sampled_from([b"", b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01", b"\x1f\x8b"]),
)
def test_garbage_compressed_bodies_are_refused_never_crash(
    codec: int, body: bytes, count: int, prefix: bytes
) -> None:
    raw = with_body(codec, prefix + body, count)
    code = K.NONE
    try:
        K.validate_kafka_batch(raw, max_decompressed=1 << 16)
    except K.KafkaBatchError as exc:
        code = exc.kafka_code
    assert code in (
        K.NONE,
        K.CORRUPT_MESSAGE,
        K.INVALID_RECORD,
        K.MESSAGE_TOO_LARGE,
        K.UNSUPPORTED_COMPRESSION_TYPE,
    )
    if code == K.NONE:
        assert len(records_of(raw)) == count  # whatever is taken reads back


def test_idempotence_and_readers_over_compressed_batches(tmp_path: Path) -> None:
    """Through a real partition: sequences from the header, a retry of a compressed batch
    answered with its first offsets, an out-of-order one refused; the log holds the bytes as
    sent; Reader's decode, verify and a Kafka consumer's fetch all see the records."""

    def kb(codec: int, seq: int, epoch: int = 0) -> bytes:
        recs = [(b"k", b"c%d-s%d-%d" % (codec, seq, i)) for i in range(3)]
        return cbatch(codec, recs, producer_id=77, producer_epoch=epoch, base_sequence=seq)

    async def go() -> None:
        part = open_part(tmp_path, hw=None)
        sent = [kb(KC.GZIP, 0), kb(KC.SNAPPY, 3), kb(KC.LZ4, 6), kb(KC.ZSTD, 9), kb(0, 12)]
        offsets = [(await produce(part, raw)).base_offset for raw in sent]
        assert offsets == [0, 3, 6, 9, 12]
        retry = await produce(part, kb(KC.LZ4, 6))
        assert (retry.error_code, retry.base_offset) == (K.NONE, 6)
        assert (await produce(part, kb(KC.ZSTD, 20))).error_code == (K.OUT_OF_ORDER_SEQUENCE_NUMBER)
        bumped = await produce(part, kb(KC.GZIP, 0, epoch=1))
        assert (bumped.error_code, bumped.base_offset) == (K.NONE, 15)
        stored = log_batches(tmp_path, "t", 0)
        assert [bytes(b[12:]) for b in stored[:5]] == [raw[12:] for raw in sent]  # as sent
        assert [struct.unpack_from(">h", b, 21)[0] & 7 for b in stored] == [1, 2, 3, 4, 0, 1]
        data = b"".join(part.fetch(0, 1 << 20))
        recs = [r for h, pos in P.iter_batches(data) for r in P.iter_records(data, h, pos)]
        assert [r.offset for r in recs] == list(range(18))
        assert [r.sequence_id for r in recs[:15]] == list(range(15))
        assert recs[4].value == b"c2-s3-1"
        report = audit("t", 1, "strict", lambda p: iter(recs))
        assert report.ok, report
        fetched = kafka_fetch(part, 0, 1 << 20)
        assert fetched.records == b"".join(bytes(b) for b in stored)
        await close(part)

    asyncio.run(go())
