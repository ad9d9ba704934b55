"""The log of one partition: segment files of batches, a sparse index per segment, and
the checks that keep a torn or corrupt tail from ever being served.

Layout: ``<data_dir>/<topic>-<partition>/<base offset, 20 digits>.log``. A segment is a
plain concatenation of batches, byte for byte as producers sent them with ``base_offset``
filled in (``pidlease/wire/protocol.py``). Each segment has a sparse offset index and time
index in memory (``segment_index.py``: an entry every ``index_interval_bytes``); a read by
offset or by time takes the entry at or below and walks batch headers from there.

A closed segment's index is written to ``<base>.index`` and ``<base>.timeindex`` when it
rolls (not fsynced: an index is checked against its segment at open, by checksum, size
and end offset, and rebuilt by a scan when missing, damaged or stale). An open loads the
closed segments below the tail from their index files without reading them, and scans the
tail (the segments from ``verify_from_offset`` on: what recovery replays since the last
snapshot), checking every batch. The active segment never has index files.

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
import struct
import time
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from partition_server.retention import LogPolicy, SegmentInfo, read_log_start, write_log_start
from partition_server.segment_index import (
    OFFSET_INDEX_SUFFIX,
    TIME_INDEX_SUFFIX,
    IndexDamaged,
    SegmentIndex,
    decode_index,
    encode_index,
)
from pidlease.errors import CorruptRecord, ServerUnavailable, describe
from pidlease.wire.protocol import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    HEADER_BYTES_MAX,
    KAFKA_CRC_START,
    KAFKA_MAGIC,
    BatchHeader,
    batch_crc_ok,
    decode_batch_header,
    kafka_crc,
)

log = logging.getLogger("partition_server.log")

SEGMENT_SUFFIX = ".log"
# Bytes of log between two index entries (the server's ``index_interval_bytes``): a read
# walks about this much from an entry; the index takes 16 bytes an entry per file.
DEFAULT_INDEX_INTERVAL_BYTES = 4096
_INDEX_SUFFIXES = (OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX)
# The header's last field; read at every append without decoding the whole header.
_TIMESTAMP = struct.Struct(">q")
_TIMESTAMP_AT = BATCH_HEADER_SIZE - _TIMESTAMP.size
# The checksum covers a batch from the field after it on (protocol.py): base offset,
# length and checksum come first.
_CRC_FROM = struct.calcsize(">qII")
# A Kafka batch (byte 16 = magic 2, protocol.py) keeps its maxTimestamp at 35, its CRC-32C
# at 17 and its lastOffsetDelta at 23: what the append and the fetch path read of it.
_KAFKA_MAX_TS_AT = 35
_KAFKA_LEAD = struct.Struct(">qiibIhi")  # base, length, leader epoch, magic, crc, attrs, delta
_SCAN_CHUNK = 1 << 20  # bytes read at a time when walking whole segments (iter_headers)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def index_paths(segment_path: Path) -> tuple[Path, Path]:
    """The offset index and time index files of a segment."""
    return segment_path.with_suffix(OFFSET_INDEX_SUFFIX), segment_path.with_suffix(
        TIME_INDEX_SUFFIX
    )


class Segment:
    """One segment file (its fd opened read/write with O_APPEND) and its sparse index."""

    __slots__ = ("base_offset", "fd", "first_append_ms", "index", "path", "size")

    def __init__(self, base_offset: int, path: Path, fd: int, size: int) -> None:
        self.base_offset = base_offset
        self.path = path
        self.fd = fd
        self.size = size
        self.index = SegmentIndex()
        self.first_append_ms = -1  # when its first batch came (rolling by age)

    @property
    def max_timestamp_ms(self) -> int:
        """Newest batch timestamp (retention by time); -1 when empty."""
        return self.index.max_timestamp_ms


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
    batches: int = 0  # in the log (counted by the index files for the segments not read)
    bytes: int = 0  # read at open (the scanned segments)
    verified_batches: int = 0
    segments_from_index: int = 0  # closed segments below the tail: not read at all
    segments_scanned: int = 0
    indexes_rebuilt: int = 0  # missing, damaged or stale index files written anew
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
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    ) -> None:
        self.dir = directory
        self.segment_bytes_max = segment_bytes_max
        self.policy = policy or LogPolicy()
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self.index_interval_bytes = index_interval_bytes
        self.log_start_offset = 0
        self.segments: list[Segment] = []
        self._segment_bases: list[int] = []
        self.next_offset = 0
        self._dirty_fds: dict[int, None] = {}
        self._retired_fds: list[int] = []  # of cut segments; closed at the next take_dirty
        self._dir_dirty = False
        # The directory is opened when it must be fsynced, not held: a held descriptor per
        # partition was half a server's 20,000 at 10,000 partitions (issue 24: the run
        # stopped on EMFILE with 4,950 partitions open).

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
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    ) -> tuple[PartitionLog, OpenReport]:
        """Open (or create) the log in ``directory``. Closed segments that end at or below
        both ``verify_from_offset`` and ``replay_from_offset`` are loaded from their index
        files when those are sound and match, without reading the segment. The others are
        scanned: batches at or after ``verify_from_offset`` are fully validated (checksum,
        records); the first bad or partial batch and everything after it is truncated and
        reported. ``on_batch`` gets the header of every batch at or after
        ``replay_from_offset``, in log order. Segments below the persisted log start (left
        by a crash during a deletion) are removed first."""
        directory.mkdir(parents=True, exist_ok=True)
        self = cls(
            directory,
            segment_bytes_max,
            policy=policy,
            clock_ms=clock_ms,
            index_interval_bytes=index_interval_bytes,
        )
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
        tail_from = min(verify_from_offset, replay_from_offset)
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
            # A closed segment ends where the next one starts (checked as the loop goes on).
            end = int(paths[i + 1].name[:-4]) if i + 1 < len(paths) else None
            unusable = None if end is None else self._load_index(seg, end)
            if end is not None and unusable is None and end <= tail_from:
                report.segments_from_index += 1
                self.next_offset = expected = end
                continue
            seg.index = SegmentIndex()  # the scan builds it
            ok = self._scan_segment(seg, report, verify_from_offset, on_batch, replay_from_offset)
            report.segments_scanned += 1
            if ok and unusable is not None and self.next_offset == end:
                log.warning(
                    "%s: rebuilt the index of segment %s (%s)",
                    directory.name,
                    path.name,
                    unusable,
                )
                self._write_index(seg, end)
                report.indexes_rebuilt += 1
            expected = self.next_offset if self.segments else None
            if not ok:
                self._drop_segments(paths[i + 1 :], report, "after a truncated segment")
                break
        if not self.segments:
            self.next_offset = start
            self._new_segment(start)
        self.log_start_offset = self.segments[0].base_offset
        active = self.segments[-1]
        if active.size:
            active.first_append_ms = self._first_timestamp(active)
        swept = self._sweep_index_files()
        report.segments = len(self.segments)
        report.batches = self.batch_count
        if report.truncations:
            os.fsync(active.fd)
        if report.truncations or swept:
            # An index the active segment outgrows must be gone before it is appended to.
            self._fsync_dir()
        return self, report

    def _load_index(self, seg: Segment, end_offset: int) -> str | None:
        """Load a closed segment's index files into ``seg``; None when done, else why not."""
        offset_path, time_path = index_paths(seg.path)
        try:
            offset_raw = offset_path.read_bytes()
            time_raw = time_path.read_bytes()
        except FileNotFoundError as exc:
            return f"{Path(str(exc.filename)).name} is missing"
        except OSError as exc:
            return f"index unreadable: {exc}"
        try:
            desc, idx = decode_index(offset_raw, time_raw)
        except IndexDamaged as exc:
            return f"{seg.path.stem}{exc}"
        size = os.fstat(seg.fd).st_size
        if (desc.base_offset, desc.size, desc.end_offset) != (seg.base_offset, size, end_offset):
            return (
                f"{offset_path.name} describes offsets {desc.base_offset}..{desc.end_offset} "
                f"in {desc.size} bytes, the segment holds {seg.base_offset}..{end_offset} in "
                f"{size} bytes"
            )
        seg.index = idx
        seg.size = size
        return None

    def _write_index(self, seg: Segment, end_offset: int) -> None:
        """Write a closed segment's index files: a temporary file renamed over, so a
        crash leaves none, an old one, or one that fails its checksum; never fsynced (a
        lost or stale index is rebuilt at open). A failure is logged, never raised: the
        append that rolled the segment is written already."""
        raws = encode_index(seg.index, seg.base_offset, seg.size, end_offset)
        for path, raw in zip(index_paths(seg.path), raws, strict=True):
            tmp = path.with_name(path.name + ".tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    view = memoryview(raw)
                    written = 0
                    while written < len(raw):
                        written += os.write(fd, view[written:])
                finally:
                    os.close(fd)
                os.rename(tmp, path)
            except OSError as exc:
                log.warning(
                    "%s: could not write %s (%s); it is rebuilt at the next open",
                    self.dir.name,
                    path.name,
                    describe(exc),
                )
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                return
        self._dir_dirty = True

    def _remove_index(self, seg: Segment) -> bool:
        """Unlink a segment's index files; True if there were any."""
        removed = False
        for path in index_paths(seg.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed = True
        return removed

    def _sweep_index_files(self) -> bool:
        """Remove every index file that belongs to no closed segment: the active
        segment's (it is appended to), those of segments removed or dropped at open, and
        temporaries of a write a crash cut short. True if any went."""
        closed = {s.base_offset for s in self.segments[:-1]}
        removed = False
        for p in self.dir.iterdir():
            name = p.name.removesuffix(".tmp")
            stem, _, suffix = name.partition(".")
            if "." + suffix not in _INDEX_SUFFIXES or not stem.isdigit():
                continue
            if p.name != name or int(stem) not in closed:
                os.unlink(p)
                removed = True
        return removed

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
        interval = self.index_interval_bytes
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
            seg.index.add(h.base_offset, pos, h.timestamp_ms, interval)
            if on_batch is not None and h.base_offset >= replay_from:
                on_batch(h)
            pos += h.size
            self.next_offset = h.base_offset + h.count
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
        h = decode_batch_header(os.pread(seg.fd, HEADER_BYTES_MAX, 0))
        return min(h.timestamp_ms, self.clock_ms())

    # -- append ----------------------------------------------------------------------------
    def append(self, batch: bytes | bytearray, count: int, timestamp_ms: int = -1) -> int:
        """Write one batch whose ``base_offset`` is already ``next_offset``; returns it.
        The time index reads the timestamp from the batch header (so it is the one a scan
        would find); ``timestamp_ms``, the same value at every caller, is not needed. On a
        write error the segment is cut back so the log stays whole."""
        del timestamp_ms
        active = self.segments[-1]
        if active.size > 0 and self._should_roll(active, len(batch)):
            self._write_index(active, self.next_offset)
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
        ts_at = _KAFKA_MAX_TS_AT if batch[16] == KAFKA_MAGIC else _TIMESTAMP_AT
        (ts,) = _TIMESTAMP.unpack_from(batch, ts_at)
        active.index.add(base, pos, ts, self.index_interval_bytes)
        active.size += len(batch)
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
        persisted as the log start; never the active one), index files first (a crash
        leaves a segment below the log start, which the next open removes). Returns
        (segments, bytes). As in ``truncate_to``, their fds stay open until the next
        ``take_dirty``."""
        n = 0
        while n < len(self.segments) - 1 and self.segments[n + 1].base_offset <= offset:
            n += 1
        gone = self.segments[:n]
        for seg in gone:
            self._retire(seg)
        del self.segments[:n]
        del self._segment_bases[:n]
        if n:
            self.log_start_offset = self.segments[0].base_offset
            self._dir_dirty = True
        return n, sum(s.size for s in gone)

    def _retire(self, seg: Segment) -> None:
        """Remove a segment's files; its fd is closed at the next ``take_dirty``."""
        self._remove_index(seg)
        self._dirty_fds.pop(seg.fd, None)
        self._retired_fds.append(seg.fd)
        seg.path.unlink()

    def restart_at(self, offset: int) -> None:
        """Drop every segment and go on with an empty log at ``offset``, beyond the end (a
        follower whose whole log is below its leader's log start). The log start is
        persisted first: a crash midway reopens the old log or an empty one at
        ``offset``, and either is fetched on from the leader."""
        assert offset > self.next_offset, (offset, self.next_offset)
        write_log_start(self.dir, offset)
        for seg in self.segments:
            self._retire(seg)
        self.segments.clear()
        self._segment_bases.clear()
        self.next_offset = self.log_start_offset = offset
        self._new_segment(offset)
        self._fsync_dir()
        log.warning("%s: the log now starts (empty) at offset %d", self.dir.name, offset)

    def truncate_to(self, offset: int) -> int:
        """Cut the log back so it ends at the start of the batch holding ``offset`` (a
        follower dropping a suffix that diverges from its leader's). Returns the new end.
        A flush may be running: the fds of dropped segments stay open until the next
        ``take_dirty`` (closing one under a running fsync would fail it, and a failed fsync
        stops the server; a reused number would fsync some other file)."""
        if max(offset, self.log_start_offset) >= self.next_offset:
            return self.next_offset  # nothing at or above it (an empty log included)
        si, pos, h = self._locate(max(offset, self.log_start_offset))
        cut = h.base_offset
        for seg in self.segments[si + 1 :]:
            self._retire(seg)
        del self.segments[si + 1 :]
        del self._segment_bases[si + 1 :]
        seg = self.segments[si]
        if self._remove_index(seg):
            # It becomes the active segment: its index files are gone for good before any
            # of its bytes are (else a crash could keep an index of bytes cut and rewritten).
            self._fsync_dir()
        gone = self._count_batches(seg, pos, cut)
        os.ftruncate(seg.fd, pos)
        seg.size = pos
        idx = seg.index
        idx.cut(cut)
        idx.batches -= gone
        idx.max_timestamp_ms = idx.max_below_last_entry()
        if idx.offsets:  # the batches from the last entry to the cut: about one interval
            for _, kept in self._walk(seg, idx.positions[-1], idx.offsets[-1]):
                idx.max_timestamp_ms = max(idx.max_timestamp_ms, kept.timestamp_ms)
        if not pos:
            seg.first_append_ms = -1  # set again by the next append
        elif seg.first_append_ms < 0:  # a closed segment loaded at open: active again
            seg.first_append_ms = self._first_timestamp(seg)
        self.next_offset = cut
        os.fsync(seg.fd)
        self._fsync_dir()
        log.warning("%s: truncated the log to offset %d (asked for %d)", self.dir.name, cut, offset)
        return cut

    def _count_batches(self, seg: Segment, pos: int, offset: int) -> int:
        """Batches from ``pos`` (the one at ``offset``) to the segment's end: those a cut
        drops. Counts up to a corrupt one, which goes with the rest."""
        n = 0
        with contextlib.suppress(CorruptRecord):
            for _ in self._walk(seg, pos, offset, _SCAN_CHUNK):
                n += 1
        return n

    def cut_point(self, offset: int) -> int:
        """Where :meth:`truncate_to` with ``offset`` makes the log end (nothing changes)."""
        if max(offset, self.log_start_offset) >= self.next_offset:
            return self.next_offset
        return self._locate(max(offset, self.log_start_offset))[2].base_offset

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
        in use: cut segments' fds are closed here (and when that flush ends,
        ``release_retired``)."""
        self.release_retired()
        fds = list(self._dirty_fds)
        self._dirty_fds.clear()
        if self._dir_dirty:
            # Opened for this flush; closed at the next take_dirty, as a cut segment's is
            # (the flusher is done with what it was handed before).
            dfd = os.open(self.dir, os.O_RDONLY)
            fds.append(dfd)
            self._retired_fds.append(dfd)
            self._dir_dirty = False
        return fds

    def release_retired(self) -> None:
        """Close the fds retired since the last flush took its fds (cut segments', the
        directory's opened for a flush): called when that flush has ended. Kept until the
        next ``take_dirty`` only, a partition written once held its directory open for
        good: at 10,000 partitions a server reached its descriptor limit (EMFILE), its
        flusher stopped and the partitions it was flushing never acked again."""
        for fd in self._retired_fds:
            os.close(fd)
        self._retired_fds.clear()

    def _fsync_dir(self) -> None:
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def fsync_all(self) -> None:
        """fsync every segment and the directory, now (recovery: a killed process leaves
        written but unsynced pages)."""
        for seg in self.segments:
            os.fsync(seg.fd)
        self._fsync_dir()

    # -- read ------------------------------------------------------------------------------
    def _walk(
        self, seg: Segment, pos: int, offset: int, chunk: int = 0
    ) -> Iterator[tuple[int, BatchHeader]]:
        """(file position, header) of ``seg``'s batches from the one at ``pos``, whose
        base offset is ``offset``, to the segment's end, reading ``chunk`` bytes at a time
        (default: about two index intervals, what a walk from an entry needs). Each header
        must follow on from the one before: CorruptRecord, logged, if not. Checksums are
        not checked here."""
        chunk = max(chunk or 2 * self.index_interval_bytes + 1024, HEADER_BYTES_MAX)
        buf = b""
        at = pos  # the file position of buf[0]
        while pos < seg.size:
            # A header of either format, as much of it as the segment holds.
            if pos + min(HEADER_BYTES_MAX, seg.size - pos) > at + len(buf):
                at, buf = pos, os.pread(seg.fd, min(chunk, seg.size - pos), pos)
            h = self._header(seg, buf, pos - at, pos, offset)
            yield pos, h
            pos += h.size
            offset = h.base_offset + h.count

    def _header(self, seg: Segment, buf: bytes, rel: int, pos: int, offset: int) -> BatchHeader:
        """The header at ``buf[rel:]`` (file position ``pos``) of the batch that should
        start at ``offset``, checked to be that and to fit in the segment."""
        if len(buf) - rel < BATCH_HEADER_SIZE:
            self._corrupt(seg, offset, pos, "partial batch header")
        h = decode_batch_header(buf, rel)
        if h.base_offset != offset:
            self._corrupt(seg, offset, pos, f"header says offset {h.base_offset}")
        if h.count < 1 or h.batch_len < BATCH_HEADER_SIZE - 12 or pos + h.size > seg.size:
            self._corrupt(seg, offset, pos, "bad batch length or count")
        return h

    def _corrupt(self, seg: Segment, offset: int, pos: int, why: str) -> NoReturn:
        log.error(
            "%s: corrupt batch at offset %d in segment %s (file position %d): %s",
            self.dir.name,
            offset,
            seg.path.name,
            pos,
            why,
        )
        raise CorruptRecord(f"stored batch at offset {offset} is corrupt: {why}")

    def _locate(self, offset: int) -> tuple[int, int, BatchHeader]:
        """(segment index, file position, header) of the batch holding ``offset``: the
        index entry at or below it, then a walk of the headers from there."""
        si = bisect_right(self._segment_bases, offset) - 1
        while si >= 0:
            seg = self.segments[si]
            k = seg.index.floor(offset)
            if k >= 0:
                found: tuple[int, BatchHeader] | None = None
                for found in self._walk(seg, seg.index.positions[k], seg.index.offsets[k]):
                    if found[1].base_offset + found[1].count > offset:
                        break
                if found is not None:
                    return si, found[0], found[1]
            si -= 1  # an empty segment; the batch is in an earlier one
        raise CorruptRecord(f"offset {offset} is not in the log")

    def read(self, offset: int, max_bytes: int, end_offset: int) -> list[bytes]:
        """Whole batches from the one holding ``offset`` up to ``max_bytes`` (at least one
        batch) and below ``end_offset``. Checksums are verified: CorruptRecord if bad."""
        if offset >= end_offset or offset < 0:
            return []
        si = bisect_right(self._segment_bases, offset) - 1
        while si >= 0 and self.segments[si].size == 0:
            si -= 1  # an empty segment; the batch is in an earlier one
        if si < 0:
            raise CorruptRecord(f"offset {offset} is not in the log")
        seg = self.segments[si]
        k = seg.index.floor(offset)
        pos, first = seg.index.positions[k], seg.index.offsets[k]
        chunks: list[bytes] = []
        total = 0
        while True:
            data, total, more = self._read_segment(
                seg, pos, first, offset, total, max_bytes, end_offset
            )
            if data:
                chunks.append(data)
            si += 1
            if not more or si == len(self.segments):
                return chunks
            seg = self.segments[si]
            pos = 0
            first = offset = seg.base_offset

    def _read_segment(
        self,
        seg: Segment,
        pos: int,
        offset: int,
        want: int,
        total: int,
        max_bytes: int,
        end_offset: int,
    ) -> tuple[bytes, int, bool]:
        """Walk ``seg`` from the batch at ``pos`` (base ``offset``) to the one holding
        ``want`` and take whole batches from there, below ``end_offset``, while ``total``
        stays within ``max_bytes`` (a first batch always). One read usually covers the
        walk and the batches; each batch taken is checked (header, checksum). Returns
        (the bytes taken, the new total, whether the segment ran out before a stop).
        The fetch path: headers are unpacked as plain tuples, not BatchHeader objects."""
        hint = max_bytes - total + 2 * self.index_interval_bytes + BATCH_HEADER_SIZE
        unpack, crc32, seg_size = BATCH_HEADER.unpack_from, zlib.crc32, seg.size
        buf = b""
        view = memoryview(buf)
        at = start = pos  # at: file position of buf[0]; start: of the first batch taken
        while pos < seg_size:
            rel = pos - at
            if rel + BATCH_HEADER_SIZE > len(buf):
                buf, at = self._more(seg, buf, at, start, pos + BATCH_HEADER_SIZE, hint)
                view, rel = memoryview(buf), pos - at
                if rel + BATCH_HEADER_SIZE > len(buf):
                    self._corrupt(seg, offset, pos, "partial batch header")
            kafka = buf[rel + 16] == KAFKA_MAGIC
            if kafka:
                base, batch_len, _, _, crc, _, delta = _KAFKA_LEAD.unpack_from(buf, rel)
                count = delta + 1
            else:
                base, batch_len, crc, _, _, _, _, count, _ = unpack(buf, rel)
            size = batch_len + 12
            if base != offset or count < 1 or size < BATCH_HEADER_SIZE or pos + size > seg_size:
                self._header(seg, buf, rel, pos, offset)  # says what is wrong, and raises
            if base + count <= want:  # below the batch asked for
                pos += size
                start = pos
                offset = base + count
                continue
            if base >= end_offset or (total > 0 and total + size > max_bytes):
                return buf[start - at : pos - at], total, False
            if rel + size > len(buf):
                buf, at = self._more(seg, buf, at, start, pos + size, hint)
                view, rel = memoryview(buf), pos - at
            if kafka:
                ok = kafka_crc(buf, rel + KAFKA_CRC_START, rel + size) == crc
            else:
                ok = crc32(view[rel + _CRC_FROM : rel + size]) == crc
            if not ok:
                log.error(
                    "%s: corrupt batch at offset %d in segment %s (file position %d)",
                    self.dir.name,
                    offset,
                    seg.path.name,
                    pos,
                )
                raise CorruptRecord(f"stored batch at offset {offset} fails its checksum")
            total += size
            pos += size
            offset = base + count
            if total >= max_bytes or offset >= end_offset:
                return buf[start - at : pos - at], total, False  # no need for the next header
        return buf[start - at : pos - at], total, True

    def _more(
        self, seg: Segment, buf: bytes, at: int, keep: int, need: int, hint: int
    ) -> tuple[bytes, int]:
        """``buf`` (read at ``at``) grown to reach file position ``need``, keeping the
        bytes from ``keep`` on (the batches taken so far) and dropping those before."""
        buf = buf[keep - at :]
        have = keep + len(buf)
        n = min(max(need - have, hint), seg.size - have)
        return buf + os.pread(seg.fd, n, have), keep

    def offset_for_timestamp(self, timestamp_ms: int, end_offset: int) -> int:
        """The base offset of the first batch (in log order, from the log start, below
        ``end_offset``) whose timestamp is at or after ``timestamp_ms``; ``end_offset``
        when there is none. Batch timestamps are the producers' and need not grow with the
        offset: the first batch at or after the time wins, as in Kafka's ListOffsets.
        Segments whose newest batch is older are skipped; in the first that is not, the
        time index says where to walk from."""
        for seg in self.segments:
            if seg.size == 0 or seg.base_offset >= end_offset:
                break
            if seg.max_timestamp_ms < timestamp_ms:
                continue  # every batch of this segment is older
            k = seg.index.time_floor(timestamp_ms)
            for _, h in self._walk(seg, seg.index.positions[k], seg.index.offsets[k]):
                if h.base_offset >= end_offset:
                    return end_offset
                if h.timestamp_ms >= timestamp_ms:
                    return h.base_offset
        return end_offset

    def iter_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers of stored batches from the one holding ``from_offset`` (to rebuild state)."""
        if max(from_offset, self.log_start_offset) >= self.next_offset:
            return  # nothing stored there (a log cut back to its start is empty)
        si, pos, h = self._locate(max(from_offset, self.log_start_offset))
        offset = h.base_offset
        for k in range(si, len(self.segments)):
            seg = self.segments[k]
            if k > si:
                pos, offset = 0, seg.base_offset
            for _, header in self._walk(seg, pos, offset, _SCAN_CHUNK):
                yield header

    def batches(self, seg: Segment) -> list[tuple[int, int]]:
        """(base offset, file position) of every batch of ``seg``, read from its headers
        (tests and tools: the log itself keeps only the sparse index)."""
        return [(h.base_offset, p) for p, h in self._walk(seg, 0, seg.base_offset, _SCAN_CHUNK)]

    @property
    def batch_count(self) -> int:
        return sum(s.index.batches for s in self.segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def close(self) -> None:
        for fd in [s.fd for s in self.segments] + self._retired_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.segments.clear()
        self._retired_fds.clear()


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
            describe(exc),
        )
