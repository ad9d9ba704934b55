"""The kio adapter of the Kafka listener (partition_server/kafka/codec.py): every advertised
API version round-trips through our header parse and body decode, responses built from
dicts decode back with kio's own reader, header versions are right (ApiVersions always v0),
and malformed bytes raise CodecError rather than anything else."""

from __future__ import annotations

import datetime as dt
import io
import struct
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from partition_server.kafka import codec as C
from partition_server.kafka.sasl import SaslConfigError, load_principals, parse_plain

ALL_VERSIONS = [(k, v) for k, (lo, hi) in sorted(C.SUPPORTED.items()) for v in range(lo, hi + 1)]


def frame_of(
    api_key: int, version: int, corr: int, body: Any, client_id: str | None = "t"
) -> bytes:
    """A request as a client sends it, without the size prefix: header v1 (v2 with the
    empty tagged-field section for flexible versions) + body."""
    cid = (
        b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id.encode()
    )
    head = struct.pack(">hhi", api_key, version, corr) + cid
    if type(body).__flexible__:
        head += b"\0"
    out = io.BytesIO()
    entity_writer(type(body))(out, body)
    return head + out.getvalue()


def sample_request(api_key: int, version: int) -> Any:
    """A request of this version with something in every array, built by ``build``."""
    topic = {
        "name": "orders",
        "topic": "orders",
        "partition_data": [{"index": 2, "records": b"\x01\x02"}],
        "partitions": [
            {
                "partition": 2,
                "partition_index": 2,
                "fetch_offset": 7,
                "partition_max_bytes": 100,
                "timestamp": -2,
            }
        ],
        "num_partitions": 3,
        "replication_factor": 1,
    }
    values = {
        "acks": -1,
        "timeout": dt.timedelta(seconds=30),
        "topic_data": [topic],
        "topics": [topic],
        "max_wait": dt.timedelta(milliseconds=500),
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "replica_id": -1,
        "mechanism": "PLAIN",
        "auth_bytes": b"\0u\0p",
        "transaction_timeout": dt.timedelta(seconds=60),
        "producer_id": -1,
        "producer_epoch": -1,
        "client_software_name": "x",
        "client_software_version": "1",
    }
    return C.build(C.request_type(api_key, version), values)


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS)
def test_request_round_trip(api_key: int, version: int) -> None:
    req = sample_request(api_key, version)
    frame = frame_of(api_key, version, 4242, req)
    h = C.parse_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (
        api_key,
        version,
        4242,
        "t",
    )
    assert C.decode_request(frame, h) == req


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS)
def test_response_round_trip(api_key: int, version: int) -> None:
    cls = C.response_type(api_key, version)
    values = {
        "error_code": 35,
        "throttle_time": dt.timedelta(0),
        "responses": [],
        "topics": [{"name": "orders", "error_code": 3}],
    }
    data = C.respond(api_key, version, 99, values)
    (size, corr) = struct.unpack_from(">ii", data)
    assert size == len(data) - 4 and corr == 99
    # Response header v1 (one tagged-field byte) for flexible versions, except ApiVersions.
    at = 8 + (1 if cls.__flexible__ and api_key != C.API_VERSIONS else 0)
    obj, n = entity_reader(cls)(data, at)
    assert at + n == len(data)
    assert obj == C.build(cls, values)
    if hasattr(obj, "error_code"):
        assert obj.error_code == ErrorCode.unsupported_version


def test_api_versions_v3_answers_with_a_v0_header() -> None:
    data = C.respond(C.API_VERSIONS, 3, 5, {"error_code": 0, "api_keys": []})
    # corr, then the body's error code directly: no tagged-field byte between them.
    assert data[4:8] == struct.pack(">i", 5) and data[8:10] == b"\0\0"


def test_build_drops_fields_a_version_lacks_and_fills_defaults() -> None:
    old = C.build(
        C.response_type(C.PRODUCE, 3),
        {
            "responses": [
                {
                    "name": "t",
                    "partition_responses": [
                        {
                            "index": 0,
                            "error_code": 0,
                            "base_offset": 5,
                            "log_start_offset": 1,
                            "error_message": "x",
                        }
                    ],
                }
            ]
        },
    )
    p = old.responses[0].partition_responses[0]
    assert p.base_offset == 5 and not hasattr(p, "log_start_offset")
    new = C.build(
        C.response_type(C.PRODUCE, 9),
        {
            "responses": [
                {
                    "name": "t",
                    "partition_responses": [{"index": 0, "error_code": 47, "base_offset": -1}],
                }
            ]
        },
    )
    q = new.responses[0].partition_responses[0]
    assert q.error_code == ErrorCode.invalid_producer_epoch and q.record_errors == ()


def test_client_id_null_and_tagged_header_fields() -> None:
    req = sample_request(C.METADATA, 12)
    frame = bytearray(frame_of(C.METADATA, 12, 1, req, client_id=None))
    h = C.parse_header(bytes(frame))
    assert h.client_id is None
    # One tagged field (tag 3, 2 bytes) in the header: skipped, the body still decodes.
    at = 8 + 2
    tagged = bytes([1, 3, 2, 0xAA, 0xBB])
    frame[at : at + 1] = tagged
    h2 = C.parse_header(bytes(frame))
    assert h2.body_at == at + len(tagged)
    assert C.decode_request(bytes(frame), h2) == req


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03\x00",  # shorter than api key + version + corr
        struct.pack(">hhi", 3, 12, 1),  # no client id
        struct.pack(">hhih", 3, 12, 1, 40) + b"abc",  # client id runs past the end
        struct.pack(">hhih", 3, 12, 1, 1) + b"a" + b"\x05\x81",  # tagged fields truncated
        struct.pack(">hhih", 3, 12, 1, 1) + b"a" + b"\xff\xff\xff\xff\xff\x01",  # varint too long
    ],
)
def test_bad_headers_raise_codec_error(frame: bytes) -> None:
    with pytest.raises(C.CodecError):
        C.parse_header(frame)


@pytest.mark.parametrize(
    ("api_key", "version"), [(0, 3), (0, 9), (1, 4), (1, 12), (3, 12), (19, 5)]
)
def test_truncated_or_garbage_bodies_raise_codec_error(api_key: int, version: int) -> None:
    frame = frame_of(api_key, version, 1, sample_request(api_key, version))
    h = C.parse_header(frame)
    for cut in range(h.body_at, len(frame) - 1):
        with pytest.raises(C.CodecError):
            C.decode_request(frame[:cut], h)
    garbage = frame[: h.body_at] + b"\x7f" * 40  # lengths that run past the end
    with pytest.raises(C.CodecError):
        C.decode_request(garbage, h)


def test_supported_is_within_what_kio_knows() -> None:
    for k, (lo, hi) in C.SUPPORTED.items():
        for v in range(lo, hi + 1):
            assert C.known_shape(k, v), (k, v)
    assert not C.supported(C.PRODUCE, 2) and not C.supported(C.FETCH, 13)
    assert not C.known_shape(9999, 0) and not C.known_shape(C.PRODUCE, 99)


def test_sasl_plain_parse_and_principals(tmp_path: Any) -> None:
    assert parse_plain(b"\0alice\0s3cret-token") == ("alice", "s3cret-token")
    assert parse_plain(b"alice\0alice\0pw") == ("alice", "pw")
    assert parse_plain(b"bob\0alice\0pw") is None  # acting as somebody else
    assert parse_plain(b"alice\0pw") is None
    assert parse_plain(b"\0\0pw") == ("", "pw")  # the token alone names the principal
    assert parse_plain(b"bob\0\0pw") is None
    f = tmp_path / "tokens"
    f.write_text("# comment\nbob:producer:bob-token-1 # trailing\n\n")
    p = load_principals("legacy-token", "alice:admin:alice-token", str(f))
    assert p.required
    assert p.check("alice", "alice-token") == "admin"
    assert p.check("bob", "bob-token-1") == "producer"
    assert p.check("admin", "legacy-token") == "admin"
    assert p.check("alice", "bob-token-1") is None  # another's token
    assert p.check("carol", "alice-token") is None
    # an empty user: the principal whose token it is (as a Bearer token at the coordinator)
    assert p.identify("", "bob-token-1") == ("bob", "producer")
    assert p.identify("", "legacy-token") == ("admin", "admin")
    assert p.identify("", "nobody's-token") is None and p.check("", "x") is None
    shared = load_principals("", "a:admin:same,b:producer:same", "")
    assert shared.identify("", "same") is None  # ambiguous: neither
    assert shared.identify("b", "same") == ("b", "producer")
    assert not load_principals("", "", "").required
    with pytest.raises(SaslConfigError):
        load_principals("", "alice:root:tok", "")
    with pytest.raises(SaslConfigError):
        load_principals("", "alice:admin", "")
