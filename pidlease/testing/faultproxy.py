"""A loopback TCP proxy with network faults on demand, for the chaos suite and fuzz tests
(public, like ``trio.testing``'s fake network).

``FaultProxy(target).start()`` listens on a free 127.0.0.1 port and forwards every
connection to ``target`` ("host:port"). Faults, callable from any thread:

- ``drop_all()``: abort every open connection at once (both sides see a reset);
- ``set_delay(seconds)``: hold every chunk that long before forwarding it, both ways;
- ``blackhole(seconds)``: drop everything now, then for ``seconds`` accept new
  connections but forward nothing either way (a dead link: requests time out rather
  than being refused); it heals by itself, or at ``heal()``.

It runs its own event loop on a daemon thread so a blocking test can drive it. Every
loop is bounded by the connections' own lifetimes; ``close()`` ends them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

_T = TypeVar("_T")

_CHUNK_BYTES_MAX = 64 * 1024
_CALL_TIMEOUT_S = 10.0


class FaultProxy:
    """Forward 127.0.0.1:<port> to ``target``, with faults (see the module docstring)."""

    def __init__(self, target: str, *, listen_host: str = "127.0.0.1") -> None:
        host, _, port = target.rpartition(":")
        self.target = (host or "127.0.0.1", int(port))
        self.listen_host = listen_host
        self.port = 0
        self.delay_s = 0.0
        self.connections_accepted = 0
        self.connections_dropped = 0
        self._blackhole_until = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # -- addresses -----------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    @property
    def url(self) -> str:
        """``http://`` form of the address, for proxying an HTTP service."""
        return f"http://{self.address}"

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> Self:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        self._call(self._listen())
        return self

    def close(self) -> None:
        """Stop listening and drop every connection. Idempotent."""
        if self._loop is None or self._thread is None:
            return
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=_CALL_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CALL_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults --------------------------------------------------------------------------
    @property
    def is_blackholed(self) -> bool:
        return time.monotonic() < self._blackhole_until

    def drop_all(self) -> int:
        """Abort every open connection; returns how many were dropped."""
        return self._call(self._drop_all())

    def set_delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self.delay_s = seconds

    def blackhole(self, seconds: float) -> None:
        """Drop every connection now and forward nothing for ``seconds``."""
        self._blackhole_until = time.monotonic() + seconds
        self.drop_all()

    def heal(self) -> None:
        """End a blackhole and any delay now."""
        self._blackhole_until = 0.0
        self.delay_s = 0.0

    # -- the event loop side ---------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not started")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout=_CALL_TIMEOUT_S)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._drop_all()

    async def _drop_all(self) -> int:
        writers, self._writers = list(self._writers), set()
        for w in writers:
            transport = w.transport
            with contextlib.suppress(Exception):
                transport.abort()  # an RST, as a cut link or a dead peer gives
        self.connections_dropped += len(writers) // 2
        return len(writers) // 2

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        try:
            u_reader, u_writer = await asyncio.open_connection(*self.target)
        except OSError:
            c_writer.transport.abort()
            return
        pair = {c_writer, u_writer}
        self._writers |= pair
        try:
            await asyncio.gather(self._pipe(c_reader, u_writer), self._pipe(u_reader, c_writer))
        finally:
            for w in pair:
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction until EOF or an error; blackholed chunks are discarded."""
        try:
            while True:
                chunk = await reader.read(_CHUNK_BYTES_MAX)
                if not chunk:
                    break
                if self.delay_s > 0:
                    await asyncio.sleep(self.delay_s)
                if self.is_blackholed or writer not in self._writers:
                    continue
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, RuntimeError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
