"""The sparse offset index and time index of one log segment, and the bytes of their files.
Pure: no I/O (``log.py`` reads and writes the files, so the simulation's disk sees them).

Offset index: (base offset, file position) of the segment's first batch, then of the first
batch starting ``interval_bytes`` or more after the previous entry. A lookup takes the entry
at or below an offset and walks batch headers from there: about one interval of them, not
the segment.

Time index: entries (t, offset), each at an offset-index entry: ``t`` is the newest batch
timestamp of the segment's batches below ``offset``, written only where it grows. Batch
timestamps are the producers' and need not grow with the offset, so this running maximum
is what lets a search skip: every batch below the offset-index entry just before the first
time entry with ``t >= T`` is older than T, and a batch at or after T comes within one
interval of it.

Files (closed segments only, next to ``<base>.log``): ``<base>.index`` and
``<base>.timeindex``. Each is a header (magic; the segment's base offset, size, end offset,
newest timestamp and batch count it describes; its number of entries), two columns of
big-endian i64 and a CRC32 of everything before it. The header lets an open check the
index against the segment file; a damaged or mismatched index is rebuilt by a scan.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

_OFFSET_MAGIC = b"PLOFFIX1"
_TIME_MAGIC = b"PLTIMIX1"
# magic, base offset, segment size, end offset, max timestamp, batches, entries
_HEAD = struct.Struct(">8sqqqqqI")
_CRC = struct.Struct(">I")
_I64 = 8


class IndexDamaged(Exception):
    """An index file that cannot be used (the reason is the message)."""


@dataclass(frozen=True)
class Described:
    """What an index file says of its segment."""

    base_offset: int
    size: int
    end_offset: int
    max_timestamp_ms: int
    batches: int


class SegmentIndex:
    """The in-memory index of one segment (see the module docstring), with the segment's
    newest batch timestamp and batch count."""

    __slots__ = ("batches", "max_timestamp_ms", "offsets", "positions", "time_max", "time_offsets")

    def __init__(self) -> None:
        self.offsets = array("q")
        self.positions = array("q")
        self.time_max = array("q")
        self.time_offsets = array("q")
        self.max_timestamp_ms = -1  # -1: no batch (as retention reads it)
        self.batches = 0

    def add(self, offset: int, position: int, timestamp_ms: int, interval_bytes: int) -> None:
        """Note the segment's next batch (every batch, in order)."""
        if not self.positions or position - self.positions[-1] >= interval_bytes:
            if self.positions and (not self.time_max or self.max_timestamp_ms > self.time_max[-1]):
                self.time_max.append(self.max_timestamp_ms)
                self.time_offsets.append(offset)
            self.offsets.append(offset)
            self.positions.append(position)
        self.max_timestamp_ms = max(self.max_timestamp_ms, timestamp_ms)
        self.batches += 1

    def floor(self, offset: int) -> int:
        """The entry at or below ``offset``; -1 for none (an empty segment)."""
        return bisect_right(self.offsets, offset) - 1

    def time_floor(self, timestamp_ms: int) -> int:
        """The entry to walk from for the first batch at or after ``timestamp_ms``: every
        batch below it is older; -1 for an empty segment."""
        j = bisect_left(self.time_max, timestamp_ms)
        if j == len(self.time_max):
            return len(self.offsets) - 1
        return bisect_left(self.offsets, self.time_offsets[j]) - 1

    def cut(self, offset: int) -> None:
        """Forget the entries at or above ``offset`` (the segment was cut there). The
        caller sets ``max_timestamp_ms`` (from :meth:`max_below_last_entry` and the batches
        from the last entry on) and ``batches``."""
        k = bisect_left(self.offsets, offset)
        del self.offsets[k:]
        del self.positions[k:]
        j = bisect_left(self.time_offsets, offset)
        del self.time_max[j:]
        del self.time_offsets[j:]

    def max_below_last_entry(self) -> int:
        """The newest timestamp of the batches below the last entry (-1 for none)."""
        return self.time_max[-1] if len(self.offsets) > 1 else -1


def encode_index(
    idx: SegmentIndex, base_offset: int, size: int, end_offset: int
) -> tuple[bytes, bytes]:
    """The bytes of ``<base>.index`` and ``<base>.timeindex`` for a closed segment."""
    desc = (base_offset, size, end_offset, idx.max_timestamp_ms, idx.batches)
    return (
        _encode(_OFFSET_MAGIC, desc, idx.offsets, idx.positions),
        _encode(_TIME_MAGIC, desc, idx.time_max, idx.time_offsets),
    )


def decode_index(offset_raw: bytes, time_raw: bytes) -> tuple[Described, SegmentIndex]:
    """Parse and check both files (magic, length, checksum, that they describe the same
    segment, that the entries lie inside it). Raises IndexDamaged saying what is wrong."""
    desc, offsets, positions = _decode(_OFFSET_MAGIC, offset_raw, OFFSET_INDEX_SUFFIX)
    tdesc, time_max, time_offsets = _decode(_TIME_MAGIC, time_raw, TIME_INDEX_SUFFIX)
    if tdesc != desc:
        raise IndexDamaged(f"{TIME_INDEX_SUFFIX} and {OFFSET_INDEX_SUFFIX} disagree")
    if (desc.size == 0) != (len(offsets) == 0) or (desc.size == 0) != (desc.batches == 0):
        raise IndexDamaged(f"{OFFSET_INDEX_SUFFIX} has entries that do not fit the size")
    if offsets and (
        offsets[0] != desc.base_offset
        or positions[0] != 0
        or positions[-1] >= desc.size
        or offsets[-1] >= desc.end_offset
    ):
        raise IndexDamaged(f"{OFFSET_INDEX_SUFFIX} entries lie outside the segment")
    if len(time_max) >= max(len(offsets), 1):
        raise IndexDamaged(f"{TIME_INDEX_SUFFIX} has more entries than {OFFSET_INDEX_SUFFIX}")
    idx = SegmentIndex()
    idx.offsets, idx.positions = offsets, positions
    idx.time_max, idx.time_offsets = time_max, time_offsets
    idx.max_timestamp_ms, idx.batches = desc.max_timestamp_ms, desc.batches
    return desc, idx


def _encode(
    magic: bytes, desc: tuple[int, int, int, int, int], first: array[int], second: array[int]
) -> bytes:
    body = _HEAD.pack(magic, *desc, len(first)) + _column(first) + _column(second)
    return body + _CRC.pack(zlib.crc32(body))


def _decode(magic: bytes, raw: bytes, what: str) -> tuple[Described, array[int], array[int]]:
    if len(raw) < _HEAD.size + _CRC.size:
        raise IndexDamaged(f"{what} is {len(raw)} bytes, shorter than its header")
    fields = _HEAD.unpack_from(raw)
    if fields[0] != magic:
        raise IndexDamaged(f"{what} has a wrong magic")
    n = fields[-1]
    end = _HEAD.size + 2 * n * _I64
    if len(raw) != end + _CRC.size:
        raise IndexDamaged(f"{what} is {len(raw)} bytes, its header says {end + _CRC.size}")
    if _CRC.unpack_from(raw, end)[0] != zlib.crc32(memoryview(raw)[:end]):
        raise IndexDamaged(f"{what} fails its checksum")
    mid = _HEAD.size + n * _I64
    return Described(*fields[1:-1]), _array(raw, _HEAD.size, mid), _array(raw, mid, end)


def _column(a: array[int]) -> bytes:
    if sys.byteorder == "big":
        return a.tobytes()
    swapped = array("q", a)
    swapped.byteswap()
    return swapped.tobytes()


def _array(raw: bytes, start: int, end: int) -> array[int]:
    a = array("q")
    a.frombytes(raw[start:end])
    if sys.byteorder == "little":
        a.byteswap()
    return a
