"""The partition server's tiny HTTP listener: ``GET /metrics`` (Prometheus text from
``metrics.py``) and ``GET /healthz``, on ``metrics_host:metrics_port`` (port 0 = off).

Deliberately minimal, on the server's own event loop: one request per connection, no
keep-alive, a bounded request size and read time, so a stuck or hostile scraper costs one
socket for a few seconds and never touches the append path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("partition_server.metrics_listener")

REQUEST_BYTES_MAX = 8192  # a scrape request is one short GET; refuse anything bigger
REQUEST_TIMEOUT_S = 5.0  # a client that sends nothing is dropped, never held forever


class MetricsListener:
    """``GET /metrics`` (Prometheus text) and ``GET /healthz`` over HTTP/1.1, one request
    per connection. Deliberately tiny: bounded request size and read time, no keep-alive."""

    def __init__(self, render: Callable[[], str], host: str, port: int) -> None:
        self._render = render
        self.host = host
        self.port = port
        self._server: asyncio.AbstractServer | None = None
        self.scrapes = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=REQUEST_BYTES_MAX
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            status, ctype, body = self._answer(head)
        except (
            asyncio.LimitOverrunError,
            asyncio.IncompleteReadError,
            TimeoutError,
            ConnectionError,
            ValueError,
        ):
            status, ctype, body = "400 Bad Request", "text/plain", b"bad request\n"
        try:
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        if path == "/metrics":
            self.scrapes += 1
            return "200 OK", "text/plain; version=0.0.4", self._render().encode()
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        return "404 Not Found", "text/plain", b"try /metrics\n"
