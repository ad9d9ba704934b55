"""The TCP front of a partition server: framing, request dispatch, and pipelining (each
connection's responses go out in request order, however long each takes to be durable).

Bad input never reaches a log: a frame whose length is over ``frame_bytes_max`` gets a
RECORD_TOO_LARGE answer and the connection is closed (we will not read that much); any
other malformed frame gets an error response (with its correlation id when readable) and
the connection keeps serving, since the framing itself is intact.

TLS (``tls_certfile``/``tls_keyfile``, ``pidlease/wire/tls.py``): every accepted socket gets an
``asyncio.sslproto.SSLProtocol`` around the usual stream protocol (what ``ssl=`` on a server
does, made explicit to see the handshake's outcome), with a handshake timeout. The stream
handler starts only once the handshake is done; a plaintext client, a certificate the
peer refuses, or garbage costs one log line and a closed socket, never a task. The server
registers ``advertised_host:advertised_port`` (default: where it listens) so clients may reach
it through a proxy or NAT.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import struct
import time
from asyncio import sslproto
from collections.abc import Callable
from typing import NamedTuple

from partition_server.handoff import controlled_shutdown
from partition_server.kafka import KafkaListener, make_listener
from partition_server.log_manager import LogManager
from partition_server.metrics import ServerMetrics, watch_log_manager
from partition_server.metrics_listener import MetricsListener
from partition_server.ordered import OrderedReplies
from partition_server.partition import Partition, wall_clock_ms
from partition_server.produce import NotRouted
from partition_server.producer_state import FenceOutcome, Outcome
from partition_server.refusal_guard import PartitionPid, Refusal, RefusalGuard
from partition_server.registry import Registry
from partition_server.settings import ServerSettings
from pidlease import errors
from pidlease.errors import CorruptRecord, InvalidRequest, PidleaseError, RecordTooLarge
from pidlease.wire import protocol as P
from pidlease.wire.framing import HEADER_SIZE, FrameTooLarge, read_frame
from pidlease.wire.tls import HANDSHAKE_TIMEOUT_S, server_ssl_context
from pidlease.wire.token import verify_token

log = logging.getLogger("partition_server.server")

_HEAD = struct.Struct(">BI")
_FRAMED_CODE = struct.Struct(">H")  # a framed response's error code, after length and corr
_FRAMED_CODE_AT = HEADER_SIZE + 4
# Refusals the connection guard remembers: the SDK resends after each of them (it retries
# UNKNOWN_TOPIC_OR_PARTITION too, as a topic may be a moment old or a server restarting).
_GUARDED_CODES = frozenset(
    [cls.code for cls in errors.ERRORS_BY_CODE.values() if cls.retriable]
    + [errors.UnknownTopicOrPartition.code]
)

_OUTCOME_CODES = {
    Outcome.FENCED: errors.ProducerFenced.code,
    Outcome.UNKNOWN_PID: errors.UnknownPid.code,
    Outcome.SEQUENCE_UNKNOWN: errors.SequenceUnknown.code,
    Outcome.OUT_OF_ORDER: errors.OutOfOrderSequence.code,
}

Reply = bytes | asyncio.Future[bytes]


def error_response(
    api_key: int, corr: int, code: int, detail: str, leader: str = "", expected_sequence: int = -1
) -> bytes:
    """An error in the response shape of ``api_key`` (so clients parse it as usual)."""
    if api_key == P.PRODUCE:
        return P.produce_response(
            corr, code, detail, expected_sequence=expected_sequence, leader=leader
        )
    if api_key == P.FETCH:
        return P.fetch_response(corr, code, detail, leader=leader)
    if api_key == P.FENCE:
        return P.fence_response(corr, code, detail)
    if api_key == P.PRODUCER_STATE:
        return P.producer_state_response(corr, code, detail)
    if api_key == P.METADATA:
        return P.metadata_response(corr, code, detail)
    if api_key == P.REPLICA_FETCH:
        return P.replica_fetch_response(corr, code, detail)
    if api_key == P.EPOCH_END:
        return P.epoch_end_response(corr, code, detail)
    if api_key == P.REPLICA_FETCH_MANY:
        return P.replica_fetch_many_response(corr, code, detail)
    if api_key == P.LIST_OFFSETS:
        return P.list_offsets_response(corr, code, detail, leader=leader)
    if api_key in P.MANY_APIS:
        return P.entries_response(corr, code, detail, [])
    return P.response(corr, code, detail, b"")


def _failed_answer(meta: tuple[int, int], exc: Exception) -> bytes:
    """The answer of a request whose reply future failed, in its API's shape."""
    api, corr = meta
    if isinstance(exc, PidleaseError):
        return error_response(api, corr, exc.code, exc.detail)
    log.error("request %d failed", corr, exc_info=exc)
    return error_response(api, corr, errors.PidleaseError.code, str(exc))


class _Conn(OrderedReplies[tuple[int, int]]):
    """Per-connection pipeline (``ordered.py``: replies in request order, bounded in
    number, keyed by (api, correlation id)) and the refusal guard of the connection's
    producers."""

    __slots__ = ("guard", "missing")

    def __init__(self, inflight_max: int) -> None:
        super().__init__(inflight_max, _failed_answer)
        self.guard = RefusalGuard()
        # (topic, partition) -> when a re-read of ZooKeeper for this connection did not
        # find it: requests for it soon after are answered without another re-read.
        self.missing: dict[tuple[str, int], float] = {}


class _Batch(NamedTuple):
    """What the refusal guard needs of a PRODUCE, read before routing."""

    key: PartitionPid
    generation: int
    base_sequence: int
    last_sequence: int


def _batch_key(req: P.Request) -> _Batch | None:
    """The guard's view of a PRODUCE with a pid, read from the batch header without
    validating the batch; None when there is none (pid 0, a short or control batch)."""
    b = req.batch
    if b is None or len(b) < P.BATCH_HEADER_SIZE:
        return None
    h = P.decode_batch_header(b)
    if h.pid <= 0 or h.is_control:
        return None
    return _Batch((req.topic, req.partition, h.pid), h.generation, h.base_sequence, h.last_sequence)


class PartitionServer:
    def __init__(
        self, settings: ServerSettings, *, clock_ms: Callable[[], int] = wall_clock_ms
    ) -> None:
        self.s = settings
        self.clock_ms = clock_ms
        self.registry = Registry(
            settings.zk, settings.server_id, timeout_s=settings.zk_session_timeout_ms / 1000
        )
        self.log_manager = LogManager(settings, self.registry, clock_ms=clock_ms)
        self.metrics = ServerMetrics(settings.server_id, clock_ms=clock_ms)
        watch_log_manager(self.metrics, self.log_manager)
        self.log_manager.produce.metrics = self.metrics  # both protocols' appends are counted
        self.metrics_listener: MetricsListener | None = None
        self._server: asyncio.AbstractServer | None = None
        # Open client connections, closed at stop in the order they came: a dict, not a
        # set (a set of writers iterates by address, so a stop closed them in a different
        # order from run to run, and the simulation's replays of one seed diverged).
        self._writers: dict[asyncio.StreamWriter, None] = {}
        self._maint: asyncio.Task[None] | None = None
        self.address = settings.address
        self.port = settings.port
        self._stopping = False
        self._ssl: ssl.SSLContext | None = (
            server_ssl_context(settings.tls_certfile, settings.tls_keyfile)
            if settings.tls
            else None
        )
        self.tls_handshake_failures = 0
        self.kafka: KafkaListener | None = None
        self.kafka_port = 0

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.connect)
        a = await loop.run_in_executor(None, self.registry.read_now)
        self.log_manager.recover(a)
        self.registry.on_change = self.log_manager.apply_assignment
        # Bind first (port 0 picks one), listen only once registered: whoever can connect
        # can also find us in ZooKeeper.
        if self._ssl is not None:
            self._server = await loop.create_server(
                self._tls_protocol, self.s.host, self.s.port, start_serving=False
            )
        else:
            self._server = await asyncio.start_server(
                self._handle, self.s.host, self.s.port, start_serving=False
            )
        self.port = self._server.sockets[0].getsockname()[1]
        adv_host = self.s.advertised_host or self.s.host
        adv_port = self.s.advertised_port or self.port
        self.address = f"{adv_host}:{adv_port}"  # what ZooKeeper, METADATA and clients see
        if self.s.metrics_port:
            # Before registering: a metrics port in use stops the start, not a live server.
            self.metrics_listener = MetricsListener(
                self.metrics.render, self.s.metrics_host or self.s.host, self.s.metrics_port
            )
            await self.metrics_listener.start()
        if self.s.kafka_port:
            # Also before registering: the Kafka port goes into /servers/<id> with ours.
            self.kafka = make_listener(
                self.s, self.log_manager, self.registry, lambda: self._stopping
            )
            kafka_host = self.s.kafka_host or self.s.host
            try:
                bound = await self.kafka.start(kafka_host, self.s.kafka_port)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"the Kafka listener cannot bind {kafka_host}:{self.s.kafka_port} "
                    f"({exc.strerror or exc}): set PIDLEASE_KAFKA_PORT to a free port (each "
                    "server on one machine needs its own), or 0 for no Kafka listener",
                ) from exc
            self.kafka_port = self.s.kafka_advertised_port or bound
        await self.registry.register(adv_host, adv_port, self.kafka_port)
        await self.registry.refresh()  # arms the watches, now that we are listed
        await self._server.start_serving()
        self.log_manager.replicas.start()
        self._maint = loop.create_task(self.log_manager.maintain())
        log.info(
            "partition server %d serving on %s:%d%s (advertised %s, data %s, fsync=%s%s)",
            self.s.server_id,
            self.s.host,
            self.port,
            " with TLS" if self._ssl else "",
            self.address,
            self.s.data_dir,
            self.s.fsync,
            f", kafka port {self.kafka_port}" if self.kafka is not None else "",
        )

    async def stop(self) -> None:
        # First, still serving, hand every partition this server leads to an in-sync
        # follower (handoff.py: a controlled shutdown; producers see a pause, not errors).
        # Then new requests get SERVER_UNAVAILABLE (retriable); the ones in flight are
        # answered after the final flush, then connections close.
        if self.s.controlled_shutdown_timeout_ms > 0 and self.log_manager.replicas.started:
            try:
                await controlled_shutdown(
                    self.log_manager.replicas, self.s.controlled_shutdown_timeout_ms / 1000
                )
            except Exception as exc:  # noqa: BLE001 - stopping anyway, as after a SIGKILL
                log.warning("controlled shutdown failed: %s", errors.describe(exc))
        self._stopping = True
        if self._server is not None:
            self._server.close()
        if self.kafka is not None:
            await self.kafka.stop()
        if self.metrics_listener is not None:
            await self.metrics_listener.stop()
        if self._maint is not None:
            self._maint.cancel()
        await self.log_manager.close()
        for w in list(self._writers):
            w.close()
        await asyncio.get_running_loop().run_in_executor(None, self.registry.close)
        log.info("partition server %d stopped", self.s.server_id)

    # -- connections -----------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers[writer] = None
        conn = _Conn(self.s.inflight_requests_max_per_connection)
        wtask = asyncio.get_running_loop().create_task(conn.write_loop(writer))
        try:
            await self._read_loop(conn, reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ssl.SSLError as exc:  # a TLS peer sent a bad record after the handshake
            log.warning("closing a TLS connection: %s", errors.describe(exc))
        except Exception:
            log.exception("connection failed")
        finally:
            conn.reading_done()
            try:
                await wtask
            finally:
                self._writers.pop(writer, None)
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()

    def _tls_protocol(self) -> asyncio.BaseProtocol:
        """The protocol of one accepted TLS socket: TLS around a stream protocol."""
        assert self._ssl is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16)
        app = asyncio.StreamReaderProtocol(reader, self._handle)
        waiter: asyncio.Future[None] = loop.create_future()
        proto = sslproto.SSLProtocol(
            loop,
            app,
            self._ssl,
            waiter,
            server_side=True,
            # typeshed says int; asyncio takes any number of seconds.
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,  # type: ignore[arg-type]
        )
        waiter.add_done_callback(functools.partial(self._handshake_done, proto))
        return proto

    def _handshake_done(self, proto: sslproto.SSLProtocol, waiter: asyncio.Future[None]) -> None:
        exc = None if waiter.cancelled() else waiter.exception()
        if exc is None:
            return
        self.tls_handshake_failures += 1
        transport = getattr(proto, "_transport", None)
        peer = transport.get_extra_info("peername") if transport is not None else None
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "a client"
        log.warning(
            "TLS handshake with %s failed (%s: %s); closing the connection",
            where,
            type(exc).__name__,
            str(exc) or "connection closed by the peer",
        )
        if transport is not None:
            transport.abort()

    async def _read_loop(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        frame_max = self.s.frame_bytes_max
        while not conn.dead:
            try:
                body = await read_frame(reader, frame_max)
            except FrameTooLarge as exc:
                # Only the length was read: read the request header to answer it by name.
                n = exc.size
                head = await reader.readexactly(min(n, 5))
                api, corr = _HEAD.unpack(head) if len(head) == 5 else (0, 0)
                self._push(
                    conn,
                    api,
                    corr,
                    error_response(
                        api,
                        corr,
                        RecordTooLarge.code,
                        f"frame of {n} bytes is over the limit of {frame_max}; closing",
                    ),
                )
                log.warning("closing a connection that sent a %d-byte frame", n)
                return
            api, corr = _HEAD.unpack_from(body) if len(body) >= 5 else (0, 0)
            reply = self.dispatch(body, conn.guard)
            if reply is None:
                # A partition unknown here, maybe created a moment ago: read ZooKeeper and
                # dispatch again before reading the next frame, so nothing this connection
                # sent later is applied first (the pipelining guarantee). Other
                # connections are not held up: each has its own read loop.
                key = _partition_of(body, self.log_manager.route)
                reread = not _recently_missing(conn.missing, key, time.monotonic())
                if reread:
                    await self._refresh_assignment()
                reply = self.dispatch(body, conn.guard, refreshed=True)
                assert reply is not None
                if reread and self.log_manager.route(*key) == (None, None):
                    _note_missing(conn.missing, key, time.monotonic())
            elif api in (P.REPLICA_FETCH, P.REPLICA_FETCH_MANY):
                # Let the fetch's task take its first step (check the follower, record its
                # position) before the next frame: only a long-poll's wait and its read of
                # the log come later, and those answer with the state at answer time.
                await asyncio.sleep(0)
            self._push(conn, api, corr, reply)
            if conn.guard.overflowed:
                log.warning(
                    "closing a connection that holds back batches of %d producers", len(conn.guard)
                )
                return
            await conn.wait_for_room()

    def _push(self, conn: _Conn, api: int, corr: int, reply: Reply) -> None:
        conn.push((api, corr), reply)

    # -- dispatch --------------------------------------------------------------------------
    def dispatch(
        self, body: bytes, guard: RefusalGuard | None = None, *, refreshed: bool = False
    ) -> Reply | None:
        """The reply to one request body: bytes now, or a future of bytes, the request
        applied either way. None (only before ``refreshed``) when it names a partition
        unknown here: the caller re-reads ZooKeeper and calls again with ``refreshed``
        before it dispatches anything later. ``guard``: the connection's refusal guard,
        consulted and fed for PRODUCE requests."""
        if guard is not None and len(body) >= 5 and body[0] == P.PRODUCE:
            return self._dispatch_produce(body, guard, refreshed)
        return self._dispatch(body, refreshed)

    def _dispatch_produce(self, body: bytes, guard: RefusalGuard, refreshed: bool) -> Reply | None:
        held: _Batch | None = None
        if guard:  # only while some producer of this connection is held back
            found = self._held_back(body, guard)
            if isinstance(found, bytes):
                return found
            held = found
        reply = self._dispatch(body, refreshed)
        if isinstance(reply, bytes):
            (code,) = _FRAMED_CODE.unpack_from(reply, _FRAMED_CODE_AT)
            if code in _GUARDED_CODES:
                b = held if held is not None else self._peek_key(body)
                if b is not None:
                    guard.note(b.key, b.generation, b.base_sequence, b.last_sequence, code)
        return reply

    def _peek_key(self, body: bytes) -> _Batch | None:
        try:
            return _batch_key(P.decode_request(body))
        except PidleaseError:
            return None  # malformed: it is answered (and refused for good) by _dispatch

    def _held_back(self, body: bytes, guard: RefusalGuard) -> bytes | _Batch | None:
        """The guard's refusal of this PRODUCE, or its key (it may be dispatched), or None
        (no key: pid 0 or malformed)."""
        b = self._peek_key(body)
        if b is None:
            return None
        topic, partition, pid = b.key
        r = guard.blocking(b.key, b.generation, b.base_sequence, b.last_sequence)
        if r is None:
            return b
        part, _ = self.log_manager.route(topic, partition)
        if part is not None and _refused_range_written(part, pid, r):
            guard.clear(b.key)
            return b
        # Held back, so refused too: the range the producer must resend now ends here.
        guard.note(b.key, b.generation, b.base_sequence, b.last_sequence, r.code)
        corr = _HEAD.unpack_from(body)[1]
        return error_response(
            P.PRODUCE,
            corr,
            r.code,
            (
                f"an earlier batch of producer {pid} on this connection "
                f"(sequence {r.base_sequence}) "
                f"was refused ({errors.error_for_code(r.code).name}); resend from sequence "
                f"{r.base_sequence}"
            ),
        )

    async def _refresh_assignment(self) -> None:
        # Bounded: with ZooKeeper unreachable the request is answered from the view we
        # have (UNKNOWN_TOPIC_OR_PARTITION, retriable) rather than holding the connection.
        try:
            await asyncio.wait_for(self.registry.refresh(), self.s.zk_session_timeout_ms / 1000)
        except TimeoutError:
            log.warning(
                "re-reading ZooKeeper took over %d ms; answering from the last view",
                self.s.zk_session_timeout_ms,
            )

    def _dispatch(self, body: bytes, refreshed: bool) -> Reply | None:
        api, corr = _HEAD.unpack_from(body) if len(body) >= 5 else (0, 0)
        try:
            req = P.decode_request(body)
            if self._stopping:
                return error_response(
                    api, corr, errors.ServerUnavailable.code, "server is shutting down; retry"
                )
            if req.api_key == P.METADATA:
                info = self.log_manager.metadata(self.s.server_id, self.address)
                info["ops"] = self.metrics.summary()  # the coordinator's dashboard reads it
                return P.metadata_response(corr, 0, info=info)
            if api == P.PRODUCE:
                return self._produce(req, refreshed)
            if api == P.REPLICA_FETCH_MANY:
                return asyncio.ensure_future(self.log_manager.replicas.replica_fetch_many(req))
            if api == P.PRODUCER_LIST:
                parts, more = self.log_manager.producer_list(
                    req.max_bytes, (req.topic, req.partition, req.pid)
                )
                return P.producer_list_response(corr, 0, "", parts, more)
            if api in P.MANY_APIS:
                return self._many(req, refreshed)
            part, leader = self.log_manager.route(req.topic, req.partition)
            if part is None:
                return _not_routed(req, leader, refreshed)
            if api == P.FETCH:
                return self._fetch(req, part)
            if api == P.LIST_OFFSETS:
                return self._list_offsets(req, part)
            if api == P.FENCE:
                return self._fence(req, part)
            if api == P.REPLICA_FETCH:
                return asyncio.ensure_future(self.log_manager.replicas.replica_fetch(req, part))
            if api == P.EPOCH_END:
                return self.log_manager.replicas.epoch_end(req, part)
            return self._producer_state(req, part)
        except PidleaseError as exc:
            if len(body) < 5:
                return P.response(corr, exc.code, f"frame too short: {exc.detail}", b"")
            return error_response(api, corr, exc.code, exc.detail)
        except Exception as exc:
            log.exception("request %d (api %d) failed", corr, api)
            return error_response(api, corr, errors.PidleaseError.code, f"internal error: {exc}")

    def _produce(self, req: P.Request, refreshed: bool) -> Reply | None:
        """PRODUCE through the one produce path (produce.py): routed, checked (size,
        checksum, lease token) and appended in one call, no await in between."""
        started_s = time.perf_counter()
        corr = req.correlation_id
        batch = req.batch
        assert batch is not None

        def check(part: Partition) -> P.BatchHeader:
            if len(batch) > self.s.batch_bytes_max:
                raise RecordTooLarge(
                    f"batch of {len(batch)} bytes is over the limit of {self.s.batch_bytes_max}"
                )
            h = P.validate_batch(batch)
            if h.size != len(batch):
                raise CorruptRecord(f"{len(batch) - h.size} bytes after the batch")
            if h.is_control:
                raise InvalidRequest("producers may not write control batches")
            if h.pid > 0:
                verify_token(self.s.secret_bytes, req.token, h.pid, h.generation, self.clock_ms())
            return h

        r = self.log_manager.produce.produce(
            req.topic,
            req.partition,
            batch,
            check,
            lambda base, last: P.produce_response(corr, 0, base_offset=base, last_offset=last),
            started_s=started_s,
        )
        if isinstance(r, NotRouted):
            return _not_routed(req, r.leader, refreshed)
        if r.durable is not None:
            return r.durable
        d = r.decision
        if d.outcome is Outcome.DUPLICATE:
            return P.produce_response(
                corr,
                errors.DUPLICATE,
                d.detail,
                base_offset=d.base_offset,
                last_offset=d.last_offset,
            )
        return P.produce_response(
            corr, _OUTCOME_CODES[d.outcome], d.detail, expected_sequence=d.expected_sequence
        )

    def _fetch(self, req: P.Request, part: Partition) -> Reply:
        if req.offset < 0:
            raise InvalidRequest(f"fetch offset must be >= 0, got {req.offset}")
        max_bytes = min(max(req.max_bytes, 1), self.s.fetch_bytes_max)
        try:
            chunks = part.fetch(req.offset, max_bytes)
        except errors.OffsetOutOfRange as exc:
            # The bounds travel in the response's own fields (earliest, latest).
            return P.fetch_response(
                req.correlation_id,
                exc.code,
                exc.detail,
                high_watermark=exc.latest,
                log_start_offset=exc.earliest,
            )
        return P.fetch_response(
            req.correlation_id,
            0,
            high_watermark=part.high_watermark,
            log_start_offset=part.log.log_start_offset,
            data=chunks,
        )

    def _list_offsets(self, req: P.Request, part: Partition) -> Reply:
        # Inline, as FETCH reads the log inline: a lookup is a few header reads per
        # segment the time falls in (the page cache holds the recent ones).
        if req.timestamp_ms < P.EARLIEST_TIMESTAMP:
            raise InvalidRequest(
                f"list_offsets timestamp must be >= 0 (a time in ms), -1 (latest) or "
                f"-2 (earliest), got {req.timestamp_ms}"
            )
        return P.list_offsets_response(
            req.correlation_id,
            0,
            offset=part.offset_for_timestamp(req.timestamp_ms),
            log_start_offset=part.log.log_start_offset,
            high_watermark=part.high_watermark,
        )

    def _fence_checks(self, req: P.Request, flags: int) -> None:
        if req.pid == 0 or req.pid > P.MAX_PID:
            raise InvalidRequest(f"fence needs a pid in 1..2**63-1, got {req.pid}")
        if req.generation > P.MAX_GENERATION:
            raise InvalidRequest(f"generation {req.generation} is over 2**31-1")
        if flags & ~P.FENCE_CREATE_IF_ABSENT:
            raise InvalidRequest(f"unknown fence flags {flags:#x}")
        verify_token(self.s.secret_bytes, req.token, req.pid, req.generation, self.clock_ms())

    def _fence(self, req: P.Request, part: Partition) -> Reply:
        self._fence_checks(req, req.flags)
        corr = req.correlation_id

        def answer(
            code: int, detail: str, existed: bool, dhw: int, offset: int, dropped: int
        ) -> bytes:
            return P.fence_response(
                corr,
                code,
                detail,
                existed=existed,
                durable_highwater=dhw,
                fence_offset=offset,
                dropped_last_use_max_ms=dropped,
            )

        return self._fence_on(part, req, req.flags, req.leased_since_ms, answer)

    def _fence_on(
        self,
        part: Partition,
        req: P.Request,
        flags: int,
        leased_since_ms: int,
        answer: Callable[[int, str, bool, int, int, int], bytes],
    ) -> Reply:
        """FENCE of ``req.pid`` at ``req.generation`` on ``part`` (checked already); the
        answer, now or once durable, built by ``answer(code, detail, existed,
        durable_highwater, fence_offset, dropped_last_use_max_ms)``. One code for FENCE
        and each partition of FENCES."""
        create = bool(flags & P.FENCE_CREATE_IF_ABSENT)
        # Read where the fence is decided (no await before it): the coordinator judges a
        # not-created answer by the same value the decision used.
        dropped = part.state.dropped_last_use_max_ms

        def ok(existed: bool, durable_hw: int, fence_offset: int) -> bytes:
            return answer(0, "", existed, durable_hw, fence_offset, dropped)

        outcome, fut = part.fence(
            req.pid, req.generation, create, ok, leased_since_ms=leased_since_ms
        )
        if outcome is FenceOutcome.FENCED:
            e = part.state.get(req.pid)
            return answer(
                errors.ProducerFenced.code,
                f"generation {req.generation} is older than the current "
                f"{e.generation if e else '?'}",
                True,
                e.durable_highwater if e else -1,
                -1,
                0,
            )
        if outcome is FenceOutcome.APPEND:
            self.log_manager.note_append()
            self.metrics.fenced(part.topic, part.partition, req.pid, req.generation)
            log.info(
                "fence %s-%d pid %d generation %d",
                part.topic,
                part.partition,
                req.pid,
                req.generation,
            )
        return fut

    def _many(self, req: P.Request, refreshed: bool) -> Reply | None:
        """PRODUCER_STATES / FENCES: the per-partition code of PRODUCER_STATE / FENCE on
        each partition named, one entry each in request order, answered once every entry
        is (a fence's once it is durable). A partition not led here is that entry's
        NOT_LEADER / UNKNOWN_TOPIC_OR_PARTITION; a bad pid, generation, flag or token
        refuses the whole request. Partitions unknown here (None before ``refreshed``):
        ZooKeeper is re-read once for the whole request."""
        assert req.entries is not None
        routes = [self.log_manager.route(e.topic, e.partition) for e in req.entries]
        if not refreshed and any(r == (None, None) for r in routes):
            return None
        fence = req.api_key == P.FENCES
        if fence:
            for e in req.entries:
                self._fence_checks(req, e.flags)
        encode = P.fence_entry if fence else P.state_entry
        out: list[Reply] = []
        for e, (part, leader) in zip(req.entries, routes, strict=True):
            if part is None:
                if leader is None:
                    out.append(
                        encode(
                            errors.UnknownTopicOrPartition.code,
                            f"no partition {e.topic}/{e.partition}",
                        )
                    )
                else:
                    out.append(
                        encode(
                            errors.NotLeader.code,
                            f"this server does not lead {e.topic}/{e.partition}"
                            + (f"; the leader is {leader}" if leader else ""),
                        )
                    )
                continue
            if not fence:
                found, gen, dhw, last_use = part.producer_state(req.pid)
                out.append(
                    P.state_entry(
                        0,
                        found=found,
                        generation=gen,
                        durable_highwater=dhw,
                        last_use_ms=last_use,
                        dropped_last_use_max_ms=part.state.dropped_last_use_max_ms,
                    )
                )
                continue
            try:
                out.append(self._fence_on(part, req, e.flags, e.leased_since_ms, _fence_entry))
            except PidleaseError as exc:  # NOT_ENOUGH_REPLICAS: nothing changed there
                out.append(P.fence_entry(exc.code, exc.detail))
        return _all_entries(req.correlation_id, out, encode)

    def _producer_state(self, req: P.Request, part: Partition) -> Reply:
        found, gen, dhw, last_use = part.producer_state(req.pid)
        return P.producer_state_response(
            req.correlation_id,
            0,
            found=found,
            generation=gen,
            durable_highwater=dhw,
            last_use_ms=last_use,
            dropped_last_use_max_ms=part.state.dropped_last_use_max_ms,
        )


def _fence_entry(
    code: int, detail: str, existed: bool, dhw: int, offset: int, dropped: int
) -> bytes:
    return P.fence_entry(
        code,
        detail,
        existed=existed,
        durable_highwater=dhw,
        fence_offset=offset,
        dropped_last_use_max_ms=dropped,
    )


def _all_entries(corr: int, entries: list[Reply], encode: Callable[..., bytes]) -> Reply:
    """One PRODUCER_STATES / FENCES answer of ``entries`` (each bytes or the future of its
    bytes): now when all are known, else once the last future is done. A future that
    fails (the partition's role changed before its fence was durable) is that entry's
    error, not the whole answer's."""
    waiting = [(i, x) for i, x in enumerate(entries) if not isinstance(x, bytes)]
    if not waiting:
        return P.entries_response(corr, 0, "", [x for x in entries if isinstance(x, bytes)])

    async def gather() -> bytes:
        got = await asyncio.gather(*(f for _, f in waiting), return_exceptions=True)
        done = list(entries)
        for (i, _), g in zip(waiting, got, strict=True):
            if isinstance(g, bytes):
                done[i] = g
            elif isinstance(g, PidleaseError):
                done[i] = encode(g.code, g.detail)
            else:
                done[i] = encode(errors.PidleaseError.code, f"internal error: {g!r}")
        return P.entries_response(corr, 0, "", [x for x in done if isinstance(x, bytes)])

    return asyncio.ensure_future(gather())


def _not_routed(req: P.Request, leader: str | None, refreshed: bool) -> bytes | None:
    """The answer to a request for a partition this server does not lead: None (re-read
    ZooKeeper, then dispatch again) when it is not known and was not re-read yet."""
    api, corr = req.api_key, req.correlation_id
    if leader is None and not refreshed:
        return None
    if leader is None:
        return error_response(
            api,
            corr,
            errors.UnknownTopicOrPartition.code,
            f"no partition {req.topic}/{req.partition}",
        )
    return error_response(
        api,
        corr,
        errors.NotLeader.code,
        f"this server does not lead {req.topic}/{req.partition}"
        + (f"; the leader is {leader}" if leader else ""),
        leader=leader,
    )


def _refused_range_written(part: Partition, pid: int, r: Refusal) -> bool:
    """Whether the partition's highwater for the producer covers the refused range already
    (written another way, e.g. through another leader since): nothing to wait for. The
    whole range, not its first batch: a leader may hold the first refused batch and not a
    later one the guard held back (a new leader with a prefix of the old one's log).
    A topic without dedup keeps no state and promises no order across retries, so a held
    key never waits on it (it could wait forever for a resend that went elsewhere)."""
    if not part.state.tracks(pid):
        return True
    e = part.state.get(pid)
    # A newer generation there: the partition fences this batch, an answer the producer
    # must hear rather than a retry forever.
    return e is not None and (e.generation > r.generation or e.highwater >= r.last_sequence)


# A connection pipelining requests for a partition that does not exist would otherwise
# pay one whole ZooKeeper read per request, one after another.
MISSING_MEMO_S = 1.0
MISSING_MEMO_KEYS_MAX = 64


def _partition_of(
    body: bytes, route: Callable[[str, int], tuple[object, object]]
) -> tuple[str, int]:
    """The partition a request was held back for (of many: the first not known here)."""
    req = P.decode_request(body)  # it routed once already, so it decodes
    for e in req.entries or ():
        if route(e.topic, e.partition) == (None, None):
            return e.topic, e.partition
    return req.topic, req.partition


def _recently_missing(
    missing: dict[tuple[str, int], float], key: tuple[str, int], now_s: float
) -> bool:
    at = missing.get(key)
    return at is not None and now_s - at < MISSING_MEMO_S


def _note_missing(
    missing: dict[tuple[str, int], float], key: tuple[str, int], now_s: float
) -> None:
    missing.pop(key, None)
    if len(missing) >= MISSING_MEMO_KEYS_MAX:
        del missing[next(iter(missing))]  # the oldest
    missing[key] = now_s
