"""In-process fakes of a pidlease cluster, to test code that publishes with pidlease
without ZooKeeper or server processes (milliseconds per test instead of seconds).

``FakePartitionServer`` is a partition server in a thread of its own (its own event loop)
that speaks the real wire protocol on a real loopback socket: produce and fetch, with the
append rules for the three dedup modes (``strict``, ``monotonic``, ``off``): generation
fencing, duplicates answered with their original offsets from the last five batches of a
PID, out-of-order sequences refused, and a monotonic refusal leaving no hole. It can
inject faults: answer produce requests with an error code (``fail_next``, ``fail_at``),
append and then cut the connection before answering (``drop_after_append``), stop
answering (``silent``, ``silent_from``), hold one partition's answers with or without
appending (``hold_after_append``, ``hold_before_append``: a batch in flight whose outcome
the producer cannot know; ``release_held`` sends the answers held after appending), cut
every connection (``drop_all``). LIST_OFFSETS
(a reader's start by time, or the log's start or end) is answered from the stored batches.

``FakeCoordinator`` is the coordinator's HTTP API as an ``httpx.MockTransport`` (pass
``coord.transport()`` as a producer's or reader's ``http_transport``): topic metadata
with every partition led by one FakePartitionServer, PID leases by number or by producer
name (a named lease again is a takeover: generation raised, partitions fenced), renewals
and batch leases; ``fail_leases`` answers lease calls with 503.

What they do not fake: replication, more than one leader (``leader_override`` points
every partition elsewhere at once), PID expiry and lease expiry in time, tokens
(recorded in ``tokens_seen``, never checked), authentication and scopes, request size
limits, persistence and recovery, the per-partition PID limit, and the fence,
producer-state and metadata requests (answered ``INVALID_REQUEST``). Behaviour that
depends on those needs ``pidlease.testing.devcluster.LocalCluster``.

Example (``fake_cluster`` starts both and stops the server after)::

    with fake_cluster({"orders": (2, "strict")}) as (server, coord):  # name -> (partitions, dedup)
        with Producer("http://fake", topic="orders", http_transport=coord.transport()) as p:
            p.send(b"hello", partition=0)
        assert [r.value for r in server.records("orders", 0)] == [b"hello"]
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from pidlease import errors
from pidlease.wire import protocol as P
from pidlease.wire.framing import FRAME_SIZE_LIMIT, HEADER_SIZE, read_frame


@dataclass
class _PidState:
    generation: int
    highwater: int = -1
    # (first, last, base_offset) of the last batches, for answering duplicates
    recent: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=5))


@dataclass
class _Partition:
    dedup: str = "strict"
    batches: list[bytes] = field(default_factory=list)  # stored batch bytes with base_offset set
    next_offset: int = 0
    log_start_offset: int = 0  # below it: OFFSET_OUT_OF_RANGE, as retention leaves a log
    pids: dict[int, _PidState] = field(default_factory=dict)
    # monotonic: pid -> lowest base sequence refused by an injected retriable error (the
    # contract's "a refusal leaves no hole")
    blocked: dict[int, int] = field(default_factory=dict)


class FakePartitionServer:
    """A partition server on 127.0.0.1 (``address`` once started) holding ``topics``
    (name -> (partitions, dedup mode)) in memory. Start with ``start()``, stop with
    ``stop()``; the fault switches are plain attributes, read under ``lock``."""

    def __init__(self, topics: dict[str, tuple[int, str]]) -> None:
        self.lock = threading.Lock()
        self.parts = {
            (t, p): _Partition(dedup) for t, (n, dedup) in topics.items() for p in range(n)
        }
        self.fail_next: deque[int] = deque()  # error codes to answer produce requests with
        self.fail_at: dict[int, int] = {}  # produce request number (from 1) -> error code
        self.answers: list[tuple[int, int]] = []  # (base sequence, error code) per produce
        self.drop_after_append = 0  # append, then cut the connection, this many times
        self.silent = False  # read requests, never answer
        self.silent_from = 0  # from this produce request number on: silent
        # (topic, partition): produce requests there are appended (or not) and never answered
        self.hold_after_append: set[tuple[str, int]] = set()
        self.hold_before_append: set[tuple[str, int]] = set()
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []  # (to whom, answer)
        self._writer: asyncio.StreamWriter | None = None  # of the request being handled
        self.produce_requests = 0
        self.tokens_seen: list[str] = []
        self.address = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # -- lifecycle in a thread ---------------------------------------------------------
    def start(self) -> FakePartitionServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def boot() -> None:
                self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
                port = self._server.sockets[0].getsockname()[1]
                self.address = f"127.0.0.1:{port}"
                ready.set()

            loop.run_until_complete(boot())
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            await self._server.wait_closed()
            await asyncio.sleep(0.01)

        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            assert self._thread is not None
            self._thread.join(10)

    def connections(self) -> int:
        """Client connections open now."""
        return len(self._writers)

    def drop_all(self) -> None:
        """Cut every client connection from the server side."""

        def cut() -> None:
            for w in list(self._writers):
                w.transport.abort()

        assert self._loop is not None
        self._loop.call_soon_threadsafe(cut)

    # -- state helpers ------------------------------------------------------------------
    def highwater(self, topic: str, partition: int, pid: int) -> int | None:
        with self.lock:
            st = self.parts[(topic, partition)].pids.get(pid)
            return None if st is None else st.highwater

    def fence(self, topic: str, partition: int, pid: int, generation: int) -> None:
        with self.lock:
            part = self.parts[(topic, partition)]
            st = part.pids.setdefault(pid, _PidState(generation))
            st.generation = generation
            part.blocked.pop(pid, None)  # a takeover gives the refused range up

    def records(self, topic: str, partition: int) -> list[P.Record]:
        with self.lock:
            out: list[P.Record] = []
            for b in self.parts[(topic, partition)].batches:
                h = P.decode_batch_header(b)
                out.extend(P.iter_records(b, h, 0, topic, partition))
            return out

    # -- the protocol ---------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                body = await read_frame(reader, FRAME_SIZE_LIMIT)
                req = P.decode_request(body)
                self._writer = writer
                out = self._handle(req)
                if out is None:
                    writer.transport.abort()
                    return
                if out:
                    writer.write(out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    def _handle(self, req: P.Request) -> bytes | None:
        with self.lock:
            if req.api_key == P.PRODUCE:
                return self._produce(req)
            if req.api_key == P.FETCH:
                return self._fetch(req)
            if req.api_key == P.LIST_OFFSETS:
                return self._list_offsets(req)
            return P.response(req.correlation_id, errors.InvalidRequest.code, "unsupported", b"")

    def _produce(self, req: P.Request) -> bytes | None:
        out = self._produce_answer(req)
        if out and req.batch is not None and len(req.batch) >= P.BATCH_HEADER_SIZE:
            code = P.decode_response(P.PRODUCE, out[HEADER_SIZE:]).error_code
            self.answers.append((P.decode_batch_header(req.batch).base_sequence, code))
        return out

    def _produce_answer(self, req: P.Request) -> bytes | None:
        self.produce_requests += 1
        self.tokens_seen.append(req.token)
        corr = req.correlation_id
        if self.silent or 0 < self.silent_from <= self.produce_requests:
            return b""
        if (req.topic, req.partition) in self.hold_before_append:
            return b""
        part = self.parts.get((req.topic, req.partition))
        inject = self.fail_at.pop(self.produce_requests, None)
        if inject is None and self.fail_next:
            inject = self.fail_next.popleft()
        if inject is not None:
            if part is not None and part.dedup == "monotonic" and req.batch is not None:
                h = P.validate_batch(req.batch)
                st = part.pids.get(h.pid)
                # a refusal of a batch the rules would have appended blocks the PID
                if st is None or (h.generation >= st.generation and h.base_sequence > st.highwater):
                    old = part.blocked.get(h.pid)
                    part.blocked[h.pid] = (
                        h.base_sequence if old is None else min(old, h.base_sequence)
                    )
            return P.produce_response(corr, inject, "injected")
        if part is None:
            return P.produce_response(
                corr, errors.UnknownTopicOrPartition.code, "no such partition"
            )
        assert req.batch is not None
        h = P.validate_batch(req.batch)
        first, last = h.base_sequence, h.last_sequence
        st = part.pids.get(h.pid)
        if part.dedup != "off" and h.pid != 0:
            if st is not None and h.generation < st.generation:
                return P.produce_response(corr, errors.ProducerFenced.code, "fenced")
            if st is None and part.dedup == "strict" and first > 0:
                return P.produce_response(corr, errors.UnknownPid.code, "unknown pid")
            blocked = part.blocked.get(h.pid)
            hw = st.highwater if st is not None else -1
            if blocked is not None and first > blocked and first > hw:
                return P.produce_response(
                    corr,
                    errors.SequenceUnknown.code,
                    "earlier batch refused",
                    expected_sequence=blocked,
                )
            if st is not None and last <= st.highwater:
                for f, lst, off in st.recent:
                    if f == first and lst == last:
                        return P.produce_response(
                            corr,
                            errors.DUPLICATE,
                            "dup",
                            base_offset=off,
                            last_offset=off + h.count - 1,
                        )
                if part.dedup == "monotonic" and st.recent and last >= st.recent[0][0]:
                    # monotonic: at or below H is not proof of a write (holes)
                    return P.produce_response(
                        corr,
                        errors.OutOfOrderSequence.code,
                        "never written",
                        expected_sequence=hw + 1,
                    )
                return P.produce_response(corr, errors.DUPLICATE, "dup")
            ok = first > hw if part.dedup == "monotonic" else first == hw + 1
            if st is not None and not ok:
                return P.produce_response(
                    corr, errors.OutOfOrderSequence.code, "ooo", expected_sequence=hw + 1
                )
        stored = bytearray(req.batch)
        base = part.next_offset
        P.set_base_offset(stored, base)
        part.batches.append(bytes(stored))
        part.next_offset += h.count
        if h.pid != 0:
            part.blocked.pop(h.pid, None)
            st = part.pids.setdefault(h.pid, _PidState(h.generation))
            st.generation = max(st.generation, h.generation)
            st.highwater = last
            st.recent.append((first, last, base))
        if self.drop_after_append > 0:
            self.drop_after_append -= 1
            return None
        answer = P.produce_response(
            corr, errors.NONE, "", base_offset=base, last_offset=base + h.count - 1
        )
        if (req.topic, req.partition) in self.hold_after_append:
            assert self._writer is not None
            self._held.append((self._writer, answer))
            return b""
        return answer

    def release_held(self) -> None:
        """Send the answers held by ``hold_after_append`` (to connections still open)."""

        def send() -> None:
            with self.lock:
                held, self._held = self._held, []
            for w, answer in held:
                if not w.transport.is_closing():
                    w.write(answer)

        assert self._loop is not None
        self._loop.call_soon_threadsafe(send)

    def delete_below(self, topic: str, partition: int, offset: int) -> None:
        """Drop the stored batches wholly below ``offset``, as retention would."""
        with self.lock:
            part = self.parts[(topic, partition)]
            part.batches = [
                b for b in part.batches if P.decode_batch_header(b).last_offset >= offset
            ]
            part.log_start_offset = P.decode_batch_header(part.batches[0]).base_offset

    def _fetch(self, req: P.Request) -> bytes:
        part = self.parts.get((req.topic, req.partition))
        if part is None:
            return P.fetch_response(req.correlation_id, errors.UnknownTopicOrPartition.code, "no")
        if req.offset < part.log_start_offset:
            return P.fetch_response(
                req.correlation_id,
                errors.OffsetOutOfRange.code,
                "below the log start",
                high_watermark=part.next_offset,
                log_start_offset=part.log_start_offset,
            )
        chunks: list[bytes] = []
        size = 0
        for b in part.batches:
            h = P.decode_batch_header(b)
            if h.last_offset < req.offset:
                continue
            if chunks and size + len(b) > req.max_bytes:
                break
            chunks.append(b)
            size += len(b)
        return P.fetch_response(
            req.correlation_id,
            errors.NONE,
            "",
            high_watermark=part.next_offset,
            log_start_offset=part.log_start_offset,
            data=chunks,
        )

    def _list_offsets(self, req: P.Request) -> bytes:
        part = self.parts.get((req.topic, req.partition))
        if part is None:
            return P.list_offsets_response(
                req.correlation_id, errors.UnknownTopicOrPartition.code, "no"
            )
        t = req.timestamp_ms
        if t < P.EARLIEST_TIMESTAMP:
            return P.list_offsets_response(
                req.correlation_id, errors.InvalidRequest.code, f"bad timestamp {t}"
            )
        if t == P.EARLIEST_TIMESTAMP:
            offset = part.log_start_offset
        elif t == P.LATEST_TIMESTAMP:
            offset = part.next_offset
        else:  # the first stored batch at or after the time, as the real server answers
            heads = (P.decode_batch_header(b) for b in part.batches)
            offset = next((h.base_offset for h in heads if h.timestamp_ms >= t), part.next_offset)
        return P.list_offsets_response(
            req.correlation_id,
            errors.NONE,
            offset=offset,
            log_start_offset=part.log_start_offset,
            high_watermark=part.next_offset,
        )


class FakeCoordinator:
    """The coordinator's HTTP API over one FakePartitionServer (all partitions lead there)."""

    def __init__(
        self,
        server: FakePartitionServer,
        topics: dict[str, tuple[int, str]],
        *,
        expire_ms: int = 30_000,
    ) -> None:
        self.server = server
        self.topics = topics
        self.expire_ms = expire_ms
        self.next_pid = 1000
        self.pids: dict[int, int] = {}  # pid -> generation
        self.names: dict[str, int] = {}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.fail_leases = 0  # answer this many lease calls with 503
        self.leader_override: str | None = None
        self.lock = threading.Lock()

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            body = json.loads(request.content) if request.content else {}
            self.requests.append((request.url.path, body))
            path = request.url.path
            if path.startswith("/v1/topics/"):
                return self._topic(path.rsplit("/", 1)[1])
            if path == "/v1/lease_pid":
                if self.fail_leases > 0:
                    self.fail_leases -= 1
                    return httpx.Response(
                        503, json={"error": "COORDINATOR_UNAVAILABLE", "detail": "x"}
                    )
                status, out = self._lease(body)
                return httpx.Response(status, json=out)
            if path == "/v1/lease_pid/batch":
                if self.fail_leases > 0:
                    self.fail_leases -= 1
                    return httpx.Response(
                        503, json={"error": "COORDINATOR_UNAVAILABLE", "detail": "x"}
                    )
                return httpx.Response(
                    200,
                    json={
                        "error": "NONE",
                        "responses": [self._lease(r)[1] for r in body["requests"]],
                    },
                )
            return httpx.Response(404, json={"error": "INVALID_REQUEST", "detail": "no route"})

    def _topic(self, name: str) -> httpx.Response:
        if name not in self.topics:
            return httpx.Response(404, json={"error": "UNKNOWN_TOPIC_OR_PARTITION", "detail": name})
        n, dedup = self.topics[name]
        addr = self.leader_override or self.server.address
        return httpx.Response(
            200,
            json={
                "error": "NONE",
                "name": name,
                "partitions": n,
                "replication_factor": 1,
                "dedup": dedup,
                "partition_states": [
                    {
                        "partition": p,
                        "leader": 1,
                        "leader_address": addr,
                        "leader_epoch": 0,
                        "replicas": [1],
                        "isr": [1],
                        "log_end_offset": 0,
                        "high_watermark": 0,
                    }
                    for p in range(n)
                ],
            },
        )

    def takeover(self, name: str) -> tuple[int, int]:
        """Raise the generation of ``name``'s PID and fence every partition (as the real
        coordinator does before answering a takeover)."""
        with self.lock:
            pid = self.names[name]
            self.pids[pid] += 1
            gen = self.pids[pid]
        for t, (n, _d) in self.topics.items():
            for p in range(n):
                self.server.fence(t, p, pid, gen)
        return pid, gen

    def _lease(self, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        pid = req["pid"]
        name = req.get("producer_name")
        if pid == -1:
            if name is not None and name in self.names:
                pid = self.names[name]
                self.pids[pid] += 1
                for t, (n, _d) in self.topics.items():
                    for p in range(n):
                        self.server.fence(t, p, pid, self.pids[pid])
            else:
                pid = self.next_pid
                self.next_pid += 1
                self.pids[pid] = 7
                if name is not None:
                    self.names[name] = pid
        elif pid not in self.pids:
            return 404, {"error": "UNKNOWN_PID", "detail": "unknown"}
        elif req.get("generation") is None:
            self.pids[pid] += 1
        elif req["generation"] < self.pids[pid]:
            return 409, {"error": "FENCED", "detail": "stale generation"}
        gen = self.pids[pid]
        hw = self.server.highwater(req["topic"], req["partition"], pid)
        exp = req.get("expire_ms") or self.expire_ms
        return 200, {
            "error": "NONE",
            "pid": pid,
            "generation": gen,
            "sequence_number": 0 if hw is None else hw + 1,
            "expire_ms": exp,
            "expires_at_ms": 0,
            "lease_token": f"tok-{pid}-{gen}-{len(self.requests)}",
        }


@contextmanager
def fake_cluster(
    topics: dict[str, tuple[int, str]], *, expire_ms: int = 30_000
) -> Iterator[tuple[FakePartitionServer, FakeCoordinator]]:
    """A started FakePartitionServer holding ``topics`` (name -> (partitions, dedup mode))
    and a FakeCoordinator in front of it; the server is stopped on exit."""
    server = FakePartitionServer(topics).start()
    try:
        yield server, FakeCoordinator(server, topics, expire_ms=expire_ms)
    finally:
        server.stop()
