"""The Kafka listener's connections: size-prefixed frames (``FrameDecoder``, the same
framing as our own port: a 4-byte big-endian size), request headers, the SASL gate, and
answers in request order however long each takes (a produce waiting for its replicas
holds back the answers behind it, not their processing).

Bad input never reaches a log: an oversize frame, a header or body that does not decode,
an API key we do not know, or a request before SASL when SASL is required closes the
connection (as a Kafka broker does); a known API at a version we do not speak is answered
UNSUPPORTED_VERSION in that version's shape (ApiVersions: in v0, with our list).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from typing import Any

from partition_server.kafka import codec as C
from partition_server.kafka.apis import KafkaApis, Session
from partition_server.ordered import OrderedReplies
from pidlease.wire.framing import FrameDecoder, FrameTooLarge
from pidlease.wire.kafka_errors import UNKNOWN_SERVER_ERROR
from pidlease.wire.tls import HANDSHAKE_TIMEOUT_S

log = logging.getLogger("partition_server.kafka")

READ_CHUNK = 1 << 16
_OPEN = frozenset([C.API_VERSIONS, C.SASL_HANDSHAKE, C.SASL_AUTHENTICATE])


class _Close(Exception):
    """Stop reading this connection (answers already queued still go out)."""


Meta = tuple[C.Header | None, Any]  # (header, request); header None for a raw SASL answer


def _failed_answer(apis: KafkaApis, meta: Meta, exc: Exception) -> bytes:
    h, req = meta
    assert h is not None  # only a handler's future can fail; a raw SASL answer is bytes
    log.error("Kafka request %d (api %d) failed", h.correlation_id, h.api_key, exc_info=exc)
    return apis.error_reply(h, req, UNKNOWN_SERVER_ERROR)


class _Conn(OrderedReplies[Meta]):
    """One connection: its answers in request order (``ordered.py``) and its session."""

    __slots__ = ("session",)

    def __init__(self, apis: KafkaApis, inflight_max: int) -> None:
        super().__init__(inflight_max, functools.partial(_failed_answer, apis))
        self.session = Session()


class KafkaListener:
    def __init__(
        self,
        apis: KafkaApis,
        *,
        frame_bytes_max: int,
        inflight_max: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.apis = apis
        self.frame_bytes_max = frame_bytes_max
        self.inflight_max = inflight_max
        self._ssl = ssl_context
        self._server: asyncio.AbstractServer | None = None
        self._writers: dict[asyncio.StreamWriter, None] = {}  # closed at stop in this order
        self.port = 0
        self.connections_closed_bad_input = 0

    async def start(self, host: str, port: int) -> int:
        """Bind and serve; the bound port (``port`` 0 picks one)."""
        self._server = await asyncio.start_server(
            self._handle,
            host,
            port,
            ssl=self._ssl,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self._ssl else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.apis.groups.start()
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.apis.groups.close()
        for w in list(self._writers):
            w.close()

    # -- one connection --------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers[writer] = None
        conn = _Conn(self.apis, self.inflight_max)
        wtask = asyncio.get_running_loop().create_task(conn.write_loop(writer))
        try:
            await self._read_loop(conn, reader)
        except _Close as exc:
            self.connections_closed_bad_input += 1
            log.warning("closing a Kafka connection: %s", exc)
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        except Exception:
            log.exception("Kafka connection failed")
        finally:
            conn.reading_done()
            try:
                await wtask
            finally:
                self._writers.pop(writer, None)
                writer.close()
                with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
                    await writer.wait_closed()

    async def _read_loop(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        decoder = FrameDecoder(self.frame_bytes_max)
        while not conn.dead:
            data = await reader.read(READ_CHUNK)
            if not data:
                return
            try:
                frames = decoder.feed(data)
            except FrameTooLarge as exc:
                for frame in exc.frames:
                    await self._one(conn, frame)
                raise _Close(f"frame of {exc.size} bytes over the limit {exc.max_bytes}") from None
            for frame in frames:
                await self._one(conn, frame)
                if conn.session.close_after_reply:
                    return
                await conn.wait_for_room()

    async def _one(self, conn: _Conn, frame: bytes) -> None:
        session = conn.session
        if session.raw_sasl and not session.authenticated:
            # After SaslHandshake v0 the client sends the bare PLAIN token, framed.
            why = self.apis.authenticate(frame, session)
            if why is not None:
                raise _Close(why)
            session.raw_sasl = False
            self._push(conn, None, None, b"\0\0\0\0")
            return
        try:
            k, v, corr = C.peek(frame)
        except C.CodecError as exc:
            raise _Close(str(exc)) from None
        if self.apis.principals.required and not session.authenticated and k not in _OPEN:
            raise _Close(f"API {k} before SASL authentication")
        if not C.supported(k, v):
            if k == C.API_VERSIONS:
                self._push(conn, None, None, KafkaApis.api_versions_unsupported(corr))
                return
            if not C.known_shape(k, v):
                raise _Close(f"unknown API {k} version {v}")
            h, req = self._decode(frame)
            self._push(conn, h, req, self.apis.error_reply(h, req, 35))
            return
        h, req = self._decode(frame)
        reply = await self.apis.handle(h, req, session)
        if reply is not None:
            self._push(conn, h, req, reply)

    @staticmethod
    def _decode(frame: bytes) -> tuple[C.Header, Any]:
        try:
            h = C.parse_header(frame)
            return h, C.decode_request(frame, h)
        except C.CodecError as exc:
            raise _Close(str(exc)) from None

    def _push(
        self, conn: _Conn, h: C.Header | None, req: Any, reply: bytes | asyncio.Future[bytes]
    ) -> None:
        conn.push((h, req), reply)
