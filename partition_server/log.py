"""The log of one partition: segment files of batches, an in-memory batch index, and the
checks that keep a torn or corrupt tail from ever being served.

Layout: ``<data_dir>/<topic>-<partition>/<base offset, 20 digits>.log``. A segment is a
plain concatenation of batches, byte for byte as producers sent them with ``base_offset``
filled in (``pidlease/wire/protocol.py``). The index (base offset and file position of every
batch) lives in memory and is rebuilt by scanning at open; 16 bytes per batch.

Durability is not decided here: the log remembers which files were written since the last
``take_dirty()`` and the flusher fsyncs them.

Retention (``retention.py``) removes whole segments from the old end; ``log_start_offset``
is then the base of the first segment left, persisted before any file goes. The active
segment rolls at ``policy.segment_bytes`` (else ``segment_bytes_max``) and, at the next
append, once it is ``policy.segment_ms`` old.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from partition_server.retention import LogPolicy, SegmentInfo, read_log_start, write_log_start
from pidlease.errors import CorruptRecord, ServerUnavailable
from pidlease.wire.protocol import BATCH_HEADER_SIZE, BatchHeader, batch_crc_ok, decode_batch_header

log = logging.getLogger("partition_server.log")

SEGMENT_SUFFIX = ".log"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


class Segment:
    """One segment file; its fd is opened read/write with O_APPEND."""

    __slots__ = (
        "base_offset",
        "fd",
        "first_append_ms",
        "max_timestamp_ms",
        "offsets",
        "path",
        "positions",
        "size",
    )

    def __init__(self, base_offset: int, path: Path, fd: int, size: int) -> None:
        self.base_offset = base_offset
        self.path = path
        self.fd = fd
        self.size = size
        self.offsets = array("q")  # base offset of each batch
        self.positions = array("q")  # file position of each batch
        self.max_timestamp_ms = -1  # newest batch timestamp (retention by time)
        self.first_append_ms = -1  # when its first batch came (rolling by age)

    def batch_end(self, i: int) -> int:
        """File position just after batch ``i``."""
        return self.positions[i + 1] if i + 1 < len(self.positions) else self.size


@dataclass
class Truncation:
    segment: str
    offset: int
    position: int
    bytes: int
    reason: str


@dataclass
class OpenReport:
    segments: int = 0
    batches: int = 0
    bytes: int = 0
    verified_batches: int = 0
    truncations: list[Truncation] = field(default_factory=list)


def _open_fd(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)


class PartitionLog:
    """Segments of one partition. Open with :meth:`open`, which recovers the tail."""

    def __init__(
        self,
        directory: Path,
        segment_bytes_max: int,
        *,
        policy: LogPolicy | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.dir = directory
        self.segment_bytes_max = segment_bytes_max
        self.policy = policy or LogPolicy()
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self.log_start_offset = 0
        self.segments: list[Segment] = []
        self._segment_bases: list[int] = []
        self.next_offset = 0
        self._dirty_fds: dict[int, None] = {}
        self._retired_fds: list[int] = []  # of cut segments; closed at the next take_dirty
        self._dir_dirty = False
        self._dir_fd = -1

    # -- open and recover ------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        directory: Path,
        segment_bytes_max: int,
        *,
        verify_from_offset: int = 0,
        on_batch: Callable[[BatchHeader], None] | None = None,
        replay_from_offset: int = 0,
        policy: LogPolicy | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> tuple[PartitionLog, OpenReport]:
        """Open (or create) the log in ``directory``. Batches at or after
        ``verify_from_offset`` are fully validated (checksum, records); the first bad or
        partial batch and everything after it is truncated and reported. ``on_batch`` gets
        the header of every batch at or after ``replay_from_offset``, in log order.
        Segments below the persisted log start (left by a crash during a deletion) are
        removed first."""
        directory.mkdir(parents=True, exist_ok=True)
        self = cls(directory, segment_bytes_max, policy=policy, clock_ms=clock_ms)
        self._dir_fd = os.open(directory, os.O_RDONLY)
        report = OpenReport()
        paths = sorted(
            p
            for p in directory.iterdir()
            if p.name.endswith(SEGMENT_SUFFIX) and p.name[:-4].isdigit()
        )
        start = read_log_start(directory)
        while len(paths) > 1 and int(paths[1].name[:-4]) <= start:
            log.info("%s: removing %s, below the log start %d", directory.name, paths[0], start)
            paths.pop(0).unlink()
        if paths and int(paths[0].name[:-4]) < start and paths[0].stat().st_size == 0:
            paths.pop(0).unlink()  # an empty active segment the log start passed
        expected = None
        for i, path in enumerate(paths):
            base = int(path.name[:-4])
            if expected is not None and base != expected:
                self._drop_segments(
                    paths[i:], report, f"segment starts at {base}, expected {expected}"
                )
                break
            seg = Segment(base, path, _open_fd(path), 0)
            self.segments.append(seg)
            self._segment_bases.append(base)
            ok = self._scan_segment(seg, report, verify_from_offset, on_batch, replay_from_offset)
            expected = self.next_offset if self.segments else None
            if not ok:
                self._drop_segments(paths[i + 1 :], report, "after a truncated segment")
                break
        if not self.segments:
            self.next_offset = start
            self._new_segment(start)
        self.log_start_offset = self.segments[0].base_offset
        if self.segments[-1].offsets:
            self.segments[-1].first_append_ms = self._first_timestamp(self.segments[-1])
        report.segments = len(self.segments)
        if report.truncations:
            os.fsync(self.segments[-1].fd)
            os.fsync(self._dir_fd)
        return self, report

    def _scan_segment(
        self,
        seg: Segment,
        report: OpenReport,
        verify_from: int,
        on_batch: Callable[[BatchHeader], None] | None,
        replay_from: int,
    ) -> bool:
        with open(seg.path, "rb") as f:
            data = f.read()
        mv = memoryview(data)
        pos, n = 0, len(data)
        self.next_offset = seg.base_offset
        problem = None
        while pos < n:
            try:
                if n - pos < BATCH_HEADER_SIZE:
                    raise CorruptRecord(f"partial batch header ({n - pos} bytes)")
                h = decode_batch_header(mv, pos)
                if h.base_offset != self.next_offset:
                    raise CorruptRecord(
                        f"batch says offset {h.base_offset}, expected {self.next_offset}"
                    )
                if h.batch_len < BATCH_HEADER_SIZE - 12 or pos + h.size > n:
                    raise CorruptRecord(f"partial batch ({n - pos} of {h.size} bytes)")
                if h.count < 1:
                    raise CorruptRecord("batch with no records")
                if h.base_offset >= verify_from:
                    # Every batch was fully validated before it was written, so a matching
                    # checksum proves its records parse; no need to walk them again.
                    if not batch_crc_ok(mv, h, pos):
                        raise CorruptRecord("batch checksum mismatch")
                    if h.is_control != (h.base_sequence == -1):
                        raise CorruptRecord("control flag and sequence disagree")
                    report.verified_batches += 1
            except CorruptRecord as exc:
                problem = str(exc)
                break
            seg.offsets.append(h.base_offset)
            seg.positions.append(pos)
            seg.max_timestamp_ms = max(seg.max_timestamp_ms, h.timestamp_ms)
            if on_batch is not None and h.base_offset >= replay_from:
                on_batch(h)
            pos += h.size
            self.next_offset = h.base_offset + h.count
            report.batches += 1
        mv.release()
        seg.size = pos
        report.bytes += pos
        if problem is not None:
            cut = n - pos
            os.ftruncate(seg.fd, pos)
            t = Truncation(seg.path.name, self.next_offset, pos, cut, problem)
            report.truncations.append(t)
            log.warning(
                "%s: truncated %d bytes at offset %d of segment %s (file position %d): %s",
                self.dir.name,
                cut,
                t.offset,
                seg.path.name,
                pos,
                problem,
            )
            return False
        return True

    def _drop_segments(self, paths: list[Path], report: OpenReport, why: str) -> None:
        for p in paths:
            size = p.stat().st_size
            report.truncations.append(Truncation(p.name, self.next_offset, 0, size, why))
            log.warning(
                "%s: truncated %d bytes at offset %d of segment %s (whole segment removed): %s",
                self.dir.name,
                size,
                self.next_offset,
                p.name,
                why,
            )
            p.unlink()

    def _first_timestamp(self, seg: Segment) -> int:
        """The active segment's age after a restart: its first batch's timestamp (no
        later than now, so a producer's fast clock cannot keep it open forever)."""
        h = decode_batch_header(os.pread(seg.fd, BATCH_HEADER_SIZE, seg.positions[0]))
        return min(h.timestamp_ms, self.clock_ms())

    # -- append ----------------------------------------------------------------------------
    def append(self, batch: bytes | bytearray, count: int, timestamp_ms: int = -1) -> int:
        """Write one batch whose ``base_offset`` is already ``next_offset``; returns it.
        ``timestamp_ms`` is the batch header's (retention by time). On a write error the
        segment is cut back so the log stays whole."""
        active = self.segments[-1]
        if active.size > 0 and self._should_roll(active, len(batch)):
            active = self._new_segment(self.next_offset)
        base = self.next_offset
        pos = active.size
        try:
            view = memoryview(batch)
            written = 0
            while written < len(batch):
                written += os.write(active.fd, view[written:])
        except OSError as exc:
            try:
                os.ftruncate(active.fd, pos)
            except OSError:
                log.exception("%s: could not cut back a failed write", self.dir.name)
            _report_write_failure(self.dir.name, exc)
            raise ServerUnavailable(f"write failed: {exc}") from exc
        active.offsets.append(base)
        active.positions.append(pos)
        active.size += len(batch)
        active.max_timestamp_ms = max(active.max_timestamp_ms, timestamp_ms)
        if active.first_append_ms < 0:
            active.first_append_ms = self.clock_ms()
        self.next_offset = base + count
        self._dirty_fds[active.fd] = None
        return base

    def _should_roll(self, active: Segment, size: int) -> bool:
        limit = self.policy.segment_bytes or self.segment_bytes_max
        if active.size + size > limit:
            return True
        age_max = self.policy.segment_ms
        return age_max >= 0 and self.clock_ms() - active.first_append_ms >= age_max

    # -- retention -------------------------------------------------------------------------
    def segment_infos(self) -> list[SegmentInfo]:
        ends = [s.base_offset for s in self.segments[1:]] + [self.next_offset]
        return [
            SegmentInfo(s.base_offset, end, s.size, s.max_timestamp_ms)
            for s, end in zip(self.segments, ends, strict=True)
        ]

    def persist_log_start(self, offset: int) -> None:
        """Blocking (fsyncs): record the log start before segments below it go."""
        write_log_start(self.dir, offset)

    def delete_below(self, offset: int) -> tuple[int, int]:
        """Remove the segments wholly below ``offset`` (the base of a segment, already
        persisted as the log start; never the active one). Returns (segments, bytes). As
        in ``truncate_to``, their fds stay open until the next ``take_dirty``."""
        n = 0
        while n < len(self.segments) - 1 and self.segments[n + 1].base_offset <= offset:
            n += 1
        gone = self.segments[:n]
        for seg in gone:
            self._dirty_fds.pop(seg.fd, None)
            self._retired_fds.append(seg.fd)
            seg.path.unlink()
        del self.segments[:n]
        del self._segment_bases[:n]
        if n:
            self.log_start_offset = self.segments[0].base_offset
            self._dir_dirty = True
        return n, sum(s.size for s in gone)

    def restart_at(self, offset: int) -> None:
        """Drop every segment and go on with an empty log at ``offset``, beyond the end (a
        follower whose whole log is below its leader's log start). The log start is
        persisted first: a crash midway reopens the old log or an empty one at
        ``offset``, and either is fetched on from the leader."""
        assert offset > self.next_offset, (offset, self.next_offset)
        write_log_start(self.dir, offset)
        for seg in self.segments:
            self._dirty_fds.pop(seg.fd, None)
            self._retired_fds.append(seg.fd)
            seg.path.unlink()
        self.segments.clear()
        self._segment_bases.clear()
        self.next_offset = self.log_start_offset = offset
        self._new_segment(offset)
        os.fsync(self._dir_fd)
        log.warning("%s: the log now starts (empty) at offset %d", self.dir.name, offset)

    def truncate_to(self, offset: int) -> int:
        """Cut the log back so it ends at the start of the batch holding ``offset`` (a
        follower dropping a suffix that diverges from its leader's). Returns the new end.
        A flush may be running: the fds of dropped segments stay open until the next
        ``take_dirty`` (closing one under a running fsync would fail it, and a failed fsync
        stops the server; a reused number would fsync some other file)."""
        if offset >= self.next_offset:
            return self.next_offset
        si, bi = self._locate(max(offset, self.log_start_offset))
        for seg in self.segments[si + 1 :]:
            self._dirty_fds.pop(seg.fd, None)
            self._retired_fds.append(seg.fd)
            seg.path.unlink()
        del self.segments[si + 1 :]
        del self._segment_bases[si + 1 :]
        seg = self.segments[si]
        cut, pos = seg.offsets[bi], seg.positions[bi]
        os.ftruncate(seg.fd, pos)
        del seg.offsets[bi:]
        del seg.positions[bi:]
        seg.size = pos
        self.next_offset = cut
        os.fsync(seg.fd)
        os.fsync(self._dir_fd)
        log.warning("%s: truncated the log to offset %d (asked for %d)", self.dir.name, cut, offset)
        return cut

    def cut_point(self, offset: int) -> int:
        """Where :meth:`truncate_to` with ``offset`` makes the log end (nothing changes)."""
        if offset >= self.next_offset:
            return self.next_offset
        si, bi = self._locate(max(offset, self.log_start_offset))
        return self.segments[si].offsets[bi]

    def _new_segment(self, base_offset: int) -> Segment:
        path = self.dir / segment_name(base_offset)
        seg = Segment(base_offset, path, _open_fd(path), 0)
        self.segments.append(seg)
        self._segment_bases.append(base_offset)
        self._dir_dirty = True
        return seg

    def take_dirty(self) -> list[int]:
        """Fds to fsync for everything written so far (directory included after a roll).
        The flusher runs one flush at a time, so the fds handed out before are no longer
        in use: cut segments' fds are closed here."""
        for fd in self._retired_fds:
            os.close(fd)
        self._retired_fds.clear()
        fds = list(self._dirty_fds)
        self._dirty_fds.clear()
        if self._dir_dirty:
            fds.append(self._dir_fd)
            self._dir_dirty = False
        return fds

    def all_fds(self) -> list[int]:
        return [s.fd for s in self.segments] + [self._dir_fd]

    # -- read ------------------------------------------------------------------------------
    def _locate(self, offset: int) -> tuple[int, int]:
        """(segment index, batch index) of the batch holding ``offset``."""
        si = bisect_right(self._segment_bases, offset) - 1
        while si >= 0:
            seg = self.segments[si]
            bi = bisect_right(seg.offsets, offset) - 1
            if bi >= 0:
                return si, bi
            si -= 1  # an empty segment; the batch is in an earlier one
        raise CorruptRecord(f"offset {offset} is not in the log")

    def read(self, offset: int, max_bytes: int, end_offset: int) -> list[bytes]:
        """Whole batches from the one holding ``offset`` up to ``max_bytes`` (at least one
        batch) and below ``end_offset``. Checksums are verified: CorruptRecord if bad."""
        if offset >= end_offset or offset < 0:
            return []
        si, bi = self._locate(offset)
        chunks: list[bytes] = []
        total = 0
        while si < len(self.segments) and total < max_bytes:
            seg = self.segments[si]
            first = bi
            stop = bi
            start_pos = seg.positions[bi] if bi < len(seg.positions) else seg.size
            end_pos = start_pos
            while stop < len(seg.offsets) and seg.offsets[stop] < end_offset:
                size = seg.batch_end(stop) - seg.positions[stop]
                if total > 0 and total + size > max_bytes:
                    break
                total += size
                end_pos = seg.batch_end(stop)
                stop += 1
            if stop > first:
                data = os.pread(seg.fd, end_pos - start_pos, start_pos)
                self._verify(seg, data, first, stop)
                chunks.append(data)
            if stop < len(seg.offsets):
                break  # stopped on size or on the end offset
            si += 1
            bi = 0
        return chunks

    def _verify(self, seg: Segment, data: bytes, first: int, stop: int) -> None:
        pos = 0
        for i in range(first, stop):
            try:
                h = decode_batch_header(data, pos)
                ok = h.base_offset == seg.offsets[i] and batch_crc_ok(data, h, pos)
            except CorruptRecord:
                ok = False
            if not ok:
                log.error(
                    "%s: corrupt batch at offset %d in segment %s (file position %d)",
                    self.dir.name,
                    seg.offsets[i],
                    seg.path.name,
                    seg.positions[i],
                )
                raise CorruptRecord(f"stored batch at offset {seg.offsets[i]} fails its checksum")
            pos += h.size

    def offset_for_timestamp(self, timestamp_ms: int, end_offset: int) -> int:
        """The base offset of the first batch (in log order, from the log start, below
        ``end_offset``) whose timestamp is at or after ``timestamp_ms``; ``end_offset``
        when there is none. Batch timestamps are the producers' and need not grow with the
        offset: the first batch at or after the time wins, as in Kafka's ListOffsets."""
        for seg in self.segments:
            if not seg.offsets or seg.offsets[0] >= end_offset:
                break
            if seg.max_timestamp_ms < timestamp_ms:
                continue  # every batch of this segment is older
            for i in range(len(seg.offsets)):
                if seg.offsets[i] >= end_offset:
                    return end_offset
                raw = os.pread(seg.fd, BATCH_HEADER_SIZE, seg.positions[i])
                if decode_batch_header(raw).timestamp_ms >= timestamp_ms:
                    return int(seg.offsets[i])
        return end_offset

    def iter_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers of stored batches from the one holding ``from_offset`` (to rebuild state)."""
        if from_offset >= self.next_offset:
            return
        si, bi = self._locate(max(from_offset, self.log_start_offset))
        for seg in self.segments[si:]:
            for i in range(bi, len(seg.offsets)):
                yield decode_batch_header(os.pread(seg.fd, BATCH_HEADER_SIZE, seg.positions[i]))
            bi = 0

    @property
    def batch_count(self) -> int:
        return sum(len(s.offsets) for s in self.segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def close(self) -> None:
        for fd in [s.fd for s in self.segments] + self._retired_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.segments.clear()
        self._retired_fds.clear()
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1


_last_write_failure_log_s = 0.0


def _report_write_failure(where: str, exc: OSError) -> None:
    """Say so when appends fail (a full disk, most often), at most every 10 s: the
    producer only sees a retriable SERVER_UNAVAILABLE, the operator needs the log line."""
    global _last_write_failure_log_s  # noqa: PLW0603 - one rate limit for the whole process
    now = time.monotonic()
    if now - _last_write_failure_log_s >= 10.0:
        _last_write_failure_log_s = now
        log.error(
            "%s: append failed (%s); appends are refused with SERVER_UNAVAILABLE "
            "and producers retry until the write succeeds (free disk space)",
            where,
            exc,
        )
