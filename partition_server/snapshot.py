"""Snapshots: one file per server holding, for every partition, the next offset and the
producer state of the log prefix below it (the seed's "snapshot ... along with the current
offset vector"). Recovery loads the newest valid one and replays each log from its offset.

File layout (big-endian), written atomically (tmp file, fsync, rename, fsync dir):

    magic "PLSNAP01" | u32 crc32(body) | u64 len(body) | body
    body = i64 created_ms, u32 partitions, then per partition:
        u16+utf8 topic, u32 partition, i64 next_offset, u32 rows, then per row:
        u64 pid, u32 generation, i64 highwater, i64 last_use_ms, u8 batches,
        batches x (i64 base_seq, i64 last_seq, i64 base_offset)

A file whose magic, length or checksum is wrong is skipped (and logged), and the next
older one is tried; the last ``kept`` files are kept.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from partition_server.producer_state import Row

log = logging.getLogger("partition_server.snapshot")

MAGIC = b"PLSNAP01"
_HEAD = struct.Struct(">IQ")
_BODY_HEAD = struct.Struct(">qI")
_PART = struct.Struct(">IqI")
_ROW = struct.Struct(">QIqqB")
_BATCH = struct.Struct(">qqq")
_U16 = struct.Struct(">H")
SUFFIX = ".snap"


class CorruptSnapshot(Exception):
    pass


@dataclass
class Snapshot:
    created_ms: int
    # (topic, partition) -> (next_offset, rows)
    partitions: dict[tuple[str, int], tuple[int, list[Row]]] = field(default_factory=dict)


def encode(snap: Snapshot) -> bytes:
    out = bytearray(_BODY_HEAD.pack(snap.created_ms, len(snap.partitions)))
    row_pack, batch_pack = _ROW.pack, _BATCH.pack
    for (topic, partition), (next_offset, rows) in snap.partitions.items():
        t = topic.encode()
        out += _U16.pack(len(t)) + t + _PART.pack(partition, next_offset, len(rows))
        parts = []
        for pid, gen, hw, last_use_ms, batches in rows:
            parts.append(row_pack(pid, gen, hw, last_use_ms, len(batches)))
            for b in batches:
                parts.append(batch_pack(*b))
        out += b"".join(parts)
    body = bytes(out)
    return MAGIC + _HEAD.pack(zlib.crc32(body), len(body)) + body


def decode(raw: bytes) -> Snapshot:
    if len(raw) < len(MAGIC) + _HEAD.size or raw[:len(MAGIC)] != MAGIC:
        raise CorruptSnapshot("not a snapshot file (bad magic)")
    crc, n = _HEAD.unpack_from(raw, len(MAGIC))
    body = memoryview(raw)[len(MAGIC) + _HEAD.size:]
    if len(body) != n:
        raise CorruptSnapshot(f"body is {len(body)} bytes, header says {n}")
    if zlib.crc32(body) != crc:
        raise CorruptSnapshot("checksum mismatch")
    try:
        created_ms, nparts = _BODY_HEAD.unpack_from(body, 0)
        pos = _BODY_HEAD.size
        snap = Snapshot(created_ms)
        row_unpack, batch_unpack = _ROW.unpack_from, _BATCH.unpack_from
        for _ in range(nparts):
            (tl,) = _U16.unpack_from(body, pos)
            pos += 2
            topic = bytes(body[pos:pos + tl]).decode()
            pos += tl
            partition, next_offset, nrows = _PART.unpack_from(body, pos)
            pos += _PART.size
            rows: list[Row] = []
            for _ in range(nrows):
                pid, gen, hw, last_use, nb = row_unpack(body, pos)
                pos += _ROW.size
                batches = []
                for _ in range(nb):
                    batches.append(batch_unpack(body, pos))
                    pos += _BATCH.size
                rows.append((pid, gen, hw, last_use, batches))
            snap.partitions[(topic, partition)] = (next_offset, rows)
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptSnapshot(f"malformed body: {exc}") from exc
    if pos != len(body):
        raise CorruptSnapshot(f"{len(body) - pos} unexpected bytes after the last partition")
    return snap


class SnapshotStore:
    """The snapshot files of one server, in ``<data_dir>/snapshots``."""

    def __init__(self, directory: Path, kept: int = 2) -> None:
        self.dir = directory
        self.kept = kept
        directory.mkdir(parents=True, exist_ok=True)

    def files(self) -> list[Path]:
        """Snapshot files, newest first."""
        return sorted((p for p in self.dir.iterdir()
                       if p.name.endswith(SUFFIX) and p.name[:-len(SUFFIX)].isdigit()),
                      reverse=True)

    def write(self, snap: Snapshot) -> tuple[Path, int]:
        """Write atomically; returns (path, bytes). Blocking: run it in an executor."""
        existing = self.files()
        seq = int(existing[0].name[:-len(SUFFIX)]) + 1 if existing else 1
        path = self.dir / f"{seq:020d}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        data = encode(snap)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            written = 0
            while written < len(data):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        for old in self.files()[self.kept:]:
            old.unlink(missing_ok=True)
        return path, len(data)

    def load_newest(self) -> tuple[Snapshot, Path] | None:
        for stale in self.dir.glob("*.tmp"):
            stale.unlink(missing_ok=True)  # a crash mid-write; never renamed, never valid
        for path in self.files():
            try:
                return decode(path.read_bytes()), path
            except (CorruptSnapshot, OSError) as exc:
                log.warning("snapshot %s is unusable (%s); trying an older one", path.name, exc)
        return None
