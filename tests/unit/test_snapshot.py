"""Snapshot files (format, checksum, atomic write, retention, fallback to an older valid
one) and partition recovery from a snapshot plus log replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from partition_server.flusher import Flusher
from partition_server.partition import Partition
from partition_server.snapshot import CorruptSnapshot, Snapshot, SnapshotStore, decode, encode
from pidlease import protocol as P


def sample() -> Snapshot:
    return Snapshot(123, {("orders", 0): (40, [(7, 3, 19, 1000, [(0, 9, 0), (10, 19, 20)]),
                                                (8, 0, -1, 1001, [])]),
                          ("a-b.c", 3): (0, [])})


def test_round_trip() -> None:
    s = sample()
    assert decode(encode(s)) == s


@pytest.mark.parametrize("damage", ["magic", "flip", "short", "long"])
def test_damaged_files_are_refused(damage: str) -> None:
    raw = bytearray(encode(sample()))
    if damage == "magic":
        raw[0] ^= 1
    elif damage == "flip":
        raw[-5] ^= 1
    elif damage == "short":
        raw = raw[:-3]
    else:
        raw += b"\0"
    with pytest.raises(CorruptSnapshot):
        decode(bytes(raw))


def test_store_keeps_the_last_two_and_falls_back_to_an_older_valid_one(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", kept=2)
    paths = []
    for i in range(4):
        s = sample()
        s.created_ms = i
        paths.append(store.write(s)[0])
    assert store.files() == [paths[3], paths[2]]
    (tmp_path / "snapshots" / "00000000000000000009.tmp").write_bytes(b"half")
    loaded = store.load_newest()
    assert loaded is not None and loaded[0].created_ms == 3
    raw = bytearray(paths[3].read_bytes())
    raw[30] ^= 0xFF
    paths[3].write_bytes(bytes(raw))
    loaded = store.load_newest()
    assert loaded is not None and (loaded[0].created_ms, loaded[1]) == (2, paths[2])
    assert not list((tmp_path / "snapshots").glob("*.tmp"))
    paths[2].write_bytes(b"junk")
    assert store.load_newest() is None


def _write_log(tmp_path: Path, batches: list[bytes]) -> int:
    from partition_server.log import PartitionLog
    lg, _ = PartitionLog.open(tmp_path / "t-0", 1 << 20)
    for b in batches:
        buf = bytearray(b)
        P.set_base_offset(buf, lg.next_offset)
        lg.append(buf, P.decode_batch_header(buf).count)
    end = lg.next_offset
    lg.close()
    return end


def _recover(tmp_path: Path, snap: tuple[int, list] | None) -> tuple[Partition, int]:  # type: ignore[type-arg]
    async def go() -> tuple[Partition, int]:
        fl = Flusher(mode="interval", interval_ms=1)
        part, _, replayed = Partition.recover(
            tmp_path, "t", 0, mode="strict", segment_bytes_max=1 << 20, batches_kept=5,
            pids_max=100, flusher=fl, clock_ms=lambda: 5, snapshot=snap)
        return part, replayed
    return asyncio.run(go())


def b(pid: int, gen: int, seq: int, n: int = 1) -> bytes:
    return P.encode_batch([(None, b"v")] * n, pid=pid, generation=gen, base_sequence=seq,
                          timestamp_ms=1)


def test_recovery_replays_only_after_the_snapshot_offset(tmp_path: Path) -> None:
    _write_log(tmp_path, [b(1, 0, 0, 2), b(1, 0, 2, 2), b(2, 0, 0)])
    # the snapshot says: offsets below 4 are covered, pid 1 at highwater 3
    snap = (4, [(1, 0, 3, 0, [(0, 1, 0), (2, 3, 2)])])
    part, replayed = _recover(tmp_path, snap)
    assert replayed == 1
    assert part.state.get(1).highwater == 3 and part.state.get(2).highwater == 0  # type: ignore[union-attr]
    part.close()


def test_log_shorter_than_snapshot_is_rebuilt_from_zero(tmp_path: Path) -> None:
    _write_log(tmp_path, [b(1, 0, 0, 2), b(3, 4, 0)])
    # a snapshot claiming more than the log holds (the log lost its tail)
    snap = (50, [(1, 0, 40, 0, []), (9, 0, 5, 0, [])])
    part, replayed = _recover(tmp_path, snap)
    assert replayed == 2
    assert part.state.get(9) is None
    e1, e3 = part.state.get(1), part.state.get(3)
    assert e1 is not None and e3 is not None
    assert (e1.highwater, e3.generation, e3.highwater) == (1, 4, 0)
    assert part.durable_end == 3
    part.close()
