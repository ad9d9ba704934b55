"""Micro-benchmark of framing: the inline code each socket owner had before pidlease.wire.framing
("old", kept here only as the reference) against pidlease.wire.framing ("new"), in the same run.
Run: python -m bench.bench_framing"""

import asyncio
import statistics
import struct
import time

from pidlease.wire import framing
from pidlease.wire import protocol as P

_U32 = struct.Struct(">I")
N = 100_000
body = bytes(5) + b"x" * 60
stream = b"".join(_U32.pack(len(body)) + body for _ in range(N))


async def old_loop(reader, frame_max):
    k = 0
    while k < N:
        (n,) = _U32.unpack(await reader.readexactly(4))
        if n > frame_max:
            raise ValueError
        _frame = await reader.readexactly(n)
        k += 1


async def new_loop(reader, frame_max):
    k = 0
    read_frame = framing.read_frame
    while k < N:
        _frame = await read_frame(reader, frame_max)
        k += 1


def run_reader(fn):
    async def main():
        r = asyncio.StreamReader(limit=2**16)
        # feed in 64 KiB chunks as a socket would
        for i in range(0, len(stream), 65536):
            r.feed_data(stream[i : i + 65536])
        r.feed_eof()
        t = time.perf_counter()
        await fn(r, 16 << 20)
        return time.perf_counter() - t

    return asyncio.run(main())


def old_data_received(chunks):
    buf = bytearray()
    out = 0
    for data in chunks:
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = _U32.unpack_from(buf, pos)
            if size > 16 << 20:
                raise ValueError
            if n - pos - 4 < size:
                break
            _frame = bytes(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            out += 1
        if pos:
            del buf[:pos]
    return out


def new_data_received(chunks):
    d = framing.FrameDecoder(16 << 20)
    out = 0
    for data in chunks:
        for _frame in d.feed(data):
            out += 1
    return out


chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
batch = b"b" * 100


def old_produce():
    for c in range(N):
        head = struct.pack(">BI", 0, c) + b"\x00\x05topic" + _U32.pack(1) + b"\x00\x00"
        _U32.pack(len(head) + len(batch)) + head + batch


def new_produce():
    for c in range(N):
        P.produce_request(c, "topic", 1, "", batch)


def timeit(f, *a):
    t = time.perf_counter()
    f(*a)
    return time.perf_counter() - t


res = {}
for _round in range(7):
    for name, f in [
        ("server read_loop old", lambda: run_reader(old_loop)),
        ("server read_loop new", lambda: run_reader(new_loop)),
        ("sdk data_received old", lambda: timeit(old_data_received, chunks)),
        ("sdk data_received new", lambda: timeit(new_data_received, chunks)),
        ("produce_request (current protocol.py)", lambda: timeit(new_produce)),
    ]:
        res.setdefault(name, []).append(f())
for name, ts in res.items():
    print(
        f"{name:40s} median {statistics.median(ts) * 1e3:7.1f} ms / {N} frames  "
        f"({statistics.median(ts) / N * 1e9:5.0f} ns/frame)  min {min(ts) * 1e3:.1f}"
    )
