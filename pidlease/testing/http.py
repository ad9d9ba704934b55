"""A lean HTTP/1.1 client for the coordinator's JSON API, for load tests, the lease
benchmark and integration tests that check statuses and bodies one request at a time.

httpx's async pool spends more CPU per request than the coordinator does once hundreds of
connections are open (about 190 requests/s at 50 connections on a 2-core machine, against
about 1,800/s for this client), so measuring the coordinator through it would measure
httpx. ``HttpConnection`` keeps one keep-alive connection, sends JSON, reads
``content-length`` bodies, and reconnects after a connection is lost; ``run_many`` posts
many bodies over many such connections with retries. It checks nothing itself: every
``Reply`` comes back with its status, decoded body and latency for the test to judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(slots=True)
class Reply:
    """One answer: HTTP status (0 when ``run_many`` gave up), decoded JSON body, and the
    time from sending to the whole body read."""

    status: int
    body: dict[str, Any]
    latency_s: float


class HttpConnection:
    """One keep-alive connection to ``base_url``; ``request`` reconnects when needed and
    raises ``ConnectionError`` (or ``OSError``/``asyncio.TimeoutError``) when it cannot."""

    def __init__(
        self, base_url: str, *, timeout_s: float = 30.0, headers: dict[str, str] | None = None
    ) -> None:
        u = urlsplit(base_url)
        self.extra_headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.timeout_s = timeout_s
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self._r, self._w = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self.timeout_s
        )

    async def close(self) -> None:
        if self._w is not None:
            self._w.close()
            with contextlib.suppress(OSError):  # the peer may have reset it first
                await self._w.wait_closed()
        self._r = self._w = None

    async def request(self, method: str, path: str, body: Any = None) -> Reply:
        started = time.perf_counter()
        try:
            return await asyncio.wait_for(
                self._request(method, path, body, started), self.timeout_s
            )
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            await self.close()
            raise ConnectionError(f"{method} {path}: {exc!r}") from exc

    async def _request(self, method: str, path: str, body: Any, started: float) -> Reply:
        if self._w is None:
            await self._connect()
        assert self._r is not None and self._w is not None
        raw = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(raw)}\r\n"
            f"{self.extra_headers}\r\n"
        )
        self._w.write(head.encode() + raw)
        await self._w.drain()
        status_line_and_headers = await self._r.readuntil(b"\r\n\r\n")
        lines = status_line_and_headers.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        data = await self._r.readexactly(length)
        if close:
            await self.close()
        return Reply(status, json.loads(data) if data else {}, time.perf_counter() - started)


async def run_many(
    base_url: str,
    bodies: list[dict[str, Any]],
    *,
    connections: int,
    path: str = "/v1/lease_pid",
    attempts_max: int = 100,
    retry_statuses: tuple[int, ...] = (503,),
    timeout_s: float = 30.0,
    on_reply: Any = None,
    headers: dict[str, str] | None = None,
) -> list[Reply]:
    """POST every body with ``connections`` concurrent keep-alive connections; a lost
    connection or a retriable status is retried with a short backoff, at most
    ``attempts_max`` times per body. Returns the final reply of each body, in order.
    ``headers`` go on every request (e.g. ``{"authorization": "Bearer <token>"}``)."""
    replies: list[Reply | None] = [None] * len(bodies)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)

    async def worker() -> None:
        conn = HttpConnection(base_url, timeout_s=timeout_s, headers=headers)
        try:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                for attempt in range(attempts_max):
                    try:
                        reply = await conn.request("POST", path, bodies[i])
                    except ConnectionError:
                        await asyncio.sleep(min(0.5, 0.01 * (attempt + 1)))
                        continue
                    if reply.status in retry_statuses and attempt + 1 < attempts_max:
                        await asyncio.sleep(min(0.5, 0.01 * (attempt + 1)))
                        continue
                    replies[i] = reply
                    if on_reply is not None:
                        on_reply(reply)
                    break
                else:
                    replies[i] = Reply(0, {"error": "CLIENT_GAVE_UP"}, 0.0)
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return [r if r is not None else Reply(0, {"error": "NOT_SENT"}, 0.0) for r in replies]
