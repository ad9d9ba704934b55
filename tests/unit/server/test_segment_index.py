"""Sparse offset and time indexes per segment (issue 13 item 5), on real files: the index
files round trip and refuse damage; a reopen loads the closed segments below the tail from
their indexes without reading them; a missing, damaged or stale index is rebuilt by a scan
and said so; and reads, lookups by time, cuts and retention agree with a brute-force model
that keeps every batch (a hypothesis differential), before and after a reopen."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from partition_server.log import OpenReport, PartitionLog, index_paths
from partition_server.log_manager import LogManager
from partition_server.registry import Assignment, Registry
from partition_server.segment_index import (
    IndexDamaged,
    SegmentIndex,
    decode_index,
    encode_index,
)
from partition_server.settings import ServerSettings
from pidlease.errors import CorruptRecord
from pidlease.wire import protocol as P
from pidlease.wire.cluster import TopicSpec


def mk(ts: int, n: int = 1, size: int = 100, tag: int = 0) -> bytes:
    return P.encode_batch(
        [(None, bytes([tag % 256]) * size) for _ in range(n)],
        pid=1,
        generation=0,
        base_sequence=tag,
        timestamp_ms=ts,
    )


def put(lg: PartitionLog, b: bytes) -> int:
    buf = bytearray(b)
    P.set_base_offset(buf, lg.next_offset)
    return lg.append(buf, P.decode_batch_header(buf).count, P.decode_batch_header(buf).timestamp_ms)


def offsets(chunks: list[bytes]) -> list[int]:
    return [h.base_offset for c in chunks for h, _ in P.iter_batches(c)]


def index_state(idx: SegmentIndex) -> tuple[object, ...]:
    return (
        list(idx.offsets),
        list(idx.positions),
        list(idx.time_max),
        list(idx.time_offsets),
        idx.max_timestamp_ms,
        idx.batches,
    )


# -- the files -----------------------------------------------------------------------------
def sample_index() -> SegmentIndex:
    idx = SegmentIndex()
    pos = 0
    for i, ts in enumerate([50, 10, 70, 70, 20, 90, 5, 95]):
        idx.add(1000 + 3 * i, pos, ts, interval_bytes=250)
        pos += 120
    return idx


def test_index_files_round_trip() -> None:
    idx = sample_index()
    assert list(idx.offsets) == [1000, 1009, 1018]  # a batch at least 250 bytes on
    # the newest timestamp below each entry: 70 below 1009, 90 below 1018
    assert (list(idx.time_max), list(idx.time_offsets)) == ([70, 90], [1009, 1018])
    offset_raw, time_raw = encode_index(idx, 1000, 960, 1024)
    desc, back = decode_index(offset_raw, time_raw)
    assert (desc.base_offset, desc.size, desc.end_offset) == (1000, 960, 1024)
    assert (desc.max_timestamp_ms, desc.batches) == (95, 8)
    assert index_state(back) == index_state(idx)


@pytest.mark.parametrize("which", [0, 1])
def test_any_damage_to_an_index_file_is_refused(which: int) -> None:
    raws = list(encode_index(sample_index(), 1000, 960, 1024))
    good = raws[which]
    for pos in range(len(good)):  # every byte: magic, header, entries, checksum
        raws[which] = good[:pos] + bytes([good[pos] ^ 0x01]) + good[pos + 1 :]
        with pytest.raises(IndexDamaged):
            decode_index(*raws)
    for cut in (0, 10, len(good) - 1):
        raws[which] = good[:cut]
        with pytest.raises(IndexDamaged):
            decode_index(*raws)


def test_the_two_files_must_describe_the_same_segment() -> None:
    a = encode_index(sample_index(), 1000, 960, 1024)
    b = encode_index(sample_index(), 1000, 961, 1024)
    with pytest.raises(IndexDamaged, match="disagree"):
        decode_index(a[0], b[1])


# -- open ----------------------------------------------------------------------------------
SEG = 1200  # bytes per segment: about 7 batches of mk()


def build(directory: Path, batches: int, interval: int = 300) -> PartitionLog:
    lg, _ = PartitionLog.open(directory, SEG, index_interval_bytes=interval)
    for i in range(batches):
        put(lg, mk(ts=(i * 37) % 100, n=1 + i % 3, tag=i))
    return lg


def reopen(directory: Path, tail_from: int, interval: int = 300) -> tuple[PartitionLog, OpenReport]:
    return PartitionLog.open(
        directory,
        SEG,
        verify_from_offset=tail_from,
        replay_from_offset=tail_from,
        index_interval_bytes=interval,
    )


def test_only_closed_segments_have_index_files(tmp_path: Path) -> None:
    lg = build(tmp_path / "t-0", 40)
    assert len(lg.segments) >= 5
    for seg in lg.segments[:-1]:
        assert all(p.exists() for p in index_paths(seg.path))
    assert not any(p.exists() for p in index_paths(lg.segments[-1].path))
    lg.close()


def test_a_reopen_reads_no_closed_segment_below_the_tail(tmp_path: Path) -> None:
    """The proof: a header in the middle of every closed segment is broken (a scan would
    truncate the log there) and every read of a segment file is counted; the open reads
    only the tail segment, reports the counts, and the rest still reads back."""
    d = tmp_path / "t-0"
    lg = build(d, 40)
    whole = offsets(lg.read(0, 1 << 20, lg.next_offset))
    closed = [(s.path, lg.batches(s)) for s in lg.segments[:-1]]
    tail, end = lg.segments[-1].base_offset, lg.next_offset
    lg.close()
    for path, batches in closed:  # the last batch's base offset field: zeros
        with open(path, "r+b") as f:
            f.seek(batches[-1][1])
            f.write(bytes(8))
    opened: list[str] = []
    real_open = open

    def spy(file: object, *args: object, **kw: object) -> object:
        opened.append(os.fspath(file))  # type: ignore[arg-type]  # paths only, here
        return real_open(file, *args, **kw)  # type: ignore[call-overload]  # as given

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("builtins.open", spy)
        lg2, report = reopen(d, tail)
    n = len(closed)
    assert (report.segments_from_index, report.segments_scanned) == (n, 1)
    assert (report.indexes_rebuilt, report.truncations, lg2.next_offset) == (0, [], end)
    assert report.batches == len(whole) and report.bytes == lg2.segments[-1].size
    assert [p for p in opened if p.endswith(".log")] == [str(lg2.segments[-1].path)]
    # what the damage does not touch reads back; the damaged batches are caught on read
    for _path, batches in closed:
        for off, _ in batches[:-1]:
            assert offsets(lg2.read(off, 1, end)) == [off]
        with pytest.raises(CorruptRecord):
            lg2.read(batches[-1][0], 1, end)
    assert offsets(lg2.read(tail, 1 << 20, end)) == [o for o in whole if o >= tail]
    lg2.close()
    # the same log opened with no snapshot (verify from 0) scans it all and finds the damage
    lg3, report = reopen(d, 0)
    assert report.segments_from_index == 0 and report.truncations
    assert lg3.next_offset == closed[0][1][-1][0]
    lg3.close()


def damage_missing(path: Path) -> None:
    path.unlink()


def damage_flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


def damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-9])


def damage_empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize(
    ("which", "damage", "says"),
    [
        (0, damage_missing, ".index is missing"),
        (1, damage_missing, ".timeindex is missing"),
        (0, damage_flip, ".index fails its checksum"),
        (1, damage_flip, ".timeindex fails its checksum"),
        (0, damage_truncate, ".index is "),
        (1, damage_empty, ".timeindex is 0 bytes"),
    ],
)
def test_a_damaged_or_missing_index_is_rebuilt_and_said_so(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    which: int,
    damage: object,
    says: str,
) -> None:
    d = tmp_path / "t-0"
    lg = build(d, 40)
    whole = offsets(lg.read(0, 1 << 20, lg.next_offset))
    victim = lg.segments[1]
    before = index_state(victim.index)
    tail, n = lg.segments[-1].base_offset, len(lg.segments) - 1
    lg.close()
    damage(index_paths(victim.path)[which])  # type: ignore[operator]  # a damage_* above
    with caplog.at_level(logging.WARNING, logger="partition_server.log"):
        lg2, report = reopen(d, tail)
    lines = [r.getMessage() for r in caplog.records if "rebuilt the index" in r.getMessage()]
    assert len(lines) == 1 and victim.path.name in lines[0] and says in lines[0], lines
    assert (report.indexes_rebuilt, report.segments_from_index) == (1, n - 1)
    assert report.segments_scanned == 2 and report.truncations == []
    assert index_state(lg2.segments[1].index) == before
    assert offsets(lg2.read(0, 1 << 20, lg2.next_offset)) == whole
    lg2.close()
    lg3, report = reopen(d, tail)  # rewritten: loaded next time
    assert (report.indexes_rebuilt, report.segments_from_index) == (0, n)
    lg3.close()


@pytest.mark.parametrize("field", ["size", "end", "base"])
def test_an_index_that_does_not_match_its_segment_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str
) -> None:
    """A sound index (checksum right) of other bytes: a crash kept the index of a
    segment whose unsynced tail it lost, or an index outlived a cut."""
    d = tmp_path / "t-0"
    lg = build(d, 40)
    whole = offsets(lg.read(0, 1 << 20, lg.next_offset))
    victim = lg.segments[2]
    end = lg.segments[3].base_offset
    base, size = victim.base_offset, victim.size
    raws = {
        "size": encode_index(victim.index, base, size + 7, end),
        "end": encode_index(victim.index, base, size, end + 1),
        "base": encode_index(victim.index, base - 1, size, end),
    }[field]
    tail = lg.segments[-1].base_offset
    lg.close()
    for path, raw in zip(index_paths(victim.path), raws, strict=True):
        path.write_bytes(raw)
    with caplog.at_level(logging.WARNING, logger="partition_server.log"):
        lg2, report = reopen(d, tail)
    assert report.indexes_rebuilt == 1 and report.truncations == []
    assert f"rebuilt the index of segment {victim.path.name}" in caplog.text
    # a wrong base puts the first entry outside the segment: caught before the size is
    assert ("entries lie outside" if field == "base" else "describes offsets") in caplog.text
    assert offsets(lg2.read(0, 1 << 20, lg2.next_offset)) == whole
    lg2.close()


def test_a_torn_closed_segment_with_a_stale_index_is_cut_and_becomes_active(
    tmp_path: Path,
) -> None:
    """A crash lost a closed segment's unsynced tail but kept its index: the size check
    sends it to a scan, the log ends there (as without indexes) and its index files go."""
    d = tmp_path / "t-0"
    lg = build(d, 40)
    victim = lg.segments[2]
    last_off, last_pos = lg.batches(victim)[-1]
    tail = lg.segments[-1].base_offset
    lg.close()
    os.truncate(victim.path, last_pos + 10)
    lg2, report = reopen(d, tail)
    assert lg2.next_offset == last_off and len(lg2.segments) == 3
    assert report.truncations and report.segments_from_index == 2
    assert not any(p.exists() for p in index_paths(victim.path))
    assert put(lg2, mk(1)) == last_off
    lg2.close()


def test_stray_index_files_are_swept_at_open(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    lg = build(d, 40)
    active = lg.segments[-1].path
    first_index = index_paths(lg.segments[0].path)[0]
    lg.close()
    strays = [
        index_paths(active)[0],  # the active segment's (a crash right after a roll's write)
        d / f"{10**9:020d}.timeindex",  # of no segment
        d / (first_index.name + ".tmp"),  # a write cut short
    ]
    for p in strays:
        p.write_bytes(b"x")
    lg2, _ = reopen(d, 0)
    assert not any(p.exists() for p in strays) and first_index.exists()
    lg2.close()


# -- cuts and retention --------------------------------------------------------------------
def test_a_cut_into_a_closed_segment_removes_its_index_and_a_reopen_agrees(
    tmp_path: Path,
) -> None:
    d = tmp_path / "t-0"
    lg = build(d, 40)
    victim = lg.segments[1]
    cut_at = lg.batches(victim)[2][0]
    expected = [o for o in offsets(lg.read(0, 1 << 20, lg.next_offset)) if o < cut_at]
    assert lg.truncate_to(cut_at) == cut_at
    assert len(lg.segments) == 2 and lg.next_offset == cut_at
    assert not any(p.exists() for p in index_paths(victim.path))  # active again
    assert sorted(p.name for p in d.glob("*index")) == [
        p.name for p in index_paths(lg.segments[0].path)
    ]
    assert offsets(lg.read(0, 1 << 20, lg.next_offset)) == expected
    for i in range(20):  # grows and rolls again: a new index for the rewritten bytes
        put(lg, mk(ts=200 + i, tag=100 + i))
    assert all(p.exists() for p in index_paths(victim.path))
    whole = offsets(lg.read(0, 1 << 20, lg.next_offset))
    states = [index_state(s.index) for s in lg.segments]
    tail = lg.segments[-1].base_offset
    lg.close()
    lg2, report = reopen(d, tail)
    assert report.segments_from_index == len(states) - 1 and report.indexes_rebuilt == 0
    assert [index_state(s.index) for s in lg2.segments] == states
    assert offsets(lg2.read(0, 1 << 20, lg2.next_offset)) == whole
    assert lg2.offset_for_timestamp(200, lg2.next_offset) == cut_at
    lg2.close()


def test_retention_and_restart_remove_index_files(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    lg = build(d, 40)
    gone = lg.segments[:2]
    start = lg.segments[2].base_offset
    lg.persist_log_start(start)
    assert lg.delete_below(start)[0] == 2
    assert not any(p.exists() for s in gone for p in index_paths(s.path))
    tail, end = lg.segments[-1].base_offset, lg.next_offset
    kept = offsets(lg.read(start, 1 << 20, end))
    lg.close()
    lg2, report = reopen(d, tail)
    assert lg2.log_start_offset == start and report.indexes_rebuilt == 0
    assert offsets(lg2.read(start, 1 << 20, end)) == kept
    lg2.restart_at(end + 100)
    assert list(d.glob("*index")) == []
    lg2.close()


# -- the differential ----------------------------------------------------------------------
@dataclass
class Batch:
    offset: int
    count: int
    size: int
    ts: int


class Model:
    """Every batch, in order: the brute-force answers."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []

    def holding(self, offset: int) -> int:
        return max(i for i, b in enumerate(self.batches) if b.offset <= offset)

    def read(self, offset: int, max_bytes: int, end: int) -> list[int]:
        out: list[int] = []
        total = 0
        for b in self.batches[self.holding(offset) :]:
            if b.offset >= end or (total > 0 and total + b.size > max_bytes):
                break
            out.append(b.offset)
            total += b.size
        return out

    def for_time(self, ts: int, end: int) -> int:
        return next((b.offset for b in self.batches if b.offset < end and b.ts >= ts), end)


batch_st = st.tuples(st.integers(1, 4), st.integers(0, 300), st.integers(-1, 120))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.lists(batch_st, min_size=3, max_size=40),
    second=st.lists(batch_st, max_size=15),
    segment_bytes=st.integers(300, 3000),
    interval=st.integers(1, 1500),
    cut=st.floats(0, 1),
    delete=st.floats(0, 1),
    tail=st.floats(0.25, 1.2),  # mostly some segments from their index, sometimes all
    reopen_interval=st.integers(1, 1500),
    probes=st.lists(
        st.tuples(st.floats(0, 1), st.integers(1, 3000), st.floats(0, 1.1)), max_size=8
    ),
    times=st.lists(st.integers(-2, 125), max_size=8),
)
def test_reads_and_lookups_agree_with_a_brute_force_model(
    first: list[tuple[int, int, int]],
    second: list[tuple[int, int, int]],
    segment_bytes: int,
    interval: int,
    cut: float,
    delete: float,
    tail: float,
    reopen_interval: int,
    probes: list[tuple[float, int, float]],
    times: list[int],
) -> None:
    """Appends, a cut (as a follower's), more appends, a deletion from the old end (as
    retention's), then a reopen that loads some segments from their indexes and scans
    the rest (with another interval): at every stage ``read``, ``offset_for_timestamp``,
    ``cut_point`` and ``iter_headers`` answer as a scan of every batch would."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "t-0"
        lg, _ = PartitionLog.open(d, segment_bytes, index_interval_bytes=interval)
        model = Model()

        def append(batches: list[tuple[int, int, int]]) -> None:
            for n, size, ts in batches:
                raw = mk(ts, n=n, size=size, tag=len(model.batches))
                model.batches.append(Batch(put(lg, raw), n, len(raw), ts))

        def check(lg: PartitionLog) -> None:
            start, end = lg.log_start_offset, lg.next_offset
            assert [b.offset for b in model.batches] == [h.base_offset for h in lg.iter_headers()]
            assert sum(s.index.batches for s in lg.segments) == len(model.batches)
            for at, max_bytes, upto in probes:
                offset = start + int(at * (end - start))
                stop = start + int(upto * (end - start))
                if offset < end:
                    assert lg.cut_point(offset) == model.batches[model.holding(offset)].offset
                    want = model.read(offset, max_bytes, stop) if offset < stop else []
                    assert offsets(lg.read(offset, max_bytes, stop)) == want
            for ts in times:
                for stop in (end, start + (end - start) // 2):
                    assert lg.offset_for_timestamp(ts, stop) == model.for_time(ts, stop), ts

        append(first)
        check(lg)
        cut_at = int(cut * lg.next_offset)
        if cut_at > 0:
            closed = cut_at < lg.segments[-1].base_offset
            event("cut into a closed segment" if closed else "cut in the active segment")
            lg.truncate_to(cut_at)
            model.batches = [b for b in model.batches if b.offset < lg.next_offset]
            check(lg)
        append(second)
        bases = [s.base_offset for s in lg.segments]
        start = bases[int(delete * (len(bases) - 1))]
        if start > 0:
            lg.persist_log_start(start)
            lg.delete_below(start)
            model.batches = [b for b in model.batches if b.offset >= start]
        if model.batches:
            check(lg)
        states = [index_state(s.index) for s in lg.segments]
        tail_from = int(tail * lg.next_offset)
        lg.close()
        lg, report = PartitionLog.open(
            d,
            segment_bytes,
            verify_from_offset=tail_from,
            replay_from_offset=tail_from,
            index_interval_bytes=reopen_interval,
        )
        assert report.truncations == [] and report.indexes_rebuilt == 0
        n = report.segments_from_index
        event(f"reopen: {n if n < 3 else '3 or more'} segments from their index")
        if reopen_interval == interval:  # a scan builds the index appends built
            assert [index_state(s.index) for s in lg.segments] == states
        if model.batches:
            check(lg)
        lg.close()


# -- the server ----------------------------------------------------------------------------
def test_the_server_setting_reaches_the_log_and_recovery_reports_the_counts(
    tmp_path: Path,
) -> None:
    """``PIDLEASE_INDEX_INTERVAL_BYTES`` spaces the entries of every log the log manager opens,
    and the log manager's recovery figures (metadata, startup line) count the segments loaded
    from their index, scanned, and the indexes rebuilt."""
    lg = build(tmp_path / "t-0", 40)
    n = len(lg.segments) - 1
    index_paths(lg.segments[0].path)[1].unlink()
    lg.close()

    async def go() -> None:
        s = ServerSettings(data_dir=str(tmp_path), server_id=1, index_interval_bytes=1)
        log_manager = LogManager(s, Registry("unused:2181", 1))
        rec = log_manager.recover(Assignment(topics={"t": TopicSpec("t", 1)}))
        # no snapshot: recovery replays from 0, so every segment is scanned
        assert (rec["segments_scanned"], rec["segments_from_index"]) == (n + 1, 0)
        assert rec["indexes_rebuilt"] == 1
        part = log_manager.partitions[("t", 0)]
        active = part.log.segments[-1]
        assert part.log.index_interval_bytes == 1
        assert len(active.index.offsets) == active.index.batches  # an entry every batch
        part.close()

    asyncio.run(go())
