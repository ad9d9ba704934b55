"""coordinator/leaders.py against a fake partition server on a real loopback socket:
round trips, connection reuse, a stale pooled connection, timeouts and garbage."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from coordinator.leaders import LeaderClient
from pidlease.errors import CoordinatorUnavailable
from pidlease.wire import protocol as P

_U32 = struct.Struct(">I")


class FakeLeader:
    """Answers each request frame with ``reply(request) -> bytes | None`` (None: say
    nothing). Counts accepted connections."""

    def __init__(self, reply: Callable[[P.Request], bytes | None]) -> None:
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while len(buf) < 4 or len(buf) < 4 + _U32.unpack_from(buf)[0]:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                n = _U32.unpack_from(buf)[0]
                body, buf = buf[4 : 4 + n], buf[4 + n :]
                out = self.reply(P.decode_request(body))
                if out is not None:
                    conn.sendall(out)
        except OSError:
            return

    def drop_connections(self) -> None:
        for c in self.conns:
            c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.conns.clear()

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        self.drop_connections()


def state_reply(req: P.Request) -> bytes:
    return P.producer_state_response(
        req.correlation_id,
        0,
        found=True,
        generation=7,
        durable_highwater=req.pid * 10,
        last_use_ms=1,
    )


@pytest.fixture
def client() -> Iterator[LeaderClient]:
    c = LeaderClient(timeout_ms=500, connections_max=2)
    yield c
    c.close()


@pytest.fixture
def leader() -> Iterator[FakeLeader]:
    f = FakeLeader(state_reply)
    yield f
    f.close()


def test_round_trip_and_connection_reuse(client: LeaderClient, leader: FakeLeader) -> None:
    for pid in range(1, 6):
        r = client.producer_state(leader.address, "t", 0, pid)
        assert (r.found, r.generation, r.durable_highwater) == (True, 7, pid * 10)
    assert leader.accepted == 1


def test_fence_and_metadata_round_trip(client: LeaderClient) -> None:
    def reply(req: P.Request) -> bytes:
        if req.api_key == P.FENCE:
            assert (req.pid, req.generation, req.flags, req.token) == (
                5,
                9,
                P.FENCE_CREATE_IF_ABSENT,
                "tok",
            )
            return P.fence_response(
                req.correlation_id, 0, existed=True, durable_highwater=3, fence_offset=11
            )
        return P.metadata_response(req.correlation_id, 0, info={"partitions": []})

    f = FakeLeader(reply)
    try:
        r = client.fence(f.address, "t", 1, 5, 9, "tok", create_if_absent=True)
        assert (r.existed, r.durable_highwater, r.fence_offset) == (True, 3, 11)
        assert client.metadata(f.address).info == {"partitions": []}
    finally:
        f.close()


def test_a_connection_closed_while_idle_is_replaced(
    client: LeaderClient, leader: FakeLeader
) -> None:
    client.producer_state(leader.address, "t", 0, 1)
    leader.drop_connections()
    time.sleep(0.05)  # let the FIN arrive, as it would between two leases
    r = client.producer_state(leader.address, "t", 0, 2)
    assert r.durable_highwater == 20
    assert leader.accepted == 2


def test_silent_leader_times_out_as_retriable(client: LeaderClient) -> None:
    f = FakeLeader(lambda req: None)
    try:
        with pytest.raises(CoordinatorUnavailable, match="did not answer"):
            client.producer_state(f.address, "t", 0, 1)
    finally:
        f.close()


def test_refused_connection_is_retriable(client: LeaderClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CoordinatorUnavailable, match="unreachable"):
        client.producer_state(f"127.0.0.1:{port}", "t", 0, 1)


def test_garbage_and_wrong_correlation_are_retriable(client: LeaderClient) -> None:
    f = FakeLeader(lambda req: _U32.pack(3) + b"abc")
    g = FakeLeader(lambda req: P.producer_state_response(req.correlation_id + 1, 0))
    try:
        with pytest.raises(CoordinatorUnavailable, match="malformed"):
            client.producer_state(f.address, "t", 0, 1)
        with pytest.raises(CoordinatorUnavailable, match="malformed"):
            client.producer_state(g.address, "t", 0, 1)
    finally:
        f.close()
        g.close()


def test_bad_address_is_retriable(client: LeaderClient) -> None:
    with pytest.raises(CoordinatorUnavailable):
        client.producer_state("nohost", "t", 0, 1)


def test_pool_keeps_at_most_connections_max_idle(client: LeaderClient, leader: FakeLeader) -> None:
    barrier = threading.Barrier(4)

    def call() -> None:
        barrier.wait(5)
        client.producer_state(leader.address, "t", 0, 1)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(client._idle[leader.address]) <= 2
