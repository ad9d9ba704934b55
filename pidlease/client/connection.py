"""Connections from a client to one partition server, speaking ``pidlease.wire.protocol``.

``Connection`` is the producer's: asyncio, pipelined (many requests written before the
first answer arrives), answers matched to requests by correlation id. The server answers
one connection's requests in the order they were written, which is what keeps a
partition's in-flight batches in order. When the connection dies (EOF, reset, a frame
that does not parse, a request past its timeout, or ``abort()``), every outstanding
request fails with ``ServerUnavailable`` and the connection is never used again: after a
lost answer nothing later on the same stream can be trusted, so the caller reconnects and
resends.

``BlockingConnection`` is the reader's: one request at a time on a plain socket, so an
iterator needs no event loop (``pidlease.wire.blocking_conn``, shared with the
coordinator's calls to partition leaders; re-exported here).

Both take ``ssl_context`` (``pidlease.wire.tls.client_ssl_context``) to speak TLS; a server
certificate the context does not trust fails the connect with ``Unauthorized`` (not
retriable), any other handshake failure with ``ServerUnavailable``.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from typing import Any, cast

from pidlease.errors import CorruptRecord, ServerUnavailable
from pidlease.wire import protocol
from pidlease.wire.blocking_conn import BlockingConnection, split_address
from pidlease.wire.framing import FrameDecoder, FrameTooLarge
from pidlease.wire.tls import HANDSHAKE_TIMEOUT_S, connect_error

__all__ = ["BlockingConnection", "Connection", "split_address"]

CONNECT_TIMEOUT_MS_DEFAULT = 5_000
REQUEST_TIMEOUT_MS_DEFAULT = 30_000


class _Protocol(asyncio.Protocol):
    """Frames bytes off the socket and hands each response body to its Connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.decoder = FrameDecoder(conn.frame_bytes_max)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (create_connection's; uvloop's is not an asyncio.Transport subclass)
        self.conn.attach(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except FrameTooLarge as exc:
            for body in exc.frames:  # the answers before it are whole: hand them over
                self.conn.frame_received(body)
            self.conn.lost(f"server sent a frame of {exc.size} bytes, over the limit")
            return
        for body in frames:
            self.conn.frame_received(body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.lost(f"connection to {self.conn.address} lost" + (f": {exc}" if exc else ""))


class Connection:
    """A pipelined asyncio connection to the partition server at ``address``."""

    def __init__(
        self, address: str, *, frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT
    ) -> None:
        self.address = address
        self.frame_bytes_max = frame_bytes_max
        self._transport: asyncio.Transport | None = None
        self._corr = itertools.count(1)
        # correlation id -> (api key, answer future, timeout handle)
        self._waiting: dict[
            int, tuple[int, asyncio.Future[protocol.Response], asyncio.TimerHandle | None]
        ] = {}
        self._closed_reason: str | None = None
        # Monotonic time of the last sign of life while requests wait: an answer, or the
        # first request sent when none was waiting (``silent_ms``).
        self._heard_at = time.monotonic()

    @classmethod
    async def open(
        cls,
        address: str,
        *,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS_DEFAULT,
        frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT,
        ssl_context: ssl.SSLContext | None = None,
    ) -> Connection:
        host, port = split_address(address)
        conn = cls(address, frame_bytes_max=frame_bytes_max)
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if ssl_context is not None:
            tls = {
                "ssl": ssl_context,
                "server_hostname": host,
                "ssl_handshake_timeout": min(HANDSHAKE_TIMEOUT_S, connect_timeout_ms / 1000),
            }
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(conn), host, port, **tls),
                connect_timeout_ms / 1000,
            )
        except (TimeoutError, OSError) as exc:
            raise connect_error(address, exc) from exc
        # (asyncio sets TCP_NODELAY on its TCP transports itself.)
        if conn.closed:
            raise ServerUnavailable(conn._closed_reason or f"connection to {address} lost at once")
        return conn

    def attach(self, transport: asyncio.Transport) -> None:
        """The socket is connected (``_Protocol.connection_made``): requests go to it."""
        self._transport = transport

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    @property
    def outstanding(self) -> int:
        return len(self._waiting)

    def silent_ms(self) -> float:
        """How long requests have waited here with no answer at all (0: none waiting)."""
        if not self._waiting:
            return 0.0
        return (time.monotonic() - self._heard_at) * 1000

    def next_correlation_id(self) -> int:
        return next(self._corr) & 0xFFFFFFFF

    def send(
        self,
        api_key: int,
        correlation_id: int,
        data: bytes,
        *,
        timeout_ms: int | None = REQUEST_TIMEOUT_MS_DEFAULT,
    ) -> asyncio.Future[protocol.Response]:
        """Write one framed request (built with ``correlation_id``) and return the future
        of its answer. Never raises: on a dead connection the future is already failed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[protocol.Response] = loop.create_future()
        if self._transport is not None and self._transport.is_closing():
            self.lost(f"connection to {self.address} is closing")
        if self._closed_reason is not None or self._transport is None:
            fut.set_exception(ServerUnavailable(self._closed_reason or "connection is not open"))
            return fut
        timer = None
        if timeout_ms is not None:
            timer = loop.call_later(timeout_ms / 1000, self._timed_out, correlation_id, timeout_ms)
        if not self._waiting:
            self._heard_at = time.monotonic()
        self._waiting[correlation_id] = (api_key, fut, timer)
        self._transport.write(data)
        return fut

    async def request(
        self,
        api_key: int,
        build: Any,
        *,
        timeout_ms: int | None = REQUEST_TIMEOUT_MS_DEFAULT,
    ) -> protocol.Response:
        """Send ``build(correlation_id)`` and wait for its answer."""
        corr = self.next_correlation_id()
        return await self.send(api_key, corr, build(corr), timeout_ms=timeout_ms)

    def abort(self, reason: str = "connection aborted") -> None:
        """Cut the connection at once, as a network failure would (no goodbye)."""
        if self._transport is not None:
            self._transport.abort()
        self.lost(reason)

    async def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            _shut(self._transport)
        self.lost("connection closed by the client")
        await asyncio.sleep(0)  # let the transport's connection_lost run before the loop may close

    # -- internals ----------------------------------------------------------------------
    def frame_received(self, body: bytes) -> None:
        """One whole frame from the transport half (``_Protocol``): match it to its request."""
        if len(body) < 4:
            self.lost("server sent a frame too short to hold a correlation id")
            return
        corr = protocol.peek_correlation_id(body)
        self._heard_at = time.monotonic()
        entry = self._waiting.pop(corr, None)
        if entry is None:
            self.lost(f"server answered unknown correlation id {corr}")
            return
        api_key, fut, timer = entry
        if timer is not None:
            timer.cancel()
        try:
            resp = protocol.decode_response(api_key, body)
        except (CorruptRecord, ValueError) as exc:
            fut.set_exception(ServerUnavailable(f"malformed answer from {self.address}: {exc}"))
            self.lost(f"malformed answer from {self.address}")
            return
        if not fut.done():
            fut.set_result(resp)

    def _timed_out(self, corr: int, timeout_ms: int) -> None:
        if corr in self._waiting:
            self.abort(f"no answer from {self.address} within {timeout_ms} ms")

    def lost(self, reason: str) -> None:
        """The connection is gone (or given up) for ``reason``: close it and fail every
        request still waiting with ``ServerUnavailable`` naming the reason."""
        if self._closed_reason is None:
            self._closed_reason = reason
        if self._transport is not None and not self._transport.is_closing():
            _shut(self._transport)
        waiting, self._waiting = self._waiting, {}
        for _api, fut, timer in waiting.values():
            if timer is not None:
                timer.cancel()
            if not fut.done():
                fut.set_exception(ServerUnavailable(self._closed_reason))


def _shut(transport: asyncio.Transport) -> None:
    # A TLS close waits for the peer's close_notify (up to 30 s), which may outlive the
    # event loop and leak the socket; framing already tells a whole answer from a cut one,
    # so a TLS connection is simply aborted.
    if transport.get_extra_info("ssl_object") is not None:
        transport.abort()
    else:
        transport.close()
