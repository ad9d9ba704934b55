"""The partition log on real files: append/read, segments, index rebuild, torn and corrupt
tails truncated at open (and reported), checksums verified on read, failed writes cut back."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from partition_server.log import PartitionLog
from pidlease.errors import CorruptRecord, ServerUnavailable
from pidlease.wire import protocol as P


def mk(seq: int, n: int = 2, pid: int = 1, size: int = 10) -> bytes:
    return P.encode_batch(
        [(None, bytes([seq % 256]) * size) for _ in range(n)],
        pid=pid,
        generation=0,
        base_sequence=seq,
        timestamp_ms=1,
    )


def put(lg: PartitionLog, b: bytes) -> int:
    buf = bytearray(b)
    P.set_base_offset(buf, lg.next_offset)
    return lg.append(buf, P.decode_batch_header(buf).count)


def offsets(chunks: list[bytes]) -> list[int]:
    return [h.base_offset for c in chunks for h, _ in P.iter_batches(c)]


def fill(tmp_path: Path, batches: int, seg_max: int = 1 << 20) -> PartitionLog:
    lg, _ = PartitionLog.open(tmp_path / "t-0", seg_max)
    for i in range(batches):
        put(lg, mk(i * 2))
    return lg


def test_append_and_read_back(tmp_path: Path) -> None:
    lg = fill(tmp_path, 10)
    assert lg.next_offset == 20
    assert offsets(lg.read(0, 1 << 20, 20)) == list(range(0, 20, 2))
    # an offset inside a batch returns that batch
    assert offsets(lg.read(5, 1 << 20, 20))[0] == 4
    # never past the end offset (the high watermark)
    assert offsets(lg.read(0, 1 << 20, 7)) == [0, 2, 4, 6]
    assert lg.read(20, 1 << 20, 20) == []
    # max_bytes: at least one whole batch, then only whole batches that fit
    size = len(mk(0))
    assert offsets(lg.read(0, 1, 20)) == [0]
    assert offsets(lg.read(0, size * 3 + 1, 20)) == [0, 2, 4]
    lg.close()


def test_segments_roll_and_reopen_rebuilds_the_index(tmp_path: Path) -> None:
    size = len(mk(0))
    lg = fill(tmp_path, 30, seg_max=size * 4)
    assert len(lg.segments) == 8
    names = sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))
    assert names[1] == f"{8:020d}.log"
    whole = offsets(lg.read(0, 1 << 20, lg.next_offset))
    lg.close()
    lg2, report = PartitionLog.open(tmp_path / "t-0", size * 4)
    assert (report.batches, report.truncations, lg2.next_offset) == (30, [], 60)
    assert offsets(lg2.read(0, 1 << 20, 60)) == whole == list(range(0, 60, 2))
    assert offsets(lg2.read(33, size * 2, 60)) == [32, 34]
    assert put(lg2, mk(60)) == 60
    lg2.close()


@pytest.mark.parametrize("tail", ["half header", "half batch", "bad checksum", "wrong offset"])
def test_torn_tail_is_truncated_and_reported(
    tmp_path: Path, tail: str, caplog: pytest.LogCaptureFixture
) -> None:
    lg = fill(tmp_path, 5)
    seg = lg.segments[-1].path
    good = seg.stat().st_size
    lg.close()
    b = bytearray(mk(10))
    P.set_base_offset(b, 10)
    if tail == "half header":
        b = b[:20]
    elif tail == "half batch":
        b = b[: len(b) - 7]
    elif tail == "bad checksum":
        b[-1] ^= 0xFF
    else:
        P.set_base_offset(b, 99)
    with open(seg, "ab") as f:
        f.write(b)
    with caplog.at_level(logging.WARNING, logger="partition_server.log"):
        lg2, report = PartitionLog.open(tmp_path / "t-0", 1 << 20)
    assert seg.stat().st_size == good
    assert len(report.truncations) == 1
    t = report.truncations[0]
    assert (t.bytes, t.offset, t.segment) == (len(b), 10, seg.name)
    assert f"truncated {len(b)} bytes at offset 10 of segment {seg.name}" in caplog.text
    assert lg2.next_offset == 10 and put(lg2, mk(10)) == 10
    lg2.close()


def test_corrupt_batch_before_the_verified_range_is_caught_on_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lg = fill(tmp_path, 5)
    seg, pos = lg.segments[0].path, lg.batches(lg.segments[0])[2][1]
    lg.close()
    with open(seg, "r+b") as f:  # flip a value byte of the batch at offset 4
        f.seek(pos + P.BATCH_HEADER_SIZE + 9)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))
    lg2, report = PartitionLog.open(tmp_path / "t-0", 1 << 20, verify_from_offset=8)
    assert report.truncations == []  # headers fine, checksum not checked below 8
    assert offsets(lg2.read(0, 2 * len(mk(0)), 10)) == [0, 2]
    with caplog.at_level(logging.ERROR), pytest.raises(CorruptRecord):
        lg2.read(4, 1 << 20, 10)
    assert "corrupt batch at offset 4" in caplog.text
    assert offsets(lg2.read(6, 1 << 20, 10)) == [6, 8]
    lg2.close()
    # when the corrupt batch is in the range recovery verifies, it and the rest go
    lg3, report = PartitionLog.open(tmp_path / "t-0", 1 << 20, verify_from_offset=0)
    assert lg3.next_offset == 4 and report.truncations[0].reason == "batch checksum mismatch"
    lg3.close()


def test_corruption_in_an_old_segment_drops_later_segments(tmp_path: Path) -> None:
    size = len(mk(0))
    lg = fill(tmp_path, 6, seg_max=size * 2)
    first = lg.segments[0].path
    lg.close()
    with open(first, "r+b") as f:
        f.seek(size + 30)
        f.write(b"\xff\xff")
    lg2, report = PartitionLog.open(tmp_path / "t-0", size * 2)
    assert lg2.next_offset == 2
    assert len(list((tmp_path / "t-0").glob("*.log"))) == 1
    assert sum(t.bytes for t in report.truncations) == size * 5
    lg2.close()


def test_failed_write_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = fill(tmp_path, 2)
    before = lg.segments[-1].path.stat().st_size
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(ServerUnavailable):
        put(lg, mk(4))
    monkeypatch.undo()
    assert lg.segments[-1].path.stat().st_size == before and lg.next_offset == 4
    assert put(lg, mk(4)) == 4
    assert offsets(lg.read(0, 1 << 20, 6)) == [0, 2, 4]
    lg.close()


def test_take_dirty_lists_written_segments_and_the_directory_after_a_roll(tmp_path: Path) -> None:
    size = len(mk(0))
    lg, _ = PartitionLog.open(tmp_path / "t-0", size)
    lg.take_dirty()
    put(lg, mk(0))
    assert lg.take_dirty() == [lg.segments[0].fd]
    assert lg.take_dirty() == []
    put(lg, mk(2))  # rolls
    dirty = lg.take_dirty()
    assert lg.segments[1].fd in dirty and len(dirty) == 2
    lg.close()


def test_an_open_log_holds_one_descriptor_per_segment_and_none_for_its_directory(
    tmp_path: Path,
) -> None:
    """Issue 24: each log held its directory open (to fsync it after a roll), half a
    server's descriptors at 10,000 partitions (EMFILE at 4,950 partitions with a limit of
    20,000). The directory is opened for each of its fsyncs; the one handed to a flush is
    closed at the next ``take_dirty``, as a cut segment's fd is."""

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    logs = [PartitionLog.open(tmp_path / f"t-{p}", len(mk(0)))[0] for p in range(20)]
    assert open_fds() - before == 20  # the active segment of each, nothing else
    lg = logs[0]
    put(lg, mk(0))
    lg.take_dirty()
    put(lg, mk(2))  # rolls: the directory must be fsynced with the new segment
    dirty = lg.take_dirty()
    assert len(dirty) == 2 and lg.segments[1].fd in dirty
    dir_fd = next(fd for fd in dirty if fd != lg.segments[1].fd)
    os.fsync(dir_fd)  # what the flusher does with it: a valid descriptor of the directory
    assert os.path.samefile(f"/proc/self/fd/{dir_fd}", lg.dir)
    assert open_fds() - before == 20 + 2  # a second segment, and the directory until...
    lg.take_dirty()  # ...the next take_dirty closes it
    assert open_fds() - before == 20 + 1
    for each in logs:
        each.close()
    assert open_fds() == before


def test_a_log_written_once_holds_no_directory_descriptor_once_its_flush_ended(
    tmp_path: Path,
) -> None:
    """Issue 24, session 25: the directory handed to a flush was closed only at the log's
    next ``take_dirty``; a partition written once (a record to each of 10,000) kept it open
    for good, 10,000 segments and 10,000 directories reached the server's limit of 20,000
    (EMFILE), the flusher stopped and those partitions never acked again. It is closed when
    the flush that held it ends (``release_retired``, from ``Partition.flush_done``).
    Without the release (the old behaviour, closed at the next take_dirty only): 60
    descriptors held by these 20 logs, not 40."""

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    logs = [PartitionLog.open(tmp_path / f"t-{p}", len(mk(0)))[0] for p in range(20)]
    for lg in logs:
        put(lg, mk(0))
        put(lg, mk(2))  # rolls: its directory goes to the next flush
        for fd in lg.take_dirty():
            os.fsync(fd)  # the flush
        lg.release_retired()  # ...has ended
    assert open_fds() - before == 20 * 2  # two segments each, no directory
    for lg in logs:
        lg.close()
    assert open_fds() == before


def test_offset_for_timestamp_is_the_first_batch_at_or_after_the_time(tmp_path: Path) -> None:
    """Kafka's ListOffsets by time: the first batch in log order whose timestamp is at or
    after T (timestamps need not grow), never at or past the end offset (the high
    watermark); the end offset when no batch qualifies. Checked against a scan of every
    batch, across segment boundaries."""
    lg, _ = PartitionLog.open(tmp_path / "t-0", 300)
    stamps = [10, 20, 15, 40, 30, 30, 50, 5, 60, 45, 70, 65]
    for i, ts in enumerate(stamps):
        buf = bytearray(
            P.encode_batch(
                [(None, b"x" * 40)], pid=1, generation=0, base_sequence=i, timestamp_ms=ts
            )
        )
        P.set_base_offset(buf, lg.next_offset)
        lg.append(buf, 1, ts)
    assert len(lg.segments) > 3
    for end in (0, 3, 7, 12):
        for t in range(0, 80, 5):
            want = next((o for o in range(end) if stamps[o] >= t), end)
            assert lg.offset_for_timestamp(t, end) == want, (t, end)
    lg.close()


def test_a_log_cut_back_to_its_start_is_empty_and_still_answers(tmp_path: Path) -> None:
    """Retention moved the log start to 4, then a cut at 4 (a follower's divergence)
    empties the log: reading headers from 0 (a producer-state rebuild), a cut point or a
    second cut below the start find nothing to return, and raise nothing (found by the
    simulation, seed 172 --retention, as a server that could not start)."""
    size = len(mk(0))
    lg = fill(tmp_path, 4, seg_max=size * 2)
    lg.persist_log_start(4)
    assert lg.delete_below(4) == (1, size * 2)
    assert lg.truncate_to(4) == 4 and (lg.log_start_offset, lg.next_offset) == (4, 4)
    assert list(lg.iter_headers(0)) == []
    assert lg.cut_point(0) == 4 and lg.truncate_to(0) == 4
    lg.close()
    lg2, report = PartitionLog.open(tmp_path / "t-0", size * 2)
    assert (lg2.log_start_offset, lg2.next_offset, report.truncations) == (4, 4, [])
    assert list(lg2.iter_headers(0)) == [] and put(lg2, mk(8)) == 4
    lg2.close()
