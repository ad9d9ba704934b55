"""REPLICA_FETCH_MANY on the wire (issue 24 item 2): a follower's fetch for every partition
it follows on one leader server, and the leader's answer for those with something new."""

from __future__ import annotations

import struct

import pytest

from pidlease import errors
from pidlease.wire import protocol as P
from pidlease.wire.framing import unpack_header


def body(frame: bytes) -> bytes:
    n = unpack_header(frame[:4])
    assert n == len(frame) - 4
    return frame[4:]


def test_a_request_round_trips() -> None:
    entries = [
        P.ReplicaFetchEntry("orders", 0, 3, 120, 100),
        P.ReplicaFetchEntry("orders", 7, 5, 0, -1),
        P.ReplicaFetchEntry("é", 2**32 - 1, 0, 2**62, 2**62),
    ]
    frame = P.replica_fetch_many_request(
        9, entries, replica_id=2, max_wait_ms=500, max_bytes=1 << 20, partition_max_bytes=4096
    )
    req = P.decode_request(body(frame))
    assert req.api_key == P.REPLICA_FETCH_MANY and req.correlation_id == 9
    assert (req.replica_id, req.max_wait_ms, req.max_bytes, req.flags) == (2, 500, 1 << 20, 4096)
    assert req.fetches == entries


def test_an_answer_round_trips_with_data_epochs_and_errors() -> None:
    fetched = [
        P.ReplicaFetched("t", 1, 0, "", 40, 3, [(2, 0), (3, 30)], [b"abc", b"defg"]),
        P.ReplicaFetched("t", 2, errors.NotLeader.code, "not leading"),
        P.ReplicaFetched("u", 0, 0, "", 12, 4, [], b""),
    ]
    resp = P.decode_response(
        P.REPLICA_FETCH_MANY, body(P.replica_fetch_many_response(7, 0, "", fetched))
    )
    assert resp.correlation_id == 7 and resp.error_code == 0
    got = resp.fetched
    assert got is not None and len(got) == 3
    assert bytes(got[0].data) == b"abcdefg" and got[0].epochs == [(2, 0), (3, 30)]
    assert (got[0].high_watermark, got[0].leader_epoch) == (40, 3)
    assert (got[1].error_code, got[1].detail, bytes(got[1].data)) == (
        errors.NotLeader.code,
        "not leading",
        b"",
    )
    assert (got[2].topic, got[2].partition, got[2].high_watermark) == ("u", 0, 12)


def test_an_empty_answer_is_a_valid_answer() -> None:
    resp = P.decode_response(P.REPLICA_FETCH_MANY, body(P.replica_fetch_many_response(1, 0)))
    assert resp.fetched == []


def test_a_request_naming_more_partitions_than_allowed_is_refused() -> None:
    head = struct.pack(">BI", P.REPLICA_FETCH_MANY, 5) + struct.pack(
        ">IIIII", 1, 0, 1, 1, P.REPLICA_FETCH_PARTITIONS_MAX + 1
    )
    with pytest.raises(errors.CorruptRecord, match="at most"):
        P.decode_request(head)
    with pytest.raises(ValueError, match="at most"):
        P.replica_fetch_many_request(
            1,
            [P.ReplicaFetchEntry("t", 0, 0, 0, 0)] * (P.REPLICA_FETCH_PARTITIONS_MAX + 1),
            replica_id=1,
            max_wait_ms=0,
            max_bytes=1,
            partition_max_bytes=1,
        )


def test_a_count_the_frame_cannot_hold_is_refused_before_reading_entries() -> None:
    head = struct.pack(">BI", P.REPLICA_FETCH_MANY, 5) + struct.pack(">IIIII", 1, 0, 1, 1, 1000)
    with pytest.raises(errors.CorruptRecord, match="too short"):
        P.decode_request(head + b"\x00" * 100)
    resp_head = struct.pack(">IH", 5, 0) + struct.pack(">H", 0) + struct.pack(">I", 1000)
    with pytest.raises(errors.CorruptRecord, match="too short"):
        P.decode_response(P.REPLICA_FETCH_MANY, resp_head)


@pytest.mark.parametrize("cut", [1, 5, 9, 17, 30])
def test_a_truncated_frame_is_a_clear_error(cut: int) -> None:
    frame = P.replica_fetch_many_request(
        3,
        [P.ReplicaFetchEntry("orders", 0, 3, 120, 100)],
        replica_id=2,
        max_wait_ms=500,
        max_bytes=10,
        partition_max_bytes=10,
    )
    b = body(frame)
    with pytest.raises(errors.CorruptRecord):
        P.decode_request(b[: len(b) - cut])
    answer = body(
        P.replica_fetch_many_response(3, 0, "", [P.ReplicaFetched("t", 1, 0, "", 4, 1, [], b"xyz")])
    )
    with pytest.raises(errors.CorruptRecord):
        P.decode_response(P.REPLICA_FETCH_MANY, answer[: len(answer) - cut])


def test_trailing_bytes_are_refused() -> None:
    frame = P.replica_fetch_many_request(
        3, [], replica_id=2, max_wait_ms=0, max_bytes=1, partition_max_bytes=1
    )
    with pytest.raises(errors.CorruptRecord, match="unexpected bytes"):
        P.decode_request(body(frame) + b"x")
