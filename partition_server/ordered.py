"""One connection's answers in request order, for both listeners (``server.py``, our
protocol, and ``kafka/listener.py``): each request is applied when read, its answer is
bytes now or a future of bytes, and the answers go out in the order the requests came,
however long each takes (a produce waiting for its replicas holds back the answers behind
it, not their processing). At most ``inflight_max`` answers wait per connection: the read
loop stops reading until one goes out.

A future that fails is answered by the listener's ``on_error(meta, exc)`` in the shape of
its request (``meta`` is what the listener pushed with it: the API and correlation id).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["OrderedReplies"]

Meta = TypeVar("Meta")
Answer = bytes | asyncio.Future[bytes]
# Flush the stream once this much is buffered, even with answers still to write.
DRAIN_BYTES = 1 << 20


class OrderedReplies(Generic[Meta]):
    __slots__ = ("dead", "eof", "inflight_max", "on_error", "pending", "space", "wake")

    def __init__(self, inflight_max: int, on_error: Callable[[Meta, Exception], bytes]) -> None:
        self.pending: deque[tuple[Meta, Answer]] = deque()
        self.wake = asyncio.Event()
        self.space = asyncio.Event()
        self.eof = False  # the read side is done: write what is queued, then stop
        self.dead = False  # the write side failed: stop reading
        self.inflight_max = inflight_max
        self.on_error = on_error

    def push(self, meta: Meta, answer: Answer) -> None:
        self.pending.append((meta, answer))
        self.wake.set()

    async def wait_for_room(self) -> None:
        """Return once fewer than ``inflight_max`` answers wait (or the connection died)."""
        while len(self.pending) >= self.inflight_max and not self.dead:
            self.space.clear()
            await self.space.wait()

    def reading_done(self) -> None:
        self.eof = True
        self.wake.set()

    async def write_loop(self, writer: asyncio.StreamWriter) -> None:
        """Write the answers in order until the read side is done and all are written."""
        try:
            while True:
                if not self.pending:
                    if self.eof:
                        return
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                meta, answer = self.pending[0]
                if isinstance(answer, bytes):
                    data = answer
                else:
                    try:
                        data = await answer
                    except Exception as exc:  # noqa: BLE001 - answered in the request's shape
                        data = self.on_error(meta, exc)
                self.pending.popleft()
                self.space.set()
                writer.write(data)
                if not self.pending or writer.transport.get_write_buffer_size() > DRAIN_BYTES:
                    await writer.drain()
        except (ConnectionError, OSError):
            self.dead = True
            self.space.set()
            writer.close()
