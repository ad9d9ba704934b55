"""A blocking wire client for tests: speaks ``pidlease.wire.protocol`` to a partition server
over a real socket, one request at a time or pipelined, plus the builders a test needs
around it: a record batch, a lease token signed with a known secret, and a topic created by
writing its znodes as the coordinator would (for a partition server run without one).

It checks nothing itself (a test asserts on the decoded responses), so it can also send
bytes a real producer never would (``send_raw``)."""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, TopicSpec, connect_zk, partition_path, topic_path
from pidlease.wire.framing import FRAME_SIZE_LIMIT, FrameDecoder
from pidlease.wire.token import make_token


class WireClient:
    """One connection; ``send`` pipelines a request, ``recv`` reads the next response."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._corr = 0
        self._apis: dict[int, int] = {}
        # A test client takes whatever the server sends: no frame limit of its own.
        self._decoder = FrameDecoder(FRAME_SIZE_LIMIT)
        self._frames: deque[bytes] = deque()

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, api: int, frame: bytes, corr: int) -> int:
        self._apis[corr] = api
        self.sock.sendall(frame)
        return corr

    def recv_body(self) -> bytes:
        while not self._frames:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self._frames.extend(self._decoder.feed(chunk))
        return self._frames.popleft()

    def recv(self, api: int | None = None) -> P.Response:
        body = self.recv_body()
        corr = P.peek_correlation_id(body)
        api = api if api is not None else self._apis.pop(corr, P.METADATA)
        return P.decode_response(api, body)

    # -- one-call helpers ------------------------------------------------------------------
    def produce_send(self, topic: str, partition: int, batch: bytes, token: str = "") -> int:
        c = self.next_corr()
        return self.send(P.PRODUCE, P.produce_request(c, topic, partition, token, batch), c)

    def produce(self, topic: str, partition: int, batch: bytes, token: str = "") -> P.Response:
        self.produce_send(topic, partition, batch, token)
        return self.recv()

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20
    ) -> P.Response:
        c = self.next_corr()
        self.send(P.FETCH, P.fetch_request(c, topic, partition, offset, max_bytes), c)
        return self.recv()

    def list_offsets(self, topic: str, partition: int, timestamp_ms: int) -> P.Response:
        """LIST_OFFSETS: ``timestamp_ms`` a time, or ``P.LATEST_TIMESTAMP`` /
        ``P.EARLIEST_TIMESTAMP``; the answer's ``offset``, ``log_start_offset``,
        ``high_watermark``."""
        c = self.next_corr()
        self.send(P.LIST_OFFSETS, P.list_offsets_request(c, topic, partition, timestamp_ms), c)
        return self.recv()

    def fence(
        self,
        topic: str,
        partition: int,
        pid: int,
        generation: int,
        token: str,
        create_if_absent: bool = True,
    ) -> P.Response:
        c = self.next_corr()
        self.send(
            P.FENCE,
            P.fence_request(
                c, topic, partition, pid, generation, token, create_if_absent=create_if_absent
            ),
            c,
        )
        return self.recv()

    def producer_state(self, topic: str, partition: int, pid: int) -> P.Response:
        c = self.next_corr()
        self.send(P.PRODUCER_STATE, P.producer_state_request(c, topic, partition, pid), c)
        return self.recv()

    def producer_states(self, pid: int, partitions: list[tuple[str, int]]) -> P.Response:
        """PRODUCER_STATES: the answer's ``entries``, one per partition, in order."""
        c = self.next_corr()
        self.send(P.PRODUCER_STATES, P.producer_states_request(c, pid, partitions), c)
        return self.recv()

    def fences(
        self, pid: int, generation: int, token: str, entries: list[P.PartitionEntry]
    ) -> P.Response:
        """FENCES: answered once every fence is durable; ``entries`` one per partition."""
        c = self.next_corr()
        self.send(P.FENCES, P.fences_request(c, pid, generation, token, entries), c)
        return self.recv()

    def metadata(self) -> dict[str, Any]:
        c = self.next_corr()
        self.send(P.METADATA, P.metadata_request(c), c)
        r = self.recv()
        assert r.info is not None
        return r.info

    def read_all(
        self, topic: str, partition: int, start: int = 0, max_rounds: int = 10_000
    ) -> list[P.Record]:
        """Every record (control ones included) from ``start`` up to the high watermark."""
        out: list[P.Record] = []
        offset = start
        for _ in range(max_rounds):
            r = self.fetch(topic, partition, offset)
            if r.error_code:
                raise RuntimeError(f"fetch error {r.error_code}: {r.detail}")
            assert r.data is not None
            got = False
            for h, pos in P.iter_batches(r.data):
                for rec in P.iter_records(r.data, h, pos, topic, partition):
                    if rec.offset >= offset:
                        out.append(rec)
                        got = True
                offset = max(offset, h.base_offset + h.count)
            if not got or offset >= r.high_watermark:
                return out
        raise RuntimeError("read_all did not finish")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def batch(
    pid: int, generation: int, base_seq: int, values: Iterable[bytes], key: bytes | None = None
) -> bytes:
    return P.encode_batch(
        [(key, v) for v in values],
        pid=pid,
        generation=generation,
        base_sequence=base_seq,
        timestamp_ms=int(time.time() * 1000),
    )


def token(secret: str, pid: int, generation: int, ttl_ms: int = 3_600_000) -> str:
    return make_token(secret.encode(), pid, generation, int(time.time() * 1000) + ttl_ms)


def create_topic(
    zk_hosts: str,
    name: str,
    partitions: int = 1,
    *,
    dedup: str = "strict",
    leader: int = 1,
    replicas: list[int] | None = None,
) -> None:
    """Write TopicSpec and PartitionState znodes as the coordinator would."""
    zk = connect_zk(zk_hosts)
    try:
        zk.create(
            topic_path(name),
            TopicSpec(name, partitions, 1, dedup, int(time.time() * 1000)).to_bytes(),
        )
        for p in range(partitions):
            zk.create(
                partition_path(name, p),
                PartitionState(replicas or [leader], leader, 0, replicas or [leader]).to_bytes(),
                makepath=True,
            )
    finally:
        zk.stop()
        zk.close()
