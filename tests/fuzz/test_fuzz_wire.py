"""Fuzzing the binary protocol: hypothesis over bytes, in process against the decoder and
over real sockets against a real partition server.

The decoder must raise nothing but ``CorruptRecord`` on any body. The server, fed random
bytes, random framed bodies and mutated valid requests (one connection per example),
must answer within a bound or close the connection, never crash, and keep serving: a
valid append and a fetch on a separate connection still work after every phase.
Example counts: ``PIDLEASE_FUZZ_EXAMPLES`` (default 300 per socket phase, 3000 in process).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET, LocalCluster
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire import protocol as P

EXAMPLES = int(os.environ.get("PIDLEASE_FUZZ_EXAMPLES", "300"))
ANSWER_TIMEOUT_S = 10.0
FRAME_MAX = 64 * 1024
ENV = {"PIDLEASE_FRAME_BYTES_MAX": str(FRAME_MAX), "PIDLEASE_BATCH_BYTES_MAX": str(16 * 1024)}
TOPIC = "fuzz"
COUNTS: dict[str, int] = {}
_U32 = struct.Struct(">I")
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def valid_bodies() -> list[bytes]:
    """One valid request body of every kind, to mutate."""
    tok = token(DEV_SECRET, 77, 1)
    frames = [
        P.produce_request(1, TOPIC, 0, tok, batch(77, 1, 0, [b"a", b"bb"])),
        P.fetch_request(2, TOPIC, 0, 0, 4096),
        P.fence_request(3, TOPIC, 0, 77, 1, tok, create_if_absent=True),
        P.producer_state_request(4, TOPIC, 0, 77),
        P.metadata_request(5),
        P.replica_fetch_request(
            6, TOPIC, 0, replica_id=9, leader_epoch=0, offset=0, max_bytes=4096, max_wait_ms=0
        ),
        P.epoch_end_request(7, TOPIC, 0, replica_id=9, leader_epoch=0, epoch=0),
        P.list_offsets_request(8, TOPIC, 0, 0),
    ]
    return [f[4:] for f in frames]  # without the length prefix


@pytest.fixture(scope="module")
def server(make_module_cluster: Any) -> Iterator[tuple]:
    cluster: LocalCluster = make_module_cluster(servers=1, coordinators=0, env=ENV)
    try:
        create_topic(cluster.zk_hosts, TOPIC)
        svc = cluster.servers[0]
        with WireClient(svc.address) as c:
            assert (
                c.produce(TOPIC, 0, batch(5, 1, 0, [b"keep"]), token(DEV_SECRET, 5, 1)).error_code
                == 0
            )
        yield cluster, svc
    finally:
        print(f"FUZZ WIRE COUNTS: {COUNTS}")


def exchange(address: str, data: bytes) -> None:
    """Send ``data`` on a fresh connection, then read until the server answers every
    complete frame it could parse or closes. A silent open connection after the bound is
    a hang, unless the bytes were an incomplete frame the server is rightly waiting on."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)  # no more bytes: an incomplete frame can never finish
        except OSError:
            return  # the server closed on us first: allowed
        buf = b""
        try:
            while len(buf) < 16 * 1024 * 1024:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except ConnectionResetError:
            return
        except TimeoutError:
            pytest.fail(
                f"server neither answered nor closed within {ANSWER_TIMEOUT_S}s: {data[:80]!r}"
            )
    pos = 0
    while pos + 4 <= len(buf):  # whatever it answered is well-framed
        (n,) = _U32.unpack_from(buf, pos)
        assert pos + 4 + n <= len(buf), "a truncated response frame"
        assert n >= 6, "a response shorter than its header"
        pos += 4 + n
    assert pos == len(buf), "bytes after the last response frame"


def assert_serving(cluster: LocalCluster, svc: object, seq: int) -> None:
    assert svc.alive, f"partition server died:\n{cluster.logs(60)}"  # type: ignore[attr-defined]
    with WireClient(svc.address, timeout_s=30) as c:  # type: ignore[attr-defined]
        r = c.produce(TOPIC, 0, batch(5, 1, seq, [b"still-serving"]), token(DEV_SECRET, 5, 1))
        assert r.error_code == 0, r
        assert c.fetch(TOPIC, 0, 0).error_code == 0


def count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


@settings(max_examples=EXAMPLES * 10, deadline=None, database=None)
@given(
    st.binary(max_size=512)
    | st.sampled_from(valid_bodies()).flatmap(lambda b: st.integers(0, len(b)).map(lambda i: b[:i]))
)
def test_decoder_raises_only_its_refusals(body: bytes) -> None:
    count("decoder")
    # The two errors it may raise (both answered, never a crash): malformed bytes, and a
    # well-formed many-partition request over its rules (found by this test at "10001
    # partitions in one request" once those requests existed).
    with contextlib.suppress(errors.CorruptRecord, errors.InvalidRequest):
        P.decode_request(body)


@FUZZ
@given(data=st.binary(min_size=1, max_size=2048))
def test_random_bytes_keep_the_server_serving(server: tuple, data: bytes) -> None:
    count("raw")
    exchange(server[1].address, data)


@FUZZ
@given(body=st.binary(max_size=4096))
def test_random_framed_bodies_get_answers(server: tuple, body: bytes) -> None:
    count("framed")
    exchange(server[1].address, P.frame(body))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    b = bytearray(draw(st.sampled_from(valid_bodies())))
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        i = draw(st.integers(0, max(0, len(b) - 1)))
        if op == "flip" and b:
            b[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and b:
            b[i] = draw(st.sampled_from([0, 0xFF, 0x7F, 0x80]))
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and b:
            del b[i : i + draw(st.integers(1, 8))]
    return bytes(b)


@FUZZ
@given(body=mutated())
def test_mutated_valid_requests_get_answers(server: tuple, body: bytes) -> None:
    count("mutated")
    exchange(server[1].address, P.frame(body))


def test_server_still_serves_after_the_fuzzing(server: tuple) -> None:
    cluster, svc = server
    assert_serving(cluster, svc, seq=1)
    log = Path(svc.log_path).read_text(errors="replace")
    print(f"server log tracebacks after fuzzing: {log.count('Traceback')}")
    assert "Traceback" not in log, log[-4000:]
