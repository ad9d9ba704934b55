"""The SDK's smaller parts: partitioner, backoff, the coordinator client's error mapping,
the pipelined connection, and the Reader (against the fakes)."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import zlib

import httpx
import pytest

from pidlease import errors
from pidlease.client.connection import Connection, split_address
from pidlease.client.lease_client import AsyncLeaseClient, LeaseClient
from pidlease.client.partitioner import Partitioner, partition_for_key
from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.client.sender import Backoff
from pidlease.testing.fakes import FakePartitionServer
from pidlease.wire import protocol as P

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True


def test_partitioner_is_the_documented_crc32_and_round_robin() -> None:
    assert partition_for_key(b"order-17", 7) == zlib.crc32(b"order-17") % 7
    # values pinned so a change of hash is caught (other languages' clients must agree)
    assert [partition_for_key(k, 3) for k in (b"a", b"b", b"customer-1")] == [
        zlib.crc32(b"a") % 3,
        zlib.crc32(b"b") % 3,
        zlib.crc32(b"customer-1") % 3,
    ]
    assert zlib.crc32(b"a") == 0xE8B7BE43
    rr = Partitioner(3, start=1)
    assert [rr.partition(None) for _ in range(5)] == [1, 2, 0, 1, 2]
    assert rr.partition(b"a") == rr.partition(b"a")
    with pytest.raises(ValueError, match="at least one partition"):
        Partitioner(0)


def test_backoff_grows_and_is_capped() -> None:
    b = Backoff(base_ms=50, cap_ms=1000, rng=random.Random(1))
    delays = [b.next_ms() for _ in range(12)]
    assert all(0 < d <= 1000 for d in delays)
    assert delays[0] < 60 and delays[-1] > 700
    b.reset()
    assert b.next_ms() < 60


def _mock(status: int, body: object) -> httpx.MockTransport:
    def handler(_req: httpx.Request) -> httpx.Response:
        if isinstance(body, (dict, list)):
            return httpx.Response(status, json=body)
        return httpx.Response(status, text=str(body))

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("status", "body", "exc"),
    [
        (409, {"error": "FENCED", "detail": "stale"}, errors.ProducerFenced),
        (404, {"error": "UNKNOWN_PID", "detail": "gone"}, errors.UnknownPid),
        (503, {"error": "COORDINATOR_UNAVAILABLE", "detail": "zk"}, errors.CoordinatorUnavailable),
        (500, "<html>oops</html>", errors.CoordinatorUnavailable),
        (422, "not json", errors.InvalidRequest),
    ],
)
def test_lease_client_maps_errors(status: int, body: object, exc: type) -> None:
    with LeaseClient("http://c", transport=_mock(status, body)) as c, pytest.raises(exc):
        c.lease("t", 0, -1)

    async def run() -> None:
        ac = AsyncLeaseClient("http://c", transport=_mock(status, body))
        try:
            with pytest.raises(exc):
                await ac.lease("t", 0, -1)
        finally:
            await ac.close()

    asyncio.run(run())


def test_lease_client_unreachable_is_coordinator_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        with (
            LeaseClient(f"http://127.0.0.1:{port}", request_timeout_ms=2000) as c,
            pytest.raises(errors.CoordinatorUnavailable, match="is it running"),
        ):
            c.topic("t")


def test_lease_batch_keeps_per_request_errors() -> None:
    answer = {
        "error": "NONE",
        "responses": [
            {
                "error": "NONE",
                "pid": 5,
                "generation": 2,
                "sequence_number": 9,
                "expire_ms": 1000,
                "expires_at_ms": 1,
                "lease_token": "t",
            },
            {"error": "COORDINATOR_UNAVAILABLE", "detail": "leader down"},
        ],
    }

    async def run() -> list:
        ac = AsyncLeaseClient("http://c", transport=_mock(200, answer))
        try:
            return await ac.lease_batch(
                [{"topic": "t", "partition": 0, "pid": 5}, {"topic": "t", "partition": 1, "pid": 5}]
            )
        finally:
            await ac.close()

    got = asyncio.run(run())
    assert got[0].sequence_number == 9 and got[0].partition == 0
    assert isinstance(got[1], errors.CoordinatorUnavailable)


def test_split_address() -> None:
    assert split_address("127.0.0.1:9") == ("127.0.0.1", 9)
    with pytest.raises(errors.ServerUnavailable):
        split_address("nonsense")


def test_connection_request_timeout_aborts_and_fails_everything_outstanding() -> None:
    async def run() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            accepted.append(w)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await Connection.open(f"127.0.0.1:{port}")
        a = conn.send(P.METADATA, 1, P.metadata_request(1), timeout_ms=50)
        b = conn.send(P.METADATA, 2, P.metadata_request(2), timeout_ms=None)
        with pytest.raises(errors.ServerUnavailable, match="within 50 ms"):
            await a
        with pytest.raises(errors.ServerUnavailable):
            await b
        assert conn.closed
        late = conn.send(P.METADATA, 3, P.metadata_request(3))
        with pytest.raises(errors.ServerUnavailable):
            await late
        await conn.close()
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()

    asyncio.run(run())


def test_connection_to_nothing_is_server_unavailable() -> None:
    async def run() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            with pytest.raises(errors.ServerUnavailable, match="cannot connect"):
                await Connection.open(f"127.0.0.1:{port}")

    asyncio.run(run())


# -- Reader -----------------------------------------------------------------------------
TOPICS = {"r": (2, "strict")}


def _append_control(
    srv: FakePartitionServer, topic: str, partition: int, pid: int, gen: int
) -> None:
    with srv.lock:
        part = srv.parts[(topic, partition)]
        b = bytearray(P.encode_control_batch(pid=pid, generation=gen, timestamp_ms=0))
        P.set_base_offset(b, part.next_offset)
        part.batches.append(bytes(b))
        part.next_offset += 1


def test_reader_reads_from_an_offset_and_skips_control_records(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with Producer(
        "http://fake", topic="r", http_transport=coord.transport(), batch_records_max=7
    ) as p:
        for i in range(30):
            p.send(b"v%d" % i, partition=0)
        p.flush()
        _append_control(srv, "r", 0, p.pid, p.generation + 1)
    recs = list(Reader("http://fake", "r", 0, 0, http_transport=coord.transport()))
    assert [r.value for r in recs] == [b"v%d" % i for i in range(30)]
    assert [r.offset for r in recs] == list(range(30))
    assert [r.sequence_id for r in recs] == list(range(30))
    mid = list(Reader("http://fake", "r", 0, 12, http_transport=coord.transport()))
    assert [r.offset for r in mid] == list(range(12, 30))  # starts inside a batch
    with Reader(
        "http://fake", "r", 0, 0, include_control=True, http_transport=coord.transport()
    ) as rd:
        allr = list(rd)
        assert rd.position == 31
    assert allr[-1].is_control and allr[-1].offset == 30 and allr[-1].sequence_id == -1
    assert list(Reader("http://fake", "r", 1, 0, http_transport=coord.transport())) == []


def test_reader_small_fetch_size_grows_to_fit_a_batch(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake
    with Producer("http://fake", topic="r", http_transport=coord.transport()) as p:
        for _ in range(50):
            p.send(b"x" * 100, partition=1)
        p.flush()
    recs = list(
        Reader("http://fake", "r", 1, 0, fetch_bytes_max=1024, http_transport=coord.transport())
    )
    assert len(recs) == 50


def test_reader_follows_a_lost_connection(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with Producer(
        "http://fake", topic="r", http_transport=coord.transport(), batch_records_max=5
    ) as p:
        for i in range(40):
            p.send(b"%-100d" % i, partition=0)  # ~600-byte batches: one per 1 KiB fetch
        p.flush()
    sleeps: list[float] = []
    rd = Reader(
        "http://fake",
        "r",
        0,
        0,
        fetch_bytes_max=1024,
        http_transport=coord.transport(),
        sleep=sleeps.append,
    )
    it = iter(rd)
    first = [next(it) for _ in range(3)]
    srv.drop_all()
    threading.Event().wait(0.1)  # let the cut land before the next fetch
    rest = list(it)
    assert [int(r.value) for r in first + rest] == list(range(40))
    assert sleeps, "the reader should have retried after the cut"


def test_reader_below_the_log_start_gets_offset_out_of_range_with_both_bounds(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with Producer(
        "http://fake", topic="r", http_transport=coord.transport(), batch_records_max=5
    ) as p:
        for i in range(20):
            p.send(b"v%d" % i, partition=0)
        p.flush()
    srv.delete_below("r", 0, 10)
    start = srv.parts[("r", 0)].log_start_offset
    assert 0 < start <= 10
    with pytest.raises(errors.OffsetOutOfRange) as ei:
        list(Reader("http://fake", "r", 0, 0, http_transport=coord.transport(), sleep=_no_sleep))
    assert (ei.value.earliest, ei.value.latest) == (start, 20)
    assert not ei.value.retriable and ei.value.http_status == 416
    recs = list(Reader("http://fake", "r", 0, start, http_transport=coord.transport()))
    assert [r.offset for r in recs] == list(range(start, 20))


def test_reader_start_earliest_and_latest(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    with Producer(
        "http://fake", topic="r", http_transport=coord.transport(), batch_records_max=5
    ) as p:
        for i in range(20):
            p.send(b"v%d" % i, partition=0)
        p.flush()

    def read(**kw: object) -> list[int]:
        rd = Reader("http://fake", "r", 0, http_transport=coord.transport(), **kw)  # type: ignore[arg-type]
        return [r.offset for r in rd]

    assert read(start="earliest") == list(range(20))  # the log starts at 0
    srv.delete_below("r", 0, 10)
    start = srv.parts[("r", 0)].log_start_offset
    assert 0 < start <= 10
    assert read(start="earliest") == list(range(start, 20))  # 0 is gone: no error
    assert read(start="latest") == []  # nothing written since
    rd = Reader("http://fake", "r", 0, start="latest", http_transport=coord.transport())
    assert list(rd) == [] and rd.position == 20
    with Producer("http://fake", topic="r", http_transport=coord.transport()) as p:
        p.send(b"new", partition=0).result()
    assert [r.value for r in rd] == [b"new"]  # the same reader goes on from there
    with pytest.raises(errors.ConfigError, match="earliest"):
        Reader("http://fake", "r", 0, start="first")  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match="not both"):
        Reader("http://fake", "r", 0, 5, start="earliest")


def _no_sleep(_s: float) -> None:
    raise AssertionError("OFFSET_OUT_OF_RANGE is fatal to the reader: no retry")


def test_reader_bad_arguments() -> None:
    with pytest.raises(errors.ConfigError):
        Reader("http://c", "t", partition=-1)
    with pytest.raises(errors.ConfigError):
        Reader("http://c", "t", start_offset=-5)


def test_reader_partition_out_of_range(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake
    with pytest.raises(errors.ConfigError, match=r"partitions 0\.\.1"):
        list(Reader("http://fake", "r", 5, http_transport=coord.transport()))


def test_a_big_lease_batch_goes_in_calls_of_at_most_1000_with_longer_timeouts() -> None:
    """Issue 24: a 2,500-partition producer's batch used to be one call the coordinator
    refuses (over its batch_requests_max of 1000) with the usual 30 s timeout; now it is
    three calls in order, each timed out by its size, and a takeover's single lease call
    gets the timeout of every partition it fences."""
    from pidlease.client.lease_client import BATCH_REQUESTS_MAX, lease_timeout_s

    seen: list[tuple[int, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        reqs = body.get("requests", [body])
        seen.append((len(reqs), request.extensions["timeout"]["read"]))
        out = [
            {
                "error": "NONE",
                "pid": 5,
                "generation": 2,
                "sequence_number": r["partition"],
                "expire_ms": 1000,
                "expires_at_ms": 1,
                "lease_token": "t",
            }
            for r in reqs
        ]
        return httpx.Response(
            200, json={"error": "NONE", "responses": out} if "requests" in body else out[0]
        )

    async def run() -> list:
        ac = AsyncLeaseClient(
            "http://c", transport=httpx.MockTransport(handler), request_timeout_ms=30_000
        )
        try:
            got = await ac.lease_batch(
                [{"topic": "t", "partition": p, "pid": 5} for p in range(2500)]
            )
            await ac.lease("t", 0, -1, producer_name="n", partitions=2500)
            return got
        finally:
            await ac.close()

    got = asyncio.run(run())
    assert [g.sequence_number for g in got] == list(range(2500))
    assert BATCH_REQUESTS_MAX == 1000
    assert [n for n, _ in seen] == [1000, 1000, 500, 1]
    assert [t for _, t in seen] == [
        lease_timeout_s(30_000, 1000),
        lease_timeout_s(30_000, 1000),
        lease_timeout_s(30_000, 500),
        lease_timeout_s(30_000, 2500),
    ]
    assert lease_timeout_s(30_000, 1) == 30.0 and lease_timeout_s(30_000, 1000) > 60
