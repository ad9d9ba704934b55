"""One partition on this server: its log, its producer state and the acks waiting for
durability. Everything here runs on the event loop; a check and the write it allows happen
with no await in between, so appends to one partition are serialized without a lock."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from partition_server.flusher import Flusher
from partition_server.log import OpenReport, PartitionLog
from partition_server.producer_state import Decision, FenceOutcome, Outcome, ProducerStateTable
from partition_server.snapshot import PartitionImage
from pidlease.errors import ServerUnavailable
from pidlease.protocol import BatchHeader, encode_control_batch, set_base_offset

log = logging.getLogger("partition_server.partition")


def dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_dir_name(name: str) -> tuple[str, int] | None:
    topic, sep, p = name.rpartition("-")
    if not sep or not topic or not p.isdigit():
        return None
    return topic, int(p)


class Partition:
    def __init__(self, topic: str, partition: int, plog: PartitionLog, state: ProducerStateTable,
                 flusher: Flusher, clock_ms: Callable[[], int]) -> None:
        self.topic = topic
        self.partition = partition
        self.log = plog
        self.state = state
        self.flusher = flusher
        self.clock_ms = clock_ms
        # Recovery fsyncs what it found, so all of the log is durable at start.
        self.durable_end = plog.next_offset
        self._waiters: deque[tuple[int, asyncio.Future[Any], Callable[[], Any]]] = deque()
        self.role = "leader"
        self.leader_address = ""
        self.hosted = False  # assigned to this server in ZooKeeper
        self.batches_appended = 0

    @classmethod
    def recover(cls, data_dir: Path, topic: str, partition: int, *, mode: str,
                segment_bytes_max: int, batches_kept: int, pids_max: int, flusher: Flusher,
                clock_ms: Callable[[], int], snapshot: PartitionImage | None = None,
                ) -> tuple[Partition, OpenReport, int]:
        """Open the log and rebuild producer state: snapshot rows + replay of the log from
        the snapshot's ``replay_from``; from 0 when the log ends before the snapshot's
        ``covered_to``. Returns (partition, log report, batches replayed)."""
        now = clock_ms()
        state = ProducerStateTable(mode=mode, batches_kept=batches_kept, pids_max=pids_max)
        from_offset = covered_to = 0
        if snapshot is not None:
            from_offset, covered_to = snapshot.replay_from, snapshot.covered_to
            state.load_rows(snapshot.rows)
        replayed = 0

        def replay(h: BatchHeader) -> None:
            nonlocal replayed
            replayed += 1
            replay_batch(state, h, now)

        directory = data_dir / dir_name(topic, partition)
        plog, report = PartitionLog.open(directory, segment_bytes_max,
                                         verify_from_offset=from_offset, on_batch=replay,
                                         replay_from_offset=from_offset)
        if plog.next_offset < covered_to:
            log.warning("%s-%d: log ends at %d, before the snapshot's offset %d; rebuilding "
                        "producer state from offset 0", topic, partition, plog.next_offset,
                        covered_to)
            state.clear()
            replayed = 0
            for h in plog.iter_headers(0):
                replay(h)
        return cls(topic, partition, plog, state, flusher, clock_ms), report, replayed

    # -- appends ---------------------------------------------------------------------------
    def append(self, batch: memoryview, h: BatchHeader,
               on_durable: Callable[[int, int], Any]) -> tuple[Decision, asyncio.Future[Any] | None]:
        """Check a validated batch and write it when the rules allow. Returns the decision
        and, on APPEND, a future resolved with ``on_durable(base, last)`` once fsynced."""
        d = self.state.check_append(h.pid, h.generation, h.base_sequence, h.count)
        if d.outcome is not Outcome.APPEND:
            if d.outcome is Outcome.DUPLICATE or d.outcome is Outcome.SEQUENCE_UNKNOWN:
                self.state.touch(h.pid, self.clock_ms())
            return d, None
        buf = bytearray(batch)
        set_base_offset(buf, self.log.next_offset)
        base = self.log.append(buf, h.count)
        self.state.apply_append(h.pid, h.generation, h.base_sequence, h.count, base,
                                self.clock_ms())
        self.batches_appended += 1
        last = base + h.count - 1
        return d, self._when_durable(last + 1, lambda: on_durable(base, last))

    def fence(self, pid: int, generation: int, create_if_absent: bool,
              on_durable: Callable[[bool, int, int], Any]) -> tuple[FenceOutcome, asyncio.Future[Any]]:
        """Apply FENCE. The future resolves with ``on_durable(existed, durable_highwater,
        fence_offset)`` once the fence (or, when nothing is written, everything appended so
        far) is durable, so the durable highwater it reports is final."""
        now = self.clock_ms()
        outcome = self.state.check_fence(pid, generation, create_if_absent)
        existed = self.state.get(pid) is not None
        if outcome is FenceOutcome.FENCED:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return outcome, fut
        fence_offset = -1
        if outcome is FenceOutcome.APPEND:
            buf = bytearray(encode_control_batch(pid=pid, generation=generation, timestamp_ms=now))
            set_base_offset(buf, self.log.next_offset)
            fence_offset = self.log.append(buf, 1)
            self.state.apply_fence(pid, generation, now)
            self.batches_appended += 1
        else:
            self.state.touch(pid, now)

        def result() -> Any:
            e = self.state.get(pid)
            return on_durable(existed, e.durable_highwater if e is not None else -1, fence_offset)

        return outcome, self._when_durable(self.log.next_offset, result)

    def _when_durable(self, end_offset: int, make: Callable[[], Any]) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if end_offset <= self.durable_end:
            fut.set_result(make())
        else:
            self._waiters.append((end_offset, fut, make))
            self.flusher.note_write(self)
        return fut

    def wait_durable(self, end_offset: int) -> asyncio.Future[Any]:
        return self._when_durable(end_offset, lambda: None)

    # -- durability (called by the flusher) ------------------------------------------------
    def prepare_flush(self) -> tuple[int, list[int]]:
        return self.log.next_offset, self.log.take_dirty()

    def mark_durable(self, end_offset: int) -> None:
        if end_offset <= self.durable_end:
            return
        self.durable_end = end_offset
        self.state.mark_durable(end_offset)
        w = self._waiters
        while w and w[0][0] <= end_offset:
            _, fut, make = w.popleft()
            if not fut.done():
                fut.set_result(make())

    def fail_waiters(self, why: str) -> None:
        while self._waiters:
            _, fut, _ = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(ServerUnavailable(why))

    # -- reads -----------------------------------------------------------------------------
    def fetch(self, offset: int, max_bytes: int) -> list[bytes]:
        return self.log.read(offset, max_bytes, self.durable_end)

    def producer_state(self, pid: int) -> tuple[bool, int, int, int]:
        """(found, generation, durable_highwater, last_use_ms); refreshes last use."""
        e = self.state.touch(pid, self.clock_ms())
        if e is None:
            return False, 0, -1, 0
        return True, e.generation, e.durable_highwater, e.last_use_ms

    async def capture(self, chunk_pids: int = 20_000) -> PartitionImage:
        """Producer state for a snapshot, exported ``chunk_pids`` at a time with the loop
        free in between (see snapshot.py for why replay over it is exact). The caller
        fsyncs up to ``covered_to`` before writing it: a snapshot holds only durable state."""
        replay_from = self.log.next_offset
        pids = self.state.pids()
        rows = []
        # A million new row objects would set off full GC passes over the whole heap
        # (hundreds of ms each, stalling the loop); rows hold no cycles, so pause the GC.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            for i in range(0, len(pids), chunk_pids):
                if i:
                    await asyncio.sleep(0)
                rows.extend(self.state.export_rows(pids[i:i + chunk_pids]))
        finally:
            if gc_was_on:
                gc.enable()
        return PartitionImage(replay_from, self.log.next_offset, rows)

    def metadata(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "role": self.role,
                "log_start_offset": 0, "log_end_offset": self.log.next_offset,
                "high_watermark": self.durable_end, "tracked_pids": len(self.state)}

    def close(self) -> None:
        self.fail_waiters("server shutting down")
        self.log.close()


def replay_batch(state: ProducerStateTable, h: BatchHeader, now_ms: int) -> None:
    """Replay one stored batch into ``state`` (the log is the truth: no checks)."""
    if h.is_control:
        state.apply_fence(h.pid, h.generation, now_ms)
    else:
        state.apply_append(h.pid, h.generation, h.base_sequence, h.count, h.base_offset, now_ms,
                           durable=True)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
