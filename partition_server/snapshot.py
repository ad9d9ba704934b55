"""Snapshots: one file per server holding, for every partition, its producer state and
the offsets that say which part of the log that state covers (the producer state with the
offset vector of all the server's partitions). Recovery loads the newest valid one and
replays each log from the partition's ``replay_from`` offset.

Rows are captured in chunks while appends go on (so 1M PIDs never stall the event loop for
seconds): ``replay_from`` is the log end when the capture began, ``covered_to`` the log end
when it finished; every row reflects only batches below ``covered_to``, which is fsynced
before the file is written. Replay from ``replay_from`` is idempotent (a batch already in
a row is skipped), so the result is exact. A log that ends before ``covered_to`` lost data
the rows describe: that partition is rebuilt from offset 0 instead. So is one whose log a
follower cut back since the capture began: the image carries the truncation count read
before its first row (``epochs.py``), and the log manager leaves out a partition cut while its
snapshot was taken.

File layout (big-endian), written atomically (tmp file, fsync, rename, fsync dir):

    magic "PLSNAP05" | u32 crc32(body) | u64 len(body) | body
    body = i64 created_ms, u32 partitions, then per partition:
        u16+utf8 topic, u32 partition, i64 replay_from, i64 covered_to,
        i64 truncations (PLSNAP02 files lack it: read as 0),
        i64 dropped_last_use_max_ms (PLSNAP03 and 02 files lack it: read as created_ms), u32 rows,
        u32 batch_words, u32 lags (PLSNAP04 and older lack it and the pairs below),
        rows x (u64 pid, u32 generation, i64 highwater, i64 last_use_ms,
        u8 batches), batch_words x i64 (the rows' batches as flat (base_seq, last_seq,
        base_offset) triples, in row order), lags x (u64 pid, i64 durable_highwater)

``durable`` (the lags): the durable highwater of each PID whose batches above the high
watermark are in the rows (``ProducerStateTable.durable_lags``); every other row's is its
highwater. A rebuild that does not trust the rows (a cut since) goes back to it for a PID
whose kept batches were all cut (``producer_state.cut_row``); files from before PLSNAP05
do not know it (``durable`` None), and such a PID is then not restored, as before.

A file whose magic, length or checksum is wrong is skipped (and logged), and the next
older one is tried; the last ``kept`` files are kept.

``dropped_last_use_max_ms`` (producer_state.py: the newest last use of any PID the
partition expired or evicted) needs no other home than the snapshot: it is read after the
rows are captured, so it covers every PID missing from them, and a PID dropped after the
capture is in the rows or in the log replayed over them, so recovery from this file (or
an older one, or none) holds its state again. Files from before the field read it as
their ``created_ms``, which no PID dropped before the capture can have been used after.
"""

from __future__ import annotations

import logging
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from partition_server.atomic_file import write_atomically
from partition_server.producer_state import Row
from pidlease.errors import describe

log = logging.getLogger("partition_server.snapshot")

MAGIC = b"PLSNAP05"
MAGIC_V4 = b"PLSNAP04"  # before the durable highwaters (lags)
MAGIC_V3 = b"PLSNAP03"  # before the dropped-PID horizon
MAGIC_V2 = b"PLSNAP02"  # before replication: no truncation count
_HEAD = struct.Struct(">IQ")
_BODY_HEAD = struct.Struct(">qI")
_PART = struct.Struct(">IqqqqIII")
_PART_V4 = struct.Struct(">IqqqqII")
_PART_V3 = struct.Struct(">IqqqII")
_PART_V2 = struct.Struct(">IqqII")
_ROW = struct.Struct(">QIqqB")
_LAG = struct.Struct(">Qq")
_U16 = struct.Struct(">H")
SUFFIX = ".snap"
_SWAP = sys.byteorder == "little"


class CorruptSnapshot(Exception):
    pass


@dataclass
class PartitionImage:
    replay_from: int
    covered_to: int
    rows: list[Row] = field(default_factory=list)
    truncations: int = 0  # the partition's truncation count at capture (epochs.py)
    dropped_last_use_max_ms: int = 0  # newest last use of a PID dropped before capture
    # pid -> durable highwater, where it lags the row's highwater; None: not known (a file
    # from before PLSNAP05)
    durable: dict[int, int] | None = field(default_factory=dict)

    def durable_highwater(self, pid: int, highwater: int) -> int | None:
        """The durable highwater of the row of ``pid`` (whose highwater is ``highwater``),
        None when the file did not record it."""
        if self.durable is None:
            return None
        return self.durable.get(pid, highwater)


@dataclass
class Snapshot:
    created_ms: int
    partitions: dict[tuple[str, int], PartitionImage] = field(default_factory=dict)


def _be(words: array[int]) -> bytes:
    if _SWAP:
        words = array("q", words)
        words.byteswap()
    return words.tobytes()


def encode(snap: Snapshot) -> bytes:
    out = [_BODY_HEAD.pack(snap.created_ms, len(snap.partitions))]
    row_pack = _ROW.pack
    for (topic, partition), img in snap.partitions.items():
        t = topic.encode()
        flat = array("q")
        for r in img.rows:
            flat.extend(r[4])
        lags = img.durable or {}
        out.append(
            _U16.pack(len(t))
            + t
            + _PART.pack(
                partition,
                img.replay_from,
                img.covered_to,
                img.truncations,
                img.dropped_last_use_max_ms,
                len(img.rows),
                len(flat),
                len(lags),
            )
        )
        out.append(
            b"".join([row_pack(pid, gen, hw, lu, len(b) // 3) for pid, gen, hw, lu, b in img.rows])
        )
        out.append(_be(flat))
        out.append(b"".join([_LAG.pack(pid, dhw) for pid, dhw in lags.items()]))
    body = b"".join(out)
    return MAGIC + _HEAD.pack(zlib.crc32(body), len(body)) + body


def decode(raw: bytes) -> Snapshot:
    magic = raw[: len(MAGIC)]
    if len(raw) < len(MAGIC) + _HEAD.size or magic not in (MAGIC, MAGIC_V4, MAGIC_V3, MAGIC_V2):
        raise CorruptSnapshot("not a snapshot file (bad magic)")
    v2 = magic == MAGIC_V2
    v3 = magic == MAGIC_V3
    v4 = magic == MAGIC_V4
    crc, n = _HEAD.unpack_from(raw, len(MAGIC))
    body = memoryview(raw)[len(MAGIC) + _HEAD.size :]
    if len(body) != n:
        raise CorruptSnapshot(f"body is {len(body)} bytes, header says {n}")
    if zlib.crc32(body) != crc:
        raise CorruptSnapshot("checksum mismatch")
    try:
        created_ms, nparts = _BODY_HEAD.unpack_from(body, 0)
        pos = _BODY_HEAD.size
        snap = Snapshot(created_ms)
        for _ in range(nparts):
            (tl,) = _U16.unpack_from(body, pos)
            pos += 2
            topic = bytes(body[pos : pos + tl]).decode()
            pos += tl
            nlags = -1  # not recorded
            if v2:
                partition, replay_from, covered_to, nrows, nwords = _PART_V2.unpack_from(body, pos)
                truncations = 0
                dropped = created_ms
                pos += _PART_V2.size
            elif v3:
                (partition, replay_from, covered_to, truncations, nrows, nwords) = (
                    _PART_V3.unpack_from(body, pos)
                )
                dropped = created_ms
                pos += _PART_V3.size
            elif v4:
                (partition, replay_from, covered_to, truncations, dropped, nrows, nwords) = (
                    _PART_V4.unpack_from(body, pos)
                )
                pos += _PART_V4.size
            else:
                (partition, replay_from, covered_to, truncations, dropped, nrows, nwords, nlags) = (
                    _PART.unpack_from(body, pos)
                )
                pos += _PART.size
            end_rows = pos + nrows * _ROW.size
            end_lags = end_rows + 8 * nwords + _LAG.size * max(nlags, 0)
            if end_lags > len(body):
                raise CorruptSnapshot("partition runs past the end of the file")
            heads = list(_ROW.iter_unpack(body[pos:end_rows]))
            flat = array("q")
            flat.frombytes(body[end_rows : end_rows + 8 * nwords])
            if _SWAP:
                flat.byteswap()
            durable = (
                None
                if nlags < 0
                else dict(_LAG.iter_unpack(body[end_rows + 8 * nwords : end_lags]))
            )
            pos = end_lags
            rows: list[Row] = []
            w = 0
            for pid, gen, hw, lu, nb in heads:
                rows.append((pid, gen, hw, lu, flat[w : w + 3 * nb]))
                w += 3 * nb
            if w != nwords:
                raise CorruptSnapshot(f"rows name {w} batch words, the file has {nwords}")
            snap.partitions[(topic, partition)] = PartitionImage(
                replay_from, covered_to, rows, truncations, dropped, durable
            )
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
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
        return sorted(
            (
                p
                for p in self.dir.iterdir()
                if p.name.endswith(SUFFIX) and p.name[: -len(SUFFIX)].isdigit()
            ),
            reverse=True,
        )

    def write(self, snap: Snapshot) -> tuple[Path, int]:
        """Write atomically; returns (path, bytes). Blocking: run it in an executor."""
        existing = self.files()
        seq = int(existing[0].name[: -len(SUFFIX)]) + 1 if existing else 1
        path = self.dir / f"{seq:020d}{SUFFIX}"
        data = encode(snap)
        write_atomically(path, data)
        for old in self.files()[self.kept :]:
            old.unlink(missing_ok=True)
        return path, len(data)

    def load_newest(self) -> tuple[Snapshot, Path] | None:
        for stale in self.dir.glob("*.tmp"):
            stale.unlink(missing_ok=True)  # a crash mid-write; never renamed, never valid
        for path in self.files():
            try:
                return decode(path.read_bytes()), path
            except (CorruptSnapshot, OSError) as exc:
                log.warning(
                    "snapshot %s is unusable (%s); trying an older one", path.name, describe(exc)
                )
        return None
