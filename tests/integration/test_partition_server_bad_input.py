"""Bad input over a real socket: every malformed or oversized request gets a clear error
code (with its correlation id when readable), the server keeps serving, and not one byte
of the log changes."""

from __future__ import annotations

import random
import socket
import struct
import zlib
from pathlib import Path

import pytest

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire import protocol as P

FRAME_MAX = 64 * 1024
BATCH_MAX = 16 * 1024
ENV = {
    "PIDLEASE_FSYNC_INTERVAL_MS": "1",
    "PIDLEASE_FRAME_BYTES_MAX": str(FRAME_MAX),
    "PIDLEASE_BATCH_BYTES_MAX": str(BATCH_MAX),
}
CORRUPT, TOO_LARGE = errors.CorruptRecord.code, errors.RecordTooLarge.code
INVALID = errors.InvalidRequest.code


def log_bytes(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*.log"))}


def recrc(b: bytearray) -> bytearray:
    struct.pack_into(">I", b, 12, zlib.crc32(bytes(b[16:])))
    return b


def produce_frame(
    corr: int, batch_bytes: bytes, topic: str = "bad", partition: int = 0, tok: str = ""
) -> bytes:
    return P.produce_request(corr, topic, partition, tok, batch_bytes)


def cases() -> list[tuple[str, bytes, int]]:
    good = bytearray(batch(0, 0, 0, [b"x", b"y"]))
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    count_up = bytearray(good)
    struct.pack_into(">I", count_up, 37, 3)
    count_zero = bytearray(good)
    struct.pack_into(">I", count_zero, 37, 0)
    big_gen = bytearray(good)
    struct.pack_into(">I", big_gen, 25, 2**31)
    neg_seq = bytearray(batch(0, 0, 0, [b"x"]))
    struct.pack_into(">q", neg_seq, 29, -5)
    control = P.encode_control_batch(pid=0, generation=0, timestamp_ms=1)
    huge = batch(0, 0, 0, [b"z" * (BATCH_MAX + 10)])
    short_len = bytearray(good)
    struct.pack_into(">I", short_len, 8, 10)
    fetch = P.fetch_request(20, "bad", 0, 0, 100)
    return [
        ("bad checksum", produce_frame(1, bytes(bad_crc)), CORRUPT),
        ("count larger than records", produce_frame(2, bytes(recrc(count_up))), CORRUPT),
        ("count zero", produce_frame(3, bytes(recrc(count_zero))), CORRUPT),
        ("generation over 2**31-1", produce_frame(4, bytes(recrc(big_gen))), CORRUPT),
        ("negative sequence", produce_frame(5, bytes(recrc(neg_seq))), CORRUPT),
        ("batch_len shorter than header", produce_frame(6, bytes(short_len)), CORRUPT),
        ("trailing bytes after batch", produce_frame(7, bytes(good) + b"\0\0"), CORRUPT),
        ("half a batch", produce_frame(8, bytes(good[:30])), CORRUPT),
        ("empty batch", produce_frame(9, b""), CORRUPT),
        ("control batch from a producer", produce_frame(10, control), INVALID),
        ("batch over batch_bytes_max", produce_frame(11, huge), TOO_LARGE),
        ("unknown api key", P.request(99, 12, b"\0\0"), CORRUPT),
        ("topic string runs past the frame", P.request(P.PRODUCE, 13, b"\0\xff" + b"a"), CORRUPT),
        ("topic not utf-8", P.request(P.FETCH, 14, b"\0\2\xff\xfe" + bytes(16)), CORRUPT),
        ("extra bytes after fetch", fetch[: 4 - 4] + P.frame(fetch[4:] + b"\1"), CORRUPT),
        ("negative fetch offset", P.fetch_request(16, "bad", 0, -1, 100), INVALID),
        (
            "fence of pid 0",
            P.fence_request(17, "bad", 0, 0, 1, "x", create_if_absent=True),
            INVALID,
        ),
        (
            "unknown partition",
            produce_frame(18, bytes(good), partition=7),
            errors.UnknownTopicOrPartition.code,
        ),
        (
            "unknown topic",
            P.producer_state_request(19, "nope", 0, 1),
            errors.UnknownTopicOrPartition.code,
        ),
        ("list_offsets timestamp below -2", P.list_offsets_request(21, "bad", 0, -3), INVALID),
        ("list_offsets cut short", P.frame(P.list_offsets_request(22, "bad", 0, 5)[4:-1]), CORRUPT),
        (
            "list_offsets of an unknown topic",
            P.list_offsets_request(23, "nope", 0, -2),
            errors.UnknownTopicOrPartition.code,
        ),
    ]


@pytest.fixture
def server(make_cluster, zk_hosts):  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    create_topic(zk_hosts, "bad")
    svc = cluster.servers[0]
    with WireClient(svc.address) as c:  # something in the log to protect
        assert (
            c.produce("bad", 0, batch(5, 1, 0, [b"keep"]), token(DEV_SECRET, 5, 1)).error_code == 0
        )
    return cluster, svc, cluster.data_dir / "server-1" / "data"


def test_each_bad_request_gets_its_error_and_changes_nothing(server) -> None:
    cluster, svc, data = server
    before = log_bytes(data)
    with WireClient(svc.address) as c:
        for name, frame_bytes, code in cases():
            corr = P._REQ_HEAD.unpack_from(frame_bytes, 4)[1]
            api = frame_bytes[4]
            c.send_raw(frame_bytes)
            if api in P.API_NAMES:
                r = c.recv(api)
                got, detail = (r.correlation_id, r.error_code), r.detail
            else:  # an unknown api has no payload shape: header only
                cur = P.Cursor(c.recv_body())
                got, detail = cur.take(struct.Struct(">IH")), cur.str()
            assert got == (corr, code), (name, detail)
            assert detail, name
        # the same connection still serves
        assert c.metadata()["server_id"] == 1
    assert log_bytes(data) == before
    assert cluster.servers[0].alive
    assert "Traceback" not in svc.log_path.read_text()


def test_frame_too_short_for_a_header_gets_correlation_id_zero(server) -> None:
    _, svc, data = server
    before = log_bytes(data)
    with WireClient(svc.address) as c:
        c.send_raw(P.frame(b"\x01\x00"))
        body = c.recv_body()
        corr, code = struct.unpack_from(">IH", body)
        assert (corr, code) == (0, CORRUPT)
        assert c.metadata()["server_id"] == 1
    assert log_bytes(data) == before


def test_oversized_frame_is_refused_and_the_connection_closed(server) -> None:
    _, svc, data = server
    before = log_bytes(data)
    with WireClient(svc.address) as c:
        c.send_raw(struct.pack(">IBI", FRAME_MAX + 1, P.PRODUCE, 77) + b"x" * 100)
        r = c.recv(P.PRODUCE)
        assert (r.correlation_id, r.error_code) == (77, TOO_LARGE)
        with pytest.raises((ConnectionError, OSError)):  # noqa: PT012 - a bounded read loop
            for _ in range(3):  # the server closed; the next read sees EOF
                c.metadata()
    with WireClient(svc.address) as c:
        assert c.metadata()["server_id"] == 1
    assert log_bytes(data) == before


def test_garbage_and_dropped_connections_do_not_hurt(server) -> None:
    cluster, svc, data = server
    before = log_bytes(data)
    rng = random.Random(1234)
    host, port = svc.address.split(":")
    for i in range(40):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            if i % 4 == 0:  # half a frame, then hang up
                s.sendall(struct.pack(">I", 1000) + rng.randbytes(rng.randint(0, 999)))
                continue
            body = bytes([rng.choice([1, 2, 3, 4, 5, 42])]) + rng.randbytes(rng.randint(0, 300))
            s.sendall(P.frame(body))
            head = s.recv(4)
            assert len(head) == 4  # an answer, not a crash
    with WireClient(svc.address) as c:
        assert c.metadata()["server_id"] == 1
        assert [r.value for r in c.read_all("bad", 0)] == [b"keep"]
    assert log_bytes(data) == before
    assert cluster.servers[0].alive
    assert "Traceback" not in svc.log_path.read_text()  # no internal error on any of it
