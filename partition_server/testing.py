"""Test tools for the partition server's own tests: helpers that read and damage a
partition's files on disk (to compare replicas, to tear a log tail as a crash mid-write
would), and fakes for replicated partitions run without servers (an executor the test
steps by hand; the fake ZooKeeper is ``tests/sim/zk.py``'s ``partition_zk``). Client-side
tools (the wire test client, batch and token builders) are in ``pidlease.testing.wire``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

from partition_server.flusher import Flusher
from partition_server.partition import Partition, dir_name
from partition_server.producer_state import Outcome
from pidlease.wire import protocol as P


def log_batches(data_dir: Path, topic: str, partition: int) -> list[bytes]:
    """Every stored batch of a partition, read straight from its segment files (to compare
    replicas batch for batch). Read while the server is quiet or stopped."""
    out: list[bytes] = []
    for seg in sorted((data_dir / dir_name(topic, partition)).glob("*.log")):
        data = seg.read_bytes()
        end = 0
        for h, pos in P.iter_batches(data):
            out.append(data[pos : pos + h.size])
            end = pos + h.size
        if end != len(data):
            raise AssertionError(f"{seg}: {len(data) - end} bytes after the last whole batch")
    return out


def active_segment(data_dir: Path, topic: str, partition: int) -> Path:
    segs = sorted((data_dir / dir_name(topic, partition)).glob("*.log"))
    return segs[-1]


def tear_tail(data_dir: Path, topic: str, partition: int, partial: bytes) -> Path:
    """Append ``partial`` (e.g. half a batch) to the active segment, as a crash mid-write
    would leave it. Call only while the server is down."""
    seg = active_segment(data_dir, topic, partition)
    with open(seg, "ab") as f:
        f.write(partial)
    return seg


# -- replicated partitions without servers ---------------------------------------------
def b(pid: int, seq: int, n: int = 1, gen: int = 0) -> bytes:
    return P.encode_batch(
        [(None, b"v%d" % (seq + i)) for i in range(n)],
        pid=pid,
        generation=gen,
        base_sequence=seq,
        timestamp_ms=1,
    )


def stored(batches: list[bytes], start: int = 0) -> memoryview:
    """``batches`` with offsets filled in from ``start``, as a leader's log holds them."""
    out = bytearray()
    off = start
    for raw in batches:
        buf = bytearray(raw)
        P.set_base_offset(buf, off)
        off += P.decode_batch_header(bytes(buf)).count
        out += buf
    return memoryview(bytes(out))


class HeldExecutor(Executor):
    """Holds every submitted call until :meth:`run_next`: the test decides when an fsync
    happens and completes relative to appends and cuts. ``ran`` keeps the arguments of the
    calls that ran, in order (for a flush: the list of fds it fsynced)."""

    def __init__(self) -> None:
        self.held: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self.ran: list[tuple[Any, ...]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.held.append((fut, fn, args))
        return fut

    def run_next(self) -> None:
        fut, fn, args = self.held.pop(0)
        self.ran.append(args)
        try:
            fut.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting side, as a pool would
            fut.set_exception(exc)


class InlineExecutor(Executor):
    """Runs each call at once on the caller's thread (its result still reaches the loop
    through a callback, as from a pool)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting side
            fut.set_exception(exc)
        return fut


async def settle(rounds: int = 10) -> None:
    """Let callbacks scheduled by finished executor calls run (a few loop iterations)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def open_part(
    data_dir: Path,
    flusher: Flusher | None = None,
    *,
    hw: int | None = 0,
    segment_bytes_max: int = 1 << 20,
    snapshot: Any = None,
    clock_ms: Callable[[], int] = lambda: 5,
    partition: int = 0,
    **settings: Any,
) -> Partition:
    """Partition ``t``/``partition`` recovered from ``data_dir``: strict, 5 batches kept per
    PID, 100 PIDs, fsync per batch, unless ``settings`` (any other ``Partition.recover``
    keyword: ``mode``, ``pids_max``, ``expire_ms`` ...) say otherwise. ``hw`` is the
    replication checkpoint's high watermark; None opens a partition that is not replicated."""
    kw: dict[str, Any] = {"mode": "strict", "batches_kept": 5, "pids_max": 100, **settings}
    part, _, _ = Partition.recover(
        data_dir,
        "t",
        partition,
        segment_bytes_max=segment_bytes_max,
        flusher=flusher if flusher is not None else Flusher(mode="batch", interval_ms=0),
        clock_ms=clock_ms,
        snapshot=snapshot,
        checkpoint_hw=hw,
        **kw,
    )
    return part


def outcome(part: Partition, pid: int, seq: int, n: int) -> Outcome:
    """What the partition's append rules would answer now to a generation-0 batch of ``n``
    records from ``seq`` (nothing is appended)."""
    return part.state.check_append(pid, 0, seq, n).outcome
