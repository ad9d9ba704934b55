"""Bad input on the Kafka port of a real partition server: every malformed request gets the
right Kafka error (in its version's response shape) or a closed connection, the server
keeps serving, and not one byte of the log changes. Fuzzed like the native port."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from partition_server.kafka import codec as C
from pidlease.wire import kafka_batch as K
from pidlease.wire import kafka_codecs as KC
from tests.kafka_wire import KafkaWire, fetch_values, produce_values, record_batch

ENV = {
    "PIDLEASE_FRAME_BYTES_MAX": str(256 * 1024),
    "PIDLEASE_BATCH_BYTES_MAX": str(64 * 1024),
    # A fuzzed Fetch may ask for a long wait; the fuzz loop waits for each answer.
    "PIDLEASE_KAFKA_FETCH_WAIT_MAX_MS": "2000",
}
TOPIC = "bad"


def log_bytes(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*.log"))}


@pytest.fixture(scope="module")
def cluster(make_module_cluster):  # type: ignore[no-untyped-def]
    c = make_module_cluster(servers=1, env=ENV)
    c.create_topic(TOPIC, partitions=1)
    with KafkaWire(c.servers[0].kafka_address) as w:
        r = w.request(C.PRODUCE, 9, produce_values(TOPIC, 0, record_batch([b"a", b"b", b"c"])))
        assert r.responses[0].partition_responses[0].error_code == 0
    return c


@pytest.fixture
def unchanged(cluster):  # type: ignore[no-untyped-def]
    """The log before and after the test must be equal, and the server must still serve."""
    data = cluster.data_dir / "server-1" / "data"
    before = log_bytes(data)
    yield cluster
    assert cluster.servers[0].alive, cluster.logs(40)
    with KafkaWire(cluster.servers[0].kafka_address) as w:
        r = w.request(C.FETCH, 4, fetch_values(TOPIC, 0, 0))
        part = r.responses[0].partitions[0]
        assert part.error_code == 0 and part.high_watermark == 3
    assert log_bytes(data) == before


def bad_crc(batch: bytes) -> bytes:
    b = bytearray(batch)
    b[-1] ^= 0x01
    return bytes(b)


def with_attributes(batch: bytes, attrs: int) -> bytes:
    import crc32c

    b = bytearray(batch)
    struct.pack_into(">h", b, 21, attrs)
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


def with_count(batch: bytes, count: int) -> bytes:
    import crc32c

    b = bytearray(batch)
    struct.pack_into(">i", b, 57, count)
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


def with_magic(batch: bytes, magic: int) -> bytes:
    b = bytearray(batch)
    b[16] = magic
    return bytes(b)


GOOD = record_batch([b"x", b"y"])
# 80 MiB of zeros in a few KB of zstd: past the 64 MiB bound on decompressed records
ZSTD_BOMB = K.encode_kafka_batch([(None, b"\0" * (80 << 20))], compression=KC.ZSTD)


@pytest.mark.parametrize(
    ("name", "batch", "codes"),
    [
        ("wrong CRC", bad_crc(GOOD), {2}),
        ("magic 1", with_magic(GOOD, 1), {2, 43}),
        # flagged gzip, the records are not: they do not decompress
        ("gzip flag, plain records", with_attributes(GOOD, 1), {2}),
        ("codec 5: not Kafka's", with_attributes(GOOD, 5), {76}),
        ("a zstd bomb", ZSTD_BOMB, {10}),
        ("transactional", with_attributes(GOOD, 0x10), {87}),
        ("control", with_attributes(GOOD, 0x20), {87}),
        ("count over the records", with_count(GOOD, 3), {2, 87}),
        ("truncated batch", GOOD[:-3], {2, 87}),
        ("two batches", GOOD + GOOD, {2, 87}),
        ("empty", b"", {2, 87}),
        ("too large", record_batch([b"z" * (70 * 1024)]), {10}),
    ],
)
def test_bad_batches_are_refused_with_kafka_codes(
    unchanged, name: str, batch: bytes, codes: set[int]
) -> None:  # type: ignore[no-untyped-def]
    with KafkaWire(unchanged.servers[0].kafka_address) as w:
        r = w.request(C.PRODUCE, 9, produce_values(TOPIC, 0, batch))
        p = r.responses[0].partition_responses[0]
        assert int(p.error_code) in codes, (name, p)
        # The connection still serves.
        assert w.request(C.API_VERSIONS, 3, {}).error_code == 0


def test_unsupported_versions_answered_in_their_own_shape(unchanged) -> None:  # type: ignore[no-untyped-def]
    with KafkaWire(unchanged.servers[0].kafka_address) as w:
        # ApiVersions too new: a v0 answer with the error and our list (KIP-511).
        frame = bytearray(w.frame(C.API_VERSIONS, 3, {}))
        struct.pack_into(">h", frame, 6, 77)  # version 77
        w.send_raw(bytes(frame))
        r = w.read_response(C.API_VERSIONS, 0)
        assert int(r.error_code) == 35 and any(k.api_key == C.PRODUCE for k in r.api_keys)
        # Produce v10 (kio knows it, we do not advertise it): UNSUPPORTED_VERSION per partition.
        r10 = w.request(C.PRODUCE, 10, produce_values(TOPIC, 0, GOOD))
        assert int(r10.responses[0].partition_responses[0].error_code) == 35
        # Fetch v13 (topic ids): the top-level error.
        r13 = w.request(
            C.FETCH, 13, {"max_wait": __import__("datetime").timedelta(0), "topics": []}
        )
        assert int(r13.error_code) == 35
        assert w.request(C.API_VERSIONS, 2, {}).error_code == 0  # still serving


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("unknown API key", struct.pack(">ihhih", 10, 9999, 0, 1, -1)),
        ("unknown version", struct.pack(">ihhih", 10, C.PRODUCE, 99, 1, -1)),
        ("Produce v2 (message sets)", struct.pack(">ihhih", 10, C.PRODUCE, 2, 1, -1)),
        ("huge size", struct.pack(">i", 2**31 - 1) + b"\0" * 16),
        ("negative size", struct.pack(">I", 0xFFFFFFFF) + b"\0" * 16),
        ("header shorter than 8 bytes", struct.pack(">i", 3) + b"\0\0\0"),
        ("body garbage", struct.pack(">ihhih", 14, C.METADATA, 12, 1, -1) + b"\x7f" * 4),
        ("client id past the end", struct.pack(">ihhih", 10, C.METADATA, 1, 1, 300)),
    ],
)
def test_garbage_closes_the_connection(unchanged, name: str, data: bytes) -> None:  # type: ignore[no-untyped-def]
    with KafkaWire(unchanged.servers[0].kafka_address) as w:
        w.send_raw(data)
        assert w.closed_by_peer(), name


def test_truncated_frame_then_close(unchanged) -> None:  # type: ignore[no-untyped-def]
    with KafkaWire(unchanged.servers[0].kafka_address) as w:
        frame = w.frame(C.PRODUCE, 9, produce_values(TOPIC, 0, GOOD))
        w.send_raw(frame[: len(frame) // 2])
    # A connection that stops mid-frame wrote nothing (the fixture checks the log).


def test_fuzzed_requests(unchanged) -> None:  # type: ignore[no-untyped-def]
    """Random corruptions of a Produce whose batch has a wrong CRC (so no mutation can
    make a valid append), of Metadata and of Fetch: each gets an answer or a closed
    connection, never a dead server or a changed log."""
    rng = random.Random(1414)
    addr = unchanged.servers[0].kafka_address
    with KafkaWire(addr) as w:
        seeds = [
            w.frame(C.PRODUCE, 9, produce_values(TOPIC, 0, bad_crc(GOOD))),
            w.frame(C.PRODUCE, 3, produce_values(TOPIC, 0, bad_crc(GOOD))),
            w.frame(C.METADATA, 12, {"topics": [{"name": TOPIC}]}),
            w.frame(C.FETCH, 11, fetch_values(TOPIC, 0, 0)),
        ]
    for i in range(200):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(4, len(data))
            data[at] = rng.randrange(256)
        if rng.random() < 0.2:
            data = data[: rng.randrange(4, len(data))]
        with KafkaWire(addr, timeout_s=10) as w:
            w.send_raw(bytes(data))
            w.sock.shutdown(1)  # no more requests: the server answers or closes, then EOF
            assert w.closed_by_peer(15), f"case {i}: the connection neither answered nor closed"
