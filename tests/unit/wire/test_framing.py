"""pidlease.wire.framing: the decoder under any chunking, the size limit, the blocking and
asyncio readers."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease.wire.framing import (
    FRAME_SIZE_LIMIT,
    HEADER_SIZE,
    FrameDecoder,
    FrameTooLarge,
    encode_frame,
    pack_header,
    read_frame,
    recv_frame,
    unpack_header,
)


def test_header_is_u32_big_endian() -> None:
    assert HEADER_SIZE == 4
    assert pack_header(0x01020304) == b"\x01\x02\x03\x04"
    assert unpack_header(b"\x01\x02\x03\x04") == 0x01020304
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"


def test_one_frame_split_at_every_byte() -> None:
    data = encode_frame(b"hello")
    for cut in range(len(data) + 1):
        d = FrameDecoder(100)
        assert d.feed(data[:cut]) == ([b"hello"] if cut == len(data) else [])
        got = d.feed(data[cut:])
        assert got == ([] if cut == len(data) else [b"hello"])
        assert d.buffered == 0


def test_byte_at_a_time() -> None:
    d = FrameDecoder(100)
    data = encode_frame(b"ab") + encode_frame(b"") + encode_frame(b"cde")
    out = [f for i in range(len(data)) for f in d.feed(data[i : i + 1])]
    assert out == [b"ab", b"", b"cde"]


def test_many_frames_in_one_chunk_and_a_partial_tail() -> None:
    d = FrameDecoder(100)
    bodies = [bytes([i]) * i for i in range(50)]
    tail = encode_frame(b"next")
    got = d.feed(b"".join(encode_frame(b) for b in bodies) + tail[:6])
    assert got == bodies
    assert d.buffered == 6
    assert bytes(d.pending()) == tail[:6]
    assert d.feed(tail[6:]) == [b"next"]


def test_empty_frames_and_empty_feeds() -> None:
    d = FrameDecoder(0)
    assert d.feed(b"") == []
    assert d.feed(encode_frame(b"") * 3) == [b"", b"", b""]
    assert d.buffered == 0


def test_frame_at_the_limit_passes() -> None:
    d = FrameDecoder(8)
    assert d.feed(encode_frame(b"x" * 8)) == [b"x" * 8]


def test_oversize_raises_at_the_header_with_the_frames_before_it() -> None:
    d = FrameDecoder(8)
    # the header alone is enough: the body is never waited for
    with pytest.raises(FrameTooLarge) as info:
        d.feed(encode_frame(b"ok") + pack_header(9))
    assert (info.value.size, info.value.max_bytes) == (9, 8)
    assert info.value.frames == [b"ok"]
    assert "9 bytes" in str(info.value) and isinstance(info.value, ValueError)
    assert bytes(d.pending()) == pack_header(9)  # the refused header, for the caller to inspect
    with pytest.raises(FrameTooLarge):  # stays failed: no boundary left to trust
        d.feed(b"more")


def test_limit_is_checked() -> None:
    with pytest.raises(ValueError, match=r"max_bytes must be in \[0, \d+\], not -1"):
        FrameDecoder(-1)
    with pytest.raises(ValueError, match=rf"not {FRAME_SIZE_LIMIT + 1}$"):
        FrameDecoder(FRAME_SIZE_LIMIT + 1)


@settings(max_examples=200, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_round_trip_under_any_chunking(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(b) for b in bodies)
    points = sorted({min(c, len(stream)) for c in cuts})
    d = FrameDecoder(300)
    out: list[bytes] = []
    prev = 0
    for p in [*points, len(stream)]:
        out += d.feed(memoryview(stream)[prev:p])
        prev = p
    assert out == bodies
    assert d.buffered == 0


def test_read_frame_from_a_stream_reader() -> None:
    async def main() -> None:
        r = asyncio.StreamReader()
        r.feed_data(encode_frame(b"one") + encode_frame(b"") + pack_header(1000) + b"xxxxx")
        r.feed_eof()
        assert await read_frame(r, 100) == b"one"
        assert await read_frame(r, 100) == b""
        with pytest.raises(FrameTooLarge) as info:
            await read_frame(r, 100)
        assert info.value.size == 1000
        assert await r.readexactly(5) == b"xxxxx"  # only the header was consumed
        with pytest.raises(EOFError):
            await read_frame(r, 100)

    asyncio.run(main())


def test_recv_frame_on_a_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(10)
        big = b"y" * 300_000  # more than a socket buffer: arrives in several recvs
        sender = threading.Thread(
            target=a.sendall, args=(encode_frame(b"hi") + encode_frame(big) + pack_header(50),)
        )
        sender.start()
        assert recv_frame(b, 1 << 20) == b"hi"
        assert recv_frame(b, 1 << 20, timeout_s=lambda: 10.0) == big
        sender.join(10)
        with pytest.raises(FrameTooLarge):
            recv_frame(b, 10)
        a.sendall(pack_header(5) + b"ab")
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(EOFError):
            recv_frame(b, 100)


def test_recv_frame_deadline_may_give_up() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(10)
        a.sendall(pack_header(5))

        def gone() -> float:
            raise TimeoutError("deadline passed")

        with pytest.raises(TimeoutError):
            recv_frame(b, 100, timeout_s=gone)
