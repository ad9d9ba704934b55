"""``Reader`` (pidlease/client/reader.py) against the fake partition server."""

from __future__ import annotations

import pytest

from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.wire import protocol as p

TOPICS = {"r": (2, "strict")}


# -- a start by time, or the log's start or end (issue 13 item 4)
def test_reader_start_arguments_are_checked() -> None:
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    Reader's start_timestamp_ms / start are resolved through LIST_OFFSETS."""

    for bad in (-1, -2, 1.5, "0", True):
        with pytest.raises(errors.ConfigError, match="start_timestamp_ms"):
            Reader("http://c", "t", start_timestamp_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match="not both"):
        Reader("http://c", "t", 0, 5, start_timestamp_ms=10)
    with pytest.raises(errors.ConfigError, match="not both"):
        Reader("http://c", "t", start="latest", start_timestamp_ms=10)
    with pytest.raises(errors.ConfigError, match="only one"):
        Reader("http://c", "t", 0, 5, start="latest", start_timestamp_ms=10)
    Reader("http://c", "t", start_timestamp_ms=0)  # the epoch is a time like any other


def _store(srv, topic: str, stamps: list[int], per_batch: int = 5) -> None:  # type: ignore[no-untyped-def]
    """Batches of ``per_batch`` records stamped with ``stamps``, straight into the fake's
    log (a Producer stamps batches with its own clock)."""
    with srv.lock:
        part = srv.parts[(topic, 0)]
        for i, ts in enumerate(stamps):
            recs = [(None, b"v%d" % (i * per_batch + j)) for j in range(per_batch)]
            b = bytearray(
                p.encode_batch(
                    recs, pid=9, generation=0, base_sequence=i * per_batch, timestamp_ms=ts
                )
            )
            p.set_base_offset(b, part.next_offset)
            part.batches.append(bytes(b))
            part.next_offset += per_batch


def test_reader_starts_at_the_first_batch_at_or_after_the_time(fake) -> None:  # type: ignore[no-untyped-def]
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    Reader's start_timestamp_ms / start are resolved through LIST_OFFSETS."""

    srv, coord = fake
    _store(srv, "r", [1_000, 3_000, 2_000, 4_000])  # offsets 0, 5, 10, 15

    def first(ts: int) -> tuple[int | None, int]:
        rd = Reader("http://fake", "r", 0, start_timestamp_ms=ts, http_transport=coord.transport())
        offs = [r.offset for r in rd]
        assert offs == list(range(offs[0], 20)) if offs else True  # then on in order
        return (offs[0] if offs else None), rd.position

    assert first(0) == (0, 20)
    assert first(1_000) == (0, 20)
    assert first(1_001) == (5, 20)  # 3_000 at offset 5 comes before 2_000 at offset 10
    assert first(3_001) == (15, 20)
    assert first(4_001) == (None, 20)  # nothing that new: the end, waiting for records
    srv.delete_below("r", 0, 10)
    assert first(0) == (10, 20)  # a time before the log start: the log start
    with Producer("http://fake", topic="r", http_transport=coord.transport()) as pr:
        pr.send(b"new", partition=0).result()
    rd = Reader("http://fake", "r", 0, start_timestamp_ms=10**13, http_transport=coord.transport())
    assert list(rd) == [] and rd.position == 21  # the end again, however far the time


def test_reader_earliest_and_latest_go_through_list_offsets(fake) -> None:  # type: ignore[no-untyped-def]
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    Reader's start_timestamp_ms / start are resolved through LIST_OFFSETS."""

    srv, coord = fake
    _store(srv, "r", [1, 2, 3])
    srv.delete_below("r", 0, 5)
    asked: list[int] = []
    orig = srv._list_offsets

    def spy(req: p.Request) -> bytes:
        asked.append(req.timestamp_ms)
        return orig(req)

    srv._list_offsets = spy  # type: ignore[method-assign]
    early = Reader("http://fake", "r", 0, start="earliest", http_transport=coord.transport())
    assert [r.offset for r in early][:1] == [5]
    late = Reader("http://fake", "r", 0, start="latest", http_transport=coord.transport())
    assert list(late) == [] and late.position == 15
    assert asked == [p.EARLIEST_TIMESTAMP, p.LATEST_TIMESTAMP]


@pytest.mark.parametrize(
    ("start", "query"),
    [({"start": "earliest"}, p.EARLIEST_TIMESTAMP), ({"start_timestamp_ms": 2}, 2)],
)
def test_a_start_deleted_before_the_first_fetch_is_asked_again(fake, start, query) -> None:  # type: ignore[no-untyped-def]
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    Reader's start_timestamp_ms / start are resolved through LIST_OFFSETS."""

    srv, coord = fake
    _store(srv, "r", [1, 2, 3, 4])  # offsets 0, 5, 10, 15
    asked: list[int] = []
    orig = srv._list_offsets

    def racing(req: p.Request) -> bytes:
        out = orig(req)
        asked.append(req.timestamp_ms)
        if len(asked) == 1:  # retention runs between this answer and the first fetch
            part = srv.parts[("r", 0)]  # (the fake holds its lock while it answers)
            part.batches = part.batches[2:]
            part.log_start_offset = 10
        return out

    srv._list_offsets = racing  # type: ignore[method-assign]
    rd = Reader("http://fake", "r", 0, http_transport=coord.transport(), **start)
    assert [r.offset for r in rd] == list(range(10, 20))
    assert asked == [query, query]
