"""Length-prefixed framing: every frame on a pidlease socket is a 4-byte big-endian
length, then that many bytes of body. This module is the only place that packs or reads
that length; every socket owner (the SDK's connections, the coordinator's leader client,
the replica fetcher, the test client, the partition server) goes through it.

Three layers, from pure to I/O:
- ``encode_frame`` / ``pack_header``: bytes out.
- ``FrameDecoder``: sans-I/O, bytes in (any chunking) -> complete frame bodies, with a
  size limit checked on the header, before the body is waited for or buffered.
- thin helpers over a transport: ``read_frame`` (asyncio ``StreamReader``) and
  ``recv_frame`` (blocking socket).

Kafka frames its requests the same way (a signed 32-bit big-endian size, then the body);
with a limit under 2**31 the two agree, so a Kafka listener can use ``FrameDecoder`` as is.

The module imports nothing from the package: errors are its own (``FrameTooLarge`` is a
``ValueError``, a peer closing mid-frame is ``EOFError``) and callers map them at their
boundary.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

__all__ = [
    "HEADER_SIZE",
    "FRAME_SIZE_LIMIT",
    "FrameTooLarge",
    "FrameDecoder",
    "encode_frame",
    "pack_header",
    "unpack_header",
    "check_size",
    "read_frame",
    "recv_frame",
]

_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size  # 4
FRAME_SIZE_LIMIT = 0xFFFF_FFFF  # what the header can say: "no limit" for a caller

pack_header: Callable[[int], bytes] = _HEADER.pack
"""The 4-byte header of a ``size``-byte body (for callers that write header and body
as separate buffers, to avoid joining them)."""


class FrameTooLarge(ValueError):
    """A header announced a body over the reader's limit. Nothing after it can be read
    (the stream cannot be resynchronised), so the caller closes the connection.

    ``frames``: from ``FrameDecoder.feed``, the complete frames that came before it in the
    same chunk, for a caller that answers them before closing."""

    def __init__(self, size: int, max_bytes: int, frames: list[bytes] | None = None) -> None:
        super().__init__(f"frame of {size} bytes is over the limit of {max_bytes}")
        self.size = size
        self.max_bytes = max_bytes
        self.frames = frames if frames is not None else []


def encode_frame(body: bytes | bytearray | memoryview) -> bytes:
    """One frame: header + ``body``."""
    return _HEADER.pack(len(body)) + body


def unpack_header(header: bytes | bytearray | memoryview) -> int:
    """The body size a 4-byte header announces."""
    return _HEADER.unpack(header)[0]  # type: ignore[no-any-return]


def check_size(size: int, max_bytes: int) -> None:
    """Raise FrameTooLarge when ``size`` is over ``max_bytes``."""
    if size > max_bytes:
        raise FrameTooLarge(size, max_bytes)


class FrameDecoder:
    """Bytes in, complete frame bodies out; no I/O.

    ``feed`` appends a chunk and returns every frame it completed (possibly none, possibly
    many), each body copied once out of the buffer. Oversize is caught at the header:
    the body is never buffered. After FrameTooLarge the decoder stays failed: the
    stream has no frame boundary left to trust.
    """

    __slots__ = ("max_bytes", "_buf", "_failed")

    def __init__(self, max_bytes: int) -> None:
        if not 0 <= max_bytes <= FRAME_SIZE_LIMIT:
            raise ValueError(f"max_bytes must be in [0, {FRAME_SIZE_LIMIT}], not {max_bytes}")
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._failed: FrameTooLarge | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame (a partial header or body)."""
        return len(self._buf)

    def pending(self) -> memoryview:
        """A view of the buffered bytes, for a caller that must inspect a partial or
        refused frame (e.g. the request header after an oversize length)."""
        return memoryview(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        n = len(buf)
        pos = 0
        max_bytes = self.max_bytes
        unpack_from = _HEADER.unpack_from
        while n - pos >= 4:
            (size,) = unpack_from(buf, pos)
            if size > max_bytes:
                del buf[:pos]  # the refused header stays first, for pending()
                self._failed = FrameTooLarge(size, max_bytes)
                raise FrameTooLarge(size, max_bytes, frames)
            end = pos + 4 + size
            if end > n:
                break
            frames.append(bytes(buf[pos + 4 : end]))
            pos = end
        if pos:
            del buf[:pos]
        return frames


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """The next frame's body from ``reader``. Raises FrameTooLarge (after the header only:
    the caller may still read from the stream, e.g. the request header to answer it) and
    ``asyncio.IncompleteReadError`` (an ``EOFError``) when the stream ends mid-frame."""
    (size,) = _HEADER.unpack(await reader.readexactly(4))
    if size > max_bytes:
        raise FrameTooLarge(size, max_bytes)
    return await reader.readexactly(size)


def recv_frame(
    sock: socket.socket, max_bytes: int, *, timeout_s: Callable[[], float] | None = None
) -> bytes:
    """The next frame's body from a blocking socket. ``timeout_s``, when given, is called
    before every ``recv`` for the seconds left (one deadline over the whole frame); it may
    raise to give up. Raises FrameTooLarge, EOFError when the peer closes mid-frame, and
    whatever the socket raises."""
    (size,) = _HEADER.unpack(recv_exact(sock, 4, timeout_s=timeout_s))
    if size > max_bytes:
        raise FrameTooLarge(size, max_bytes)
    return recv_exact(sock, size, timeout_s=timeout_s)


def recv_exact(
    sock: socket.socket, n: int, *, timeout_s: Callable[[], float] | None = None
) -> bytes:
    """Exactly ``n`` bytes from a blocking socket (EOFError if it closes first)."""
    if n == 0:
        return b""
    if timeout_s is not None:
        sock.settimeout(timeout_s())
    first = sock.recv(min(n, 1 << 20))
    if len(first) == n:
        return first  # the usual case: no copy
    if not first:
        raise EOFError(f"peer closed the connection after 0 of {n} bytes")
    buf = bytearray(n)
    view = memoryview(buf)
    got = len(first)
    view[:got] = first
    while got < n:
        if timeout_s is not None:
            sock.settimeout(timeout_s())
        k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        if not k:
            raise EOFError(f"peer closed the connection after {got} of {n} bytes")
        got += k
    return bytes(buf)
