"""LIST_OFFSETS (issue 13, item 4): a reader's start by time, or the log's start or end.
The request and answer on the wire (round trip, malformed frames refused with
CORRUPT_RECORD, the older APIs' bytes untouched), the partition's rule (the first committed
batch at or after the time, the high watermark when none), and the SDK ``Reader``'s
``start_timestamp_ms`` / ``start`` resolved through it (against the fake server)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.partition import Partition
from partition_server.testing import open_part
from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.errors import CorruptRecord
from pidlease.wire import protocol as p

TOPICS = {"r": (2, "strict")}


# -- the wire ------------------------------------------------------------------------------
@pytest.mark.parametrize("ts", [0, 1_700_000_000_123, p.LATEST_TIMESTAMP, p.EARLIEST_TIMESTAMP])
def test_request_round_trips(ts: int) -> None:
    raw = p.list_offsets_request(21, "orders", 3, ts)
    assert raw[4] == p.LIST_OFFSETS == 8 and p.API_NAMES[8] == "list_offsets"
    req = p.decode_request(raw[4:])
    assert (req.api_key, req.correlation_id, req.topic, req.partition, req.timestamp_ms) == (
        p.LIST_OFFSETS,
        21,
        "orders",
        3,
        ts,
    )


def test_response_round_trips_and_an_error_has_the_same_shape() -> None:
    raw = p.list_offsets_response(
        21, 0, offset=40, log_start_offset=12, high_watermark=99, leader=""
    )
    r = p.decode_response(p.LIST_OFFSETS, raw[4:])
    assert (r.correlation_id, r.error_code, r.offset, r.log_start_offset, r.high_watermark) == (
        21,
        0,
        40,
        12,
        99,
    )
    err = p.list_offsets_response(22, errors.NotLeader.code, "not me", leader="h:9")
    r = p.decode_response(p.LIST_OFFSETS, err[4:])
    assert (r.error_code, r.detail, r.leader, r.offset) == (
        errors.NotLeader.code,
        "not me",
        "h:9",
        -1,
    )


def test_malformed_requests_are_corrupt_record_not_a_crash() -> None:
    raw = p.list_offsets_request(21, "orders", 3, 5)[4:]
    for cut in (raw[:-1], raw[:-8], raw[:9]):  # short timestamp, no timestamp, short topic
        with pytest.raises(CorruptRecord):
            p.decode_request(cut)
    with pytest.raises(CorruptRecord, match="unexpected bytes"):
        p.decode_request(raw + b"\x00")
    resp = p.list_offsets_response(1, 0, offset=1)[4:]
    with pytest.raises(CorruptRecord):
        p.decode_response(p.LIST_OFFSETS, resp[:-1])  # the leader string cut short


@given(st.binary(max_size=120))
@settings(max_examples=300)
def test_any_answer_decodes_or_raises_corrupt_record(body: bytes) -> None:
    with contextlib.suppress(CorruptRecord):
        p.decode_response(p.LIST_OFFSETS, body)


@given(st.binary(max_size=60))
@settings(max_examples=300)
def test_any_request_body_decodes_or_raises_corrupt_record(tail: bytes) -> None:
    with contextlib.suppress(CorruptRecord):
        p.decode_request(bytes([p.LIST_OFFSETS]) + b"\x00\x00\x00\x01" + tail)


# -- the partition's rule ------------------------------------------------------------------
STAMPS = [100, 200, 150, 400, 300, 500]  # producers' clocks: need not grow with the offset


async def _filled(tmp_path: Path) -> Partition:
    part = open_part(tmp_path, hw=0, segment_bytes_max=300)  # replicated: hw moved by hand
    for seq, ts in enumerate(STAMPS):
        raw = bytearray(
            p.encode_batch(
                [(None, b"x" * 60)], pid=7, generation=0, base_sequence=seq, timestamp_ms=ts
            )
        )
        part.append(
            memoryview(raw), p.validate_batch(bytes(raw)), lambda *_: None, epoch=part.leader_epoch
        )
    await part.wait_flushed(part.log.next_offset)
    return part


def test_partition_answers_the_first_committed_batch_at_or_after_the_time(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        part = await _filled(tmp_path)
        assert len(part.log.segments) > 2
        part.set_high_watermark(4)  # offsets 4 and 5 are written, not committed
        at = part.offset_for_timestamp
        assert (at(p.EARLIEST_TIMESTAMP), at(p.LATEST_TIMESTAMP)) == (0, 4)
        assert [at(t) for t in (0, 100, 101, 150, 160, 201, 400)] == [0, 0, 1, 1, 1, 3, 3]
        # Only uncommitted batches are that new: start at the high watermark and wait.
        assert at(401) == 4 and at(10**12) == 4
        part.set_high_watermark(6)
        assert (at(401), at(500), at(501), at(p.LATEST_TIMESTAMP)) == (5, 5, 6, 6)
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(main())


# -- the SDK reader ------------------------------------------------------------------------
def test_reader_start_arguments_are_checked() -> None:
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
