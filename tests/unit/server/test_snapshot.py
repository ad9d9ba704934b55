"""Snapshot files (format, checksum, atomic write, retention, fallback to an older valid
one) and partition recovery from a snapshot plus log replay."""

from __future__ import annotations

import asyncio
import struct
import zlib
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.flusher import Flusher
from partition_server.partition import Partition, replay_batch
from partition_server.producer_state import ProducerStateTable
from partition_server.snapshot import (
    MAGIC_V3,
    CorruptSnapshot,
    PartitionImage,
    Snapshot,
    SnapshotStore,
    decode,
    encode,
)
from partition_server.testing import open_part
from pidlease.wire import protocol as P
from tests.helpers import ManualClock


def rows(*r: tuple) -> list:  # type: ignore[type-arg]
    return [(pid, gen, hw, lu, array("q", flat)) for pid, gen, hw, lu, flat in r]


def sample() -> Snapshot:
    return Snapshot(
        123,
        {
            ("orders", 0): PartitionImage(
                38,
                40,
                rows(
                    (7, 3, 19, 1000, [0, 9, 0, 10, 19, 20]),
                    (8, 0, -1, 1001, []),
                    (2**63 - 1, 2**31 - 1, 2**62, 2**62, [-1, -1, 5]),
                ),
            ),
            ("a-b.c", 3): PartitionImage(0, 0, []),
        },
    )


def test_round_trip() -> None:
    s = sample()
    assert decode(encode(s)) == s


def test_durable_highwaters_round_trip_and_files_before_them_read_as_unknown() -> None:
    """PLSNAP05 records the durable highwater of the rows whose batches were above the high
    watermark (issue 23 item 4); a PLSNAP04 file is still read, with it unknown (None)."""
    import struct
    import zlib

    from partition_server import snapshot as S

    s = sample()
    s.partitions[("orders", 0)].durable = {7: 9, 2**63 - 1: -1}
    back = decode(encode(s))
    assert back == s
    img = back.partitions[("orders", 0)]
    assert img.durable_highwater(7, 19) == 9
    assert img.durable_highwater(8, -1) == -1  # not lagging: its highwater
    # The same image as a PLSNAP04 file wrote it: no lag count, no pairs.
    img4 = s.partitions[("orders", 0)]
    flat = array("q")
    for r in img4.rows:
        flat.extend(r[4])
    if S._SWAP:
        flat.byteswap()
    t = b"orders"
    body = struct.pack(">qI", s.created_ms, 1) + struct.pack(">H", len(t)) + t
    body += struct.pack(
        ">IqqqqII", 0, img4.replay_from, img4.covered_to, 4, 99, len(img4.rows), len(flat)
    )
    body += b"".join(S._ROW.pack(p, g, h, lu, len(f) // 3) for p, g, h, lu, f in img4.rows)
    body += flat.tobytes()
    old = decode(b"PLSNAP04" + struct.pack(">IQ", zlib.crc32(body), len(body)) + body)
    got = old.partitions[("orders", 0)]
    assert (got.rows, got.truncations, got.dropped_last_use_max_ms) == (img4.rows, 4, 99)
    assert got.durable is None and got.durable_highwater(7, 19) is None


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


def _recover(tmp_path: Path, snap: PartitionImage | None) -> tuple[Partition, int]:
    async def go() -> tuple[Partition, int]:
        fl = Flusher(mode="interval", interval_ms=1)
        part, _, replayed = Partition.recover(
            tmp_path,
            "t",
            0,
            mode="strict",
            segment_bytes_max=1 << 20,
            batches_kept=5,
            pids_max=100,
            flusher=fl,
            clock_ms=lambda: 5,
            snapshot=snap,
        )
        return part, replayed

    return asyncio.run(go())


def b(pid: int, gen: int, seq: int, n: int = 1) -> bytes:
    return P.encode_batch(
        [(None, b"v")] * n, pid=pid, generation=gen, base_sequence=seq, timestamp_ms=1
    )


def test_recovery_replays_only_after_the_snapshot_offset(tmp_path: Path) -> None:
    _write_log(tmp_path, [b(1, 0, 0, 2), b(1, 0, 2, 2), b(2, 0, 0)])
    # the snapshot says: offsets below 4 are covered, pid 1 at highwater 3
    snap = PartitionImage(4, 4, rows((1, 0, 3, 0, [0, 1, 0, 2, 3, 2])))
    part, replayed = _recover(tmp_path, snap)
    assert replayed == 1
    assert part.state.get(1).highwater == 3 and part.state.get(2).highwater == 0  # type: ignore[union-attr]
    part.close()


def test_log_shorter_than_snapshot_is_rebuilt_from_zero(tmp_path: Path) -> None:
    _write_log(tmp_path, [b(1, 0, 0, 2), b(3, 4, 0)])
    # a snapshot claiming more than the log holds (the log lost its tail)
    snap = PartitionImage(45, 50, rows((1, 0, 40, 0, []), (9, 0, 5, 0, [])))
    part, replayed = _recover(tmp_path, snap)
    assert replayed == 2
    assert part.state.get(9) is None
    e1, e3 = part.state.get(1), part.state.get(3)
    assert e1 is not None and e3 is not None
    assert (e1.highwater, e3.generation, e3.highwater) == (1, 4, 0)
    assert part.high_watermark == 3
    part.close()


def test_log_between_replay_from_and_covered_to_is_also_rebuilt(tmp_path: Path) -> None:
    _write_log(tmp_path, [b(1, 0, 0, 2), b(3, 4, 0)])  # ends at 3
    snap = PartitionImage(
        2, 4, rows((1, 0, 1, 0, [0, 1, 0]), (3, 4, 0, 0, [0, 0, 2]), (9, 0, 0, 0, [0, 0, 3]))
    )
    part, replayed = _recover(tmp_path, snap)
    assert replayed == 2 and part.state.get(9) is None
    part.close()


# -- a snapshot captured in chunks while appends go on ------------------------------------
# Appends of a few producers, a capture that starts at some point, exports the PIDs known
# then in chunks with more appends in between, and ends; recovery from that image (rows +
# idempotent replay from replay_from) must equal a replay of the whole log.


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(1, 3), st.booleans()), max_size=40),
    st.integers(0, 40),
    st.lists(st.integers(0, 40), max_size=4),
    st.integers(1, 3),
)
def test_fuzzy_capture_then_replay_equals_full_replay(sends, start, cuts, chunk) -> None:  # type: ignore[no-untyped-def]
    live = ProducerStateTable(batches_kept=2)
    headers: list[P.BatchHeader] = []
    nexts: dict[int, int] = {}
    gens: dict[int, int] = {}
    img: PartitionImage | None = None
    pending: list[int] = []
    rows_out: list = []  # type: ignore[type-arg]
    replay_from = 0

    def end() -> int:
        return headers[-1].base_offset + headers[-1].count if headers else 0

    for i, (pid, count, fence) in enumerate([*sends, (0, 0, False)]):
        if i == start:  # the capture begins: remember the PIDs known now
            replay_from, pending = end(), live.pids()
        if i > start and pending and (i in cuts or i == len(sends)):
            take, pending = pending[:chunk], pending[chunk:]
            rows_out.extend(live.export_rows(take))
        if i == len(sends):
            break
        if fence:
            gens[pid] = gens.get(pid, 0) + 1
            h = P.BatchHeader(end(), 0, 0, P.FLAG_CONTROL, pid, gens[pid], -1, 1, 0)
        else:
            seq = nexts.get(pid, 0)
            h = P.BatchHeader(end(), 0, 0, 0, pid, gens.get(pid, 0), seq, count, 0)
            nexts[pid] = seq + count
        headers.append(h)
        replay_batch(live, h, 0)
    if start <= len(sends):
        rows_out.extend(live.export_rows(pending))  # the capture's last chunk
        img = PartitionImage(replay_from, end(), rows_out)
    else:
        img = PartitionImage(end(), end(), live.export_rows())
    recovered = ProducerStateTable(batches_kept=2)
    recovered.load_rows(img.rows)
    for h in headers:
        if h.base_offset >= img.replay_from:
            replay_batch(recovered, h, 0)
    full = ProducerStateTable(batches_kept=2)
    for h in headers:
        replay_batch(full, h, 0)
    assert sorted(recovered.export_rows()) == sorted(full.export_rows())


def test_horizon_survives_a_snapshot_and_older_files_read_their_creation_time(
    tmp_path: Path,
) -> None:
    """docs/reliability.md finding 6 (review 6): a partition remembers the newest last use of
    any PID it dropped, and a takeover's FENCE creates a fresh entry only for a PID leased
    after it."""

    snap = Snapshot(77_000, {("t", 0): PartitionImage(0, 0, [], 0, 42_000)})
    assert decode(encode(snap)) == snap
    # The PLSNAP03 layout: no horizon field; read as the file's created_ms.
    raw = encode(Snapshot(77_000, {("t", 0): PartitionImage(0, 0, [], 0, 0)}))
    body = bytearray(raw[20:])
    head = 8 + 4 + 2 + 1 + 4 + 8 + 8 + 8  # created, count, topic, partition .. truncations
    del body[head : head + 8]
    del body[head + 8 : head + 12]  # and PLSNAP05's count of durable highwaters (rows, words)
    old = MAGIC_V3 + struct.pack(">IQ", zlib.crc32(body), len(body)) + bytes(body)
    assert decode(old).partitions[("t", 0)].dropped_last_use_max_ms == 77_000
    # Recovery takes it from the snapshot, even when the rows are not trusted (a cut).
    part = open_part(
        tmp_path,
        hw=None,
        clock_ms=ManualClock(),
        snapshot=PartitionImage(0, 0, [], truncations=5, dropped_last_use_max_ms=42_000),
    )
    assert part.state.dropped_last_use_max_ms == 42_000
    part.close()
