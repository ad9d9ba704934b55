"""The ceiling: the fastest append server we know how to write in Python, with no
producer state, so every pidlease row can be read as a fraction of it.

Server (``python -m bench.peers.ceiling PORT FILE``): asyncio (uvloop when installed),
frames of ``u32 length`` + one batch in pidlease's batch format; for each batch it checks
the CRC (``zlib.crc32`` over the batch, as pidlease does), appends what arrived to a file
(one ``os.write`` per read: that is the best case) and answers the batch's base offset
(``i64``). No fsync, no sequence checks, no tokens, no topics.

Client (``produce``): one blocking socket, batches built once per pass (only the header
changes between batches, so the client spends its time on the socket), up to ``window``
batches in flight. It has no duplicate detection, so it runs the produce pass only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.process import ServerProcess, free_port
from bench.workload import Outcome, clock, payload, records_per_batch

_U32 = struct.Struct(">I")
_CRC = struct.Struct(">I")
_COUNT = struct.Struct(">I")
_ACK = struct.Struct(">q")
_TAIL = struct.Struct(">BQIqIq")
_HEAD = struct.Struct(">qII")
_CRC_AT, _CRC_FROM, _COUNT_AT = 12, 16, 37


class _AppendProtocol(asyncio.Protocol):
    def __init__(self, server: _CeilingServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        acks = []
        srv = self.server
        with memoryview(buf) as mv:
            while n - pos >= 4:
                (size,) = _U32.unpack_from(buf, pos)
                b = pos + 4
                if n - b < size:
                    break
                (crc,) = _CRC.unpack_from(buf, b + _CRC_AT)
                if zlib.crc32(mv[b + _CRC_FROM : b + size]) != crc:
                    assert self.transport is not None
                    self.transport.abort()
                    return
                (count,) = _COUNT.unpack_from(buf, b + _COUNT_AT)
                acks.append(_ACK.pack(srv.next_offset))
                srv.next_offset += count
                pos = b + size
            if pos:
                srv.write(mv[:pos])
        if pos:
            del buf[:pos]
            assert self.transport is not None
            self.transport.write(b"".join(acks))


class _CeilingServer:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.next_offset = 0

    def write(self, data: memoryview) -> None:
        done = 0
        while done < len(data):  # regular files write fully unless the disk is full
            done += os.write(self.fd, data[done:])


async def _serve(port: int, path: Path) -> None:
    srv = _CeilingServer(path)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _AppendProtocol(srv), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    port, path = int(sys.argv[1]), Path(sys.argv[2])
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(_serve(port, path))


# -- the system and its producer ---------------------------------------------------------
class System:
    name = "ceiling (bare asyncio append server)"
    key = "ceiling"
    producer = "bench.peers.ceiling:produce"
    dedup = False

    def __init__(self, workdir: Path, *, window: int = 8) -> None:
        self.workdir = workdir
        self.window = window
        self.proc: ServerProcess | None = None
        self.runs = 0

    def start(self) -> None:
        port = free_port()
        self.proc = ServerProcess(
            "ceiling",
            [
                sys.executable,
                "-m",
                "bench.peers.ceiling",
                str(port),
                str(self.workdir / "ceiling.log.data"),
            ],
            port,
            self.workdir / "ceiling.out",
        )
        self.proc.start()

    def server_pids(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid]

    def prepare(self, value_bytes: int) -> dict[str, Any]:
        assert self.proc is not None
        self.runs += 1
        return {"port": self.proc.port, "window": self.window}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def _batch(body: bytes, count: int, base_seq: int, producer: int) -> bytes:
    tail = _TAIL.pack(0, producer + 1, 0, base_seq, count, int(time.time() * 1000)) + body
    return _HEAD.pack(0, len(tail) + 4, zlib.crc32(tail)) + tail


def produce(
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    ready: Callable[[], Any],
) -> Outcome:
    per = records_per_batch(value_bytes)
    rec = struct.pack(">iI", -1, value_bytes) + payload(value_bytes, index)
    full = rec * per
    sizes = [min(per, records - i) for i in range(0, records, per)]
    window = int(cfg["window"])
    out = Outcome(index, records)
    sock = socket.create_connection(("127.0.0.1", int(cfg["port"])))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent_at: list[float] = []
    buf = bytearray()
    ready()
    cpu0 = time.process_time()
    out.started = clock()
    sent = acked = 0
    seq = 0
    try:
        while acked < len(sizes):
            frames = []
            while sent < len(sizes) and sent - acked < window:
                n = sizes[sent]
                b = _batch(full if n == per else rec * n, n, seq, index)
                seq += n
                frames.append(_U32.pack(len(b)))
                frames.append(b)
                sent_at.append(clock())
                sent += 1
            if frames:
                sock.sendall(b"".join(frames))
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("ceiling server closed the connection")
            buf += chunk
            got = len(buf) // 8
            if got:
                now = clock()
                for i in range(acked, acked + got):
                    out.latencies_s.append(now - sent_at[i])
                    out.acked += sizes[i]
                acked += got
                del buf[: got * 8]
    finally:
        sock.close()
    out.finished = clock()
    out.client_cpu_s = time.process_time() - cpu0
    return out


if __name__ == "__main__":
    main()
