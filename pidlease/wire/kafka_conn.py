"""A blocking client for a few Kafka protocol requests (kio schemas), one connection at a
time: what the SDK's ``Consumer`` speaks to a group coordinator, what ``pidlease groups``
and the coordinator's dashboard ask a partition server's Kafka listener. In ``wire`` so the
coordinator can use it without importing the SDK (tests/unit/repo/test_import_graph.py)."""

from __future__ import annotations

import dataclasses
import functools
import io
import socket
import ssl
import struct
import typing
from typing import Any, Self

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from pidlease.wire.kafka_errors import (
    NONE,
)

OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS = 9, 15, 16


SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


class SaslRefused(Exception):
    """The Kafka listener refused our SASL/PLAIN credentials (not retriable)."""


class KafkaConn:
    """One connection to a Kafka listener: over TLS with ``ssl_context`` (the listener
    speaks TLS when its server does), authenticated with SASL/PLAIN when ``sasl`` is
    ``(user, token)`` (the listener requires it when the server has API tokens; an empty
    user authenticates as the principal the token belongs to)."""

    def __init__(
        self,
        address: str,
        client_id: str,
        timeout_s: float,
        *,
        ssl_context: ssl.SSLContext | None = None,
        sasl: tuple[str, str] | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.client_id = client_id.encode()
        self.corr = 0
        if sasl is not None:
            try:
                self._authenticate(*sasl)
            except BaseException:
                self.sock.close()
                raise

    def _authenticate(self, user: str, token: str) -> None:
        r = self.request(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        if int(r.error_code) != NONE:
            raise SaslRefused(f"SaslHandshake PLAIN refused (Kafka error {int(r.error_code)})")
        auth = b"\0" + user.encode() + b"\0" + token.encode()
        a = self.request(SASL_AUTHENTICATE, 2, {"auth_bytes": auth})
        if int(a.error_code) != NONE:
            raise SaslRefused(a.error_message or f"Kafka error {int(a.error_code)}")

    def request(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        self.corr += 1
        body = build_request(load_request_schema(api_key, version), values)
        head = struct.pack(">hhi", api_key, version, self.corr)
        head += struct.pack(">h", len(self.client_id)) + self.client_id
        if type(body).__flexible__:
            head += b"\0"
        out = io.BytesIO()
        entity_writer(type(body))(out, body)
        payload = head + out.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        (n,) = struct.unpack(">i", self._exact(4))
        frame = self._exact(n)
        cls = load_response_schema(api_key, version)
        obj, _ = entity_reader(cls)(frame, 4 + (1 if cls.__flexible__ else 0))
        return obj

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise ConnectionError("the Kafka listener closed the connection")
            buf += got
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_request(cls: Any, values: dict[str, Any]) -> Any:
    """A kio request of ``cls`` from plain values (nested entities as dicts)."""
    kwargs: dict[str, Any] = {}
    for f, hint in entity_fields(cls):
        if f.name in values:
            v = values[f.name]
            entity = nested_entity(hint)
            if entity is not None and isinstance(v, list):
                v = tuple(build_request(entity, x) if isinstance(x, dict) else x for x in v)
            elif isinstance(v, list):
                v = tuple(v)
            kwargs[f.name] = v
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = None
    return cls(**kwargs)


@functools.cache
def entity_fields(cls: Any) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """(field, resolved type hint) of a kio entity class, cached per class (the partition
    server's Kafka codec uses it too)."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls))


def nested_entity(hint: Any) -> type[Any] | None:
    """The nested entity class of a field (its own type, or its array's element)."""
    for t in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(t) and isinstance(t, type):
            return t
        for u in typing.get_args(t):
            if dataclasses.is_dataclass(u) and isinstance(u, type):
                return u
    return None


def server_groups(
    address: str,
    timeout_s: float = 5.0,
    *,
    sasl: tuple[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> list[dict[str, Any]]:
    """The groups one server's Kafka listener coordinates (ListGroups answers only those),
    each with its state, member count and committed offsets, in three requests (ListGroups,
    DescribeGroups and a batched OffsetFetch), after a SASL/PLAIN login when ``sasl`` is
    given, over TLS with ``ssl_context``. Groups still loading on that server are left
    out. Raises OSError or EOFError when the listener cannot be reached, SaslRefused for
    a refused login."""
    with KafkaConn(
        address, "pidlease-dashboard", timeout_s, sasl=sasl, ssl_context=ssl_context
    ) as c:
        listed = c.request(LIST_GROUPS, 4, {"states_filter": []})
        ids = sorted(g.group_id for g in listed.groups)
        if not ids:
            return []
        described = c.request(DESCRIBE_GROUPS, 5, {"groups": ids})
        fetched = c.request(
            OFFSET_FETCH,
            8,
            {"groups": [{"group_id": g, "topics": None} for g in ids], "require_stable": False},
        )
    offsets: dict[str, list[dict[str, Any]]] = {}
    for g in fetched.groups:
        if int(g.error_code) != NONE:
            continue
        offsets[g.group_id] = [
            {"topic": t.name, "partition": p.partition_index, "committed": int(p.committed_offset)}
            for t in g.topics
            for p in t.partitions
            if int(p.committed_offset) >= 0
        ]
    out = []
    for d in described.groups:
        if int(d.error_code) != NONE:
            continue
        out.append(
            {
                "group": d.group_id,
                "state": d.group_state,
                "protocol_type": d.protocol_type,
                "members": len(d.members),
                "coordinator": address,
                "offsets": sorted(
                    offsets.get(d.group_id, []), key=lambda o: (o["topic"], o["partition"])
                ),
            }
        )
    return out
