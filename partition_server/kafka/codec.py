"""The one adapter over ``kio`` (Kafka's message schemas as Python types): request header
parse, request body decode, response encode, and the table of what this listener speaks.

Everything Kafka-shaped the listener reads or writes goes through here, so a change of
codec package touches one module. kio decodes with a native reader; responses are built
from plain dicts by ``build``, which keeps only the fields the response's version has
(one handler serves every version of an API) and fills the rest from kio's defaults or
zero values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import io
import struct
import typing
import uuid
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from pidlease.wire.kafka_conn import entity_fields, nested_entity

# API keys we speak (Kafka's numbering).
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
API_VERSIONS = 18
CREATE_TOPICS = 19
INIT_PRODUCER_ID = 22
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
# Consumer groups (kafka/groups.py)
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42
OFFSET_DELETE = 47
# the admin APIs: admin.py
DELETE_TOPICS = 20
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
CREATE_PARTITIONS = 37
INCREMENTAL_ALTER_CONFIGS = 44

# Advertised exactly: what the handlers implement and the clients in docs/kafka.md were
# tested with. Produce >= 3 and Fetch >= 4 are RecordBatch v2 (librdkafka needs them for
# idempotence); the upper ends stop before topic ids (Produce 13, Fetch 13, Metadata 13).
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 6),  # v7 adds max-timestamp (-3), not implemented
    METADATA: (1, 12),
    SASL_HANDSHAKE: (0, 1),
    API_VERSIONS: (0, 3),
    CREATE_TOPICS: (2, 5),
    INIT_PRODUCER_ID: (0, 4),
    SASL_AUTHENTICATE: (0, 2),
    # admin (admin.py): DeleteTopics from v1 (kio's oldest), v6 names topics by id or name
    DELETE_TOPICS: (1, 6),
    DESCRIBE_CONFIGS: (1, 4),
    ALTER_CONFIGS: (0, 2),
    CREATE_PARTITIONS: (0, 3),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
}
# The group coordinator's APIs (kafka/groups.py), at the versions librdkafka 2.16 and
# aiokafka 0.14 ask for and up to the first flexible ones; OffsetFetch 8 is the batched
# form librdkafka uses, FindCoordinator 4 the batched one.
SUPPORTED.update(
    {
        OFFSET_COMMIT: (2, 8),
        OFFSET_FETCH: (1, 8),
        FIND_COORDINATOR: (0, 4),
        JOIN_GROUP: (0, 7),
        HEARTBEAT: (0, 4),
        LEAVE_GROUP: (0, 4),
        SYNC_GROUP: (0, 5),
        DESCRIBE_GROUPS: (0, 5),
        LIST_GROUPS: (0, 4),
        DELETE_GROUPS: (0, 2),
        OFFSET_DELETE: (0, 0),
    }
)

_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id: every header's start
_I32 = struct.Struct(">i")


class CodecError(ValueError):
    """A request that does not decode; ``corr`` is its correlation id when readable."""


class Header(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_at: int  # where the request body starts in the frame


def peek(frame: bytes) -> tuple[int, int, int]:
    """(api key, version, correlation id): the fixed start every request header has."""
    if len(frame) < _HEAD.size:
        raise CodecError(f"request of {len(frame)} bytes is shorter than a request header")
    k, v, c = _HEAD.unpack_from(frame)
    return k, v, c


def supported(api_key: int, version: int) -> bool:
    rng = SUPPORTED.get(api_key)
    return rng is not None and rng[0] <= version <= rng[1]


@functools.cache
def request_type(api_key: int, version: int) -> type[Any]:
    return load_request_schema(api_key, version)


@functools.cache
def response_type(api_key: int, version: int) -> type[Any]:
    return load_response_schema(api_key, version)


def known_shape(api_key: int, version: int) -> bool:
    """Whether kio knows this API version's messages (so an error can be answered in them)."""
    try:
        request_type(api_key, version)
        response_type(api_key, version)
    except Exception:  # noqa: BLE001 - kio raises its own index errors or ImportError
        return False
    return True


def parse_header(frame: bytes) -> Header:
    """The request header (v1, or v2 for a flexible request: v1 + tagged fields)."""
    api_key, version, corr = peek(frame)
    pos = _HEAD.size
    if len(frame) < pos + 2:
        raise CodecError("request header ends before its client id")
    (n,) = struct.unpack_from(">h", frame, pos)
    pos += 2
    client_id: str | None = None
    if n >= 0:
        if len(frame) < pos + n:
            raise CodecError("request header ends inside its client id")
        client_id = frame[pos : pos + n].decode("utf-8", "replace")
        pos += n
    if known_shape(api_key, version) and request_type(api_key, version).__flexible__:
        pos = _skip_tagged_fields(frame, pos)
    return Header(api_key, version, corr, client_id, pos)


def _skip_tagged_fields(frame: bytes, pos: int) -> int:
    count, pos = _uvarint(frame, pos)
    for _ in range(count):
        _, pos = _uvarint(frame, pos)
        size, pos = _uvarint(frame, pos)
        pos += size
        if pos > len(frame):
            raise CodecError("tagged field runs past the end of the request")
    return pos


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(5):
        if pos >= len(buf):
            raise CodecError("varint runs past the end of the request")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise CodecError("varint longer than 5 bytes")


def decode_request(frame: bytes, header: Header) -> Any:
    """The request body as kio's dataclass; CodecError when it does not parse."""
    cls = request_type(header.api_key, header.api_version)
    try:
        obj, size = entity_reader(cls)(frame, header.body_at)
    except Exception as exc:
        raise CodecError(f"{cls.__name__} v{header.api_version} does not parse: {exc}") from exc
    # Bytes after the body are ignored, as a Kafka broker does: librdkafka 2.16 sends three
    # after an all-topics Metadata v12.
    del size
    return obj


def encode_response(api_key: int, version: int, corr: int, body: Any) -> bytes:
    """The response frame (size prefix included). The response header is v1 (tagged
    fields) for flexible versions, v0 otherwise, and always v0 for ApiVersions: a client
    must read it before it knows which versions we speak."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_I32.pack(corr))
    if type(body).__flexible__ and api_key != API_VERSIONS:
        out.write(b"\0")  # no tagged fields in the header
    entity_writer(type(body))(out, body)
    data = out.getbuffer()
    _I32.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def respond(api_key: int, version: int, corr: int, values: dict[str, Any]) -> bytes:
    """``build`` the response of this API version from ``values`` and encode it."""
    return encode_response(api_key, version, corr, build(response_type(api_key, version), values))


def build(cls: type[Any], values: dict[str, Any]) -> Any:
    """An instance of kio dataclass ``cls`` from ``values``: fields the class lacks are
    dropped, missing ones take kio's default or a zero value; nested entities may be
    given as dicts (lists of dicts for arrays)."""
    kwargs: dict[str, Any] = {}
    for f, hint in entity_fields(typing.cast(Any, cls)):  # a class is hashable; typeshed says not
        if f.name in values:
            kwargs[f.name] = _convert(hint, values[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(hint, f.metadata.get("kafka_type"))
    return cls(**kwargs)


def _is_array(hint: Any) -> bool:
    return any(typing.get_origin(t) is tuple for t in (hint, *typing.get_args(hint)))


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    entity = nested_entity(hint)
    if entity is not None:
        if _is_array(hint):
            return tuple(v if not isinstance(v, dict) else build(entity, v) for v in value)
        return value if not isinstance(value, dict) else build(entity, value)
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, int) and not isinstance(value, bool) and _wants_enum(hint):
        return ErrorCode(value)
    return value


def _wants_enum(hint: Any) -> bool:
    return any(
        isinstance(t, type) and issubclass(t, enum.Enum) for t in (hint, *typing.get_args(hint))
    )


def _zero(hint: Any, kafka_type: str | None) -> Any:
    if _is_array(hint):
        return ()
    if type(None) in typing.get_args(hint):
        return None
    entity = nested_entity(hint)
    if entity is not None:
        return build(entity, {})
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type == "string":
        return ""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return dt.timedelta(0)
    if kafka_type in ("records", "bytes"):
        return b""
    return 0


def error_code(value: int) -> ErrorCode:
    return ErrorCode(value)
