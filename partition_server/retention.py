"""Retention: a partition's log policy (from its topic's record), which closed segments
the policy lets go, and the persisted log start.

A segment may go only when all of these hold: it is closed (never the active one), its
end is at or below the high watermark (a reader or a follower may still need what is not
committed), and its end is at or below the ``replay_from`` of the newest snapshot written
(recovery replays each log from there, so the producer state carried by older batches
lives in that snapshot's rows, not in the segments). Then it goes when it is older than
``retention_ms`` (its newest batch timestamp) or while the partition is over
``retention_bytes``. Segments go from the old end only, so the log stays one range.

The log start (``<partition dir>/log-start``) is written atomically before any file is
unlinked: a crash in between leaves segments below it, and the next open removes them.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from partition_server.atomic_file import write_atomically
from pidlease.wire.cluster import TopicSpec

log = logging.getLogger("partition_server.retention")

LOG_START_FILE = "log-start"
_MAGIC = b"PLSTART1"
_BODY = struct.Struct(">q")
_CRC = struct.Struct(">I")


@dataclass(frozen=True)
class LogPolicy:
    """-1: no limit (keep forever, never roll by age); ``segment_bytes`` 0: the server's
    ``segment_bytes_max``. The default keeps everything, as before topics had settings."""

    retention_ms: int = -1
    retention_bytes: int = -1
    segment_bytes: int = 0
    segment_ms: int = -1

    @classmethod
    def from_spec(cls, spec: TopicSpec | None) -> LogPolicy:
        if spec is None:
            return cls()
        return cls(spec.retention_ms, spec.retention_bytes, spec.segment_bytes, spec.segment_ms)


@dataclass(frozen=True)
class SegmentInfo:
    """What the plan needs of one segment: its offsets, size and newest batch time."""

    base_offset: int
    end_offset: int
    size: int
    max_timestamp_ms: int


def segments_to_delete(
    segments: list[SegmentInfo],
    policy: LogPolicy,
    now_ms: int,
    *,
    high_watermark: int,
    replay_from: int,
    release_below: int = 0,
) -> tuple[int, int]:
    """(segments the policy lets go from the old end, how many more it would let go but for
    ``replay_from``). The last segment (the active one) never goes. A segment ending at or
    below ``release_below`` goes whatever the policy (what a checkpoint of the group log
    superseded)."""
    total = sum(s.size for s in segments)
    n = blocked = 0
    for s in segments[:-1]:
        by_time = policy.retention_ms >= 0 and s.max_timestamp_ms < now_ms - policy.retention_ms
        by_size = policy.retention_bytes >= 0 and total - s.size >= policy.retention_bytes
        released = s.end_offset <= release_below
        if not (by_time or by_size or released) or s.end_offset > high_watermark:
            break
        if s.end_offset > replay_from:
            blocked += 1
            break
        n += 1
        total -= s.size
    return n, blocked


def read_log_start(directory: Path) -> int:
    """The persisted log start; 0 when there is none or it is damaged (said so in the log:
    the first segment's base is the log start then)."""
    path = directory / LOG_START_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    n = len(_MAGIC) + _BODY.size
    if len(raw) != n + _CRC.size or raw[: len(_MAGIC)] != _MAGIC:
        log.warning("%s: damaged %s ignored", directory.name, LOG_START_FILE)
        return 0
    (crc,) = _CRC.unpack_from(raw, n)
    if crc != zlib.crc32(raw[:n]):
        log.warning("%s: %s fails its checksum; ignored", directory.name, LOG_START_FILE)
        return 0
    (offset,) = _BODY.unpack_from(raw, len(_MAGIC))
    return int(offset)


def write_log_start(directory: Path, offset: int) -> None:
    """Blocking (fsyncs)."""
    body = _MAGIC + _BODY.pack(offset)
    write_atomically(directory / LOG_START_FILE, body + _CRC.pack(zlib.crc32(body)))
