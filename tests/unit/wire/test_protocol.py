"""The wire and batch format: round trips, checksums, and that any byte string either
decodes or raises CorruptRecord (never another exception)."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease import errors
from pidlease.errors import CorruptRecord, InvalidRequest
from pidlease.wire import protocol as P
from pidlease.wire import protocol as p
from pidlease.wire.framing import unpack_header

records_st = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.binary(max_size=50)),
    min_size=1,
    max_size=20,
)


@given(records_st, st.integers(1, 2**63 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2**40))
def test_batch_round_trip(records, pid, gen, base):
    raw = bytearray(
        p.encode_batch(records, pid=pid, generation=gen, base_sequence=base, timestamp_ms=7)
    )
    p.set_base_offset(raw, 1000)
    h = p.validate_batch(raw)
    assert (h.pid, h.generation, h.base_sequence, h.count, h.base_offset) == (
        pid,
        gen,
        base,
        len(records),
        1000,
    )
    recs = list(p.iter_records(raw, h, 0, "t", 3))
    assert [(r.key, r.value) for r in recs] == records
    assert [r.offset for r in recs] == list(range(1000, 1000 + len(records)))
    assert [r.sequence_id for r in recs] == list(range(base, base + len(records)))


def test_base_offset_is_outside_the_checksum():
    raw = bytearray(
        p.encode_batch([(None, b"x")], pid=1, generation=0, base_sequence=0, timestamp_ms=0)
    )
    p.set_base_offset(raw, 2**40)
    p.validate_batch(raw)


@given(st.data())
@settings(max_examples=200)
def test_any_flipped_byte_after_offset_is_refused(data):
    raw = bytearray(
        p.encode_batch(
            [(b"k", b"value-1"), (None, b"v2")],
            pid=5,
            generation=1,
            base_sequence=0,
            timestamp_ms=0,
        )
    )
    i = data.draw(st.integers(8, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecord):
        p.validate_batch(raw)


def test_count_mismatch_with_valid_crc_is_refused():
    raw = bytearray(
        p.encode_batch(
            [(None, b"a"), (None, b"b")], pid=5, generation=1, base_sequence=0, timestamp_ms=0
        )
    )
    struct.pack_into(">I", raw, 37, 3)  # claim 3 records, fix the checksum
    struct.pack_into(">I", raw, 12, __import__("zlib").crc32(bytes(raw[16:])))
    with pytest.raises(CorruptRecord, match="record"):
        p.validate_batch(raw)


def test_oversized_batch_is_refused():
    raw = p.encode_batch(
        [(None, b"x" * 1000)], pid=1, generation=0, base_sequence=0, timestamp_ms=0
    )
    with pytest.raises(CorruptRecord, match="over the limit"):
        p.validate_batch(raw, max_bytes=500)


def test_control_batch_shape():
    raw = p.encode_control_batch(pid=9, generation=4, timestamp_ms=1)
    h = p.validate_batch(raw)
    assert h.is_control and h.count == 1 and h.base_sequence == -1


@pytest.mark.parametrize("api", [p.PRODUCE, p.FETCH, p.FENCE, p.PRODUCER_STATE, p.METADATA])
def test_request_response_round_trip(api):
    batch = p.encode_batch([(None, b"v")], pid=3, generation=2, base_sequence=0, timestamp_ms=0)
    frames = {
        p.PRODUCE: p.produce_request(11, "orders", 2, "tok", batch),
        p.FETCH: p.fetch_request(11, "orders", 2, 99, 4096),
        p.FENCE: p.fence_request(11, "orders", 2, 3, 8, "tok", create_if_absent=True),
        p.PRODUCER_STATE: p.producer_state_request(11, "orders", 2, 3),
        p.METADATA: p.metadata_request(11),
    }
    raw = frames[api]
    (n,) = struct.unpack_from(">I", raw)
    assert n == len(raw) - 4
    req = p.decode_request(raw[4:])
    assert req.api_key == api and req.correlation_id == 11
    if api != p.METADATA:
        assert (req.topic, req.partition) == ("orders", 2)
    if api == p.PRODUCE:
        assert bytes(req.batch) == batch and req.token == "tok"
    if api == p.FENCE:
        assert (req.pid, req.generation, req.flags) == (3, 8, p.FENCE_CREATE_IF_ABSENT)
    responses = {
        p.PRODUCE: p.produce_response(11, 0, base_offset=5, last_offset=9, expected_sequence=-1),
        p.FETCH: p.fetch_response(11, 0, high_watermark=7, data=[batch, batch]),
        p.FENCE: p.fence_response(11, 0, existed=True, durable_highwater=41, fence_offset=50),
        p.PRODUCER_STATE: p.producer_state_response(
            11, 0, found=True, generation=8, durable_highwater=41
        ),
        p.METADATA: p.metadata_response(11, 0, info={"server_id": 1}),
    }
    resp = p.decode_response(api, responses[api][4:])
    assert resp.correlation_id == 11 and resp.error_code == 0
    if api == p.FETCH:
        assert bytes(resp.data) == batch + batch and resp.high_watermark == 7
    if api == p.FENCE:
        assert resp.existed and resp.durable_highwater == 41 and resp.fence_offset == 50
    if api == p.METADATA:
        assert resp.info == {"server_id": 1}


def test_fence_and_producer_state_optional_trailing_fields():
    # leased_since_ms and dropped_last_use_max_ms (docs/reliability.md, finding 6): read when
    # present, 0 when absent (an older peer), and left out when 0 (frames as older versions sent).
    old = p.fence_request(11, "orders", 2, 3, 8, "tok", create_if_absent=True)
    new = p.fence_request(
        11, "orders", 2, 3, 8, "tok", create_if_absent=True, leased_since_ms=1_700_000_000_000
    )
    assert new[4:].startswith(old[4:]) and len(new) == len(old) + 8
    assert p.decode_request(old[4:]).leased_since_ms == 0
    assert p.decode_request(new[4:]).leased_since_ms == 1_700_000_000_000
    with pytest.raises(p.CorruptRecord):
        p.decode_request(new[4:-1])  # a torn field is malformed, not "absent"
    for api, build in ((p.FENCE, p.fence_response), (p.PRODUCER_STATE, p.producer_state_response)):
        plain = build(11, 0)
        assert p.decode_response(api, plain[4:]).dropped_last_use_max_ms == 0
        resp = p.decode_response(api, build(11, 0, dropped_last_use_max_ms=123_456)[4:])
        assert resp.dropped_last_use_max_ms == 123_456


@given(st.binary(max_size=200))
@settings(max_examples=500)
def test_decode_request_raises_only_corrupt_record(body):
    # (or InvalidRequest: a PRODUCER_STATES / FENCES naming no partition, too many, or
    # one twice; both are answered as an error response)
    with contextlib.suppress(CorruptRecord, InvalidRequest):
        p.decode_request(body)


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_validate_batch_raises_only_corrupt_record(body):
    with contextlib.suppress(CorruptRecord):
        p.validate_batch(body, max_bytes=1 << 20)


def test_apis_before_replication_are_byte_for_byte_unchanged():
    # The digest of these frames as the protocol encoded them before REPLICA_FETCH and
    # EPOCH_END existed (commit 416a769): adding APIs must not move a byte of the old ones.
    import hashlib

    b = p.encode_batch([(b"k", b"v")], pid=3, generation=2, base_sequence=0, timestamp_ms=5)
    frames = [
        p.produce_request(11, "orders", 2, "tok", b),
        p.fetch_request(11, "orders", 2, 99, 4096),
        p.fence_request(11, "orders", 2, 3, 8, "tok", create_if_absent=True),
        p.producer_state_request(11, "orders", 2, 3),
        p.metadata_request(11),
        p.produce_response(11, 0, base_offset=5, last_offset=9, leader="h:1"),
        p.fetch_response(11, 21, "x", high_watermark=7, data=[b], leader="h:1"),
        p.fence_response(11, 0, existed=True, durable_highwater=41, fence_offset=50),
        p.producer_state_response(
            11, 0, found=True, generation=8, durable_highwater=41, last_use_ms=9
        ),
    ]
    digest = hashlib.sha256(b"".join(frames)).hexdigest()
    assert digest == "4d61450e5a3e80737149168e7e08d79cd061b3f25bbbdc9a351c760b02b92d84"


def test_replication_requests_and_responses_round_trip():
    batch = p.encode_batch([(None, b"v")], pid=3, generation=2, base_sequence=0, timestamp_ms=0)
    raw = p.replica_fetch_request(
        12,
        "orders",
        4,
        replica_id=3,
        leader_epoch=7,
        offset=1234,
        max_bytes=1 << 20,
        max_wait_ms=500,
    )
    req = p.decode_request(raw[4:])
    assert (req.api_key, req.correlation_id, req.topic, req.partition) == (
        p.REPLICA_FETCH,
        12,
        "orders",
        4,
    )
    assert (req.replica_id, req.leader_epoch, req.offset, req.max_bytes, req.max_wait_ms) == (
        3,
        7,
        1234,
        1 << 20,
        500,
    )
    resp = p.decode_response(
        p.REPLICA_FETCH,
        p.replica_fetch_response(
            12,
            0,
            high_watermark=1200,
            leader_epoch=7,
            epochs=[(5, 900), (7, 1210)],
            data=[batch, batch],
        )[4:],
    )
    assert (resp.high_watermark, resp.leader_epoch, resp.epochs) == (1200, 7, [(5, 900), (7, 1210)])
    assert bytes(resp.data) == batch + batch
    err = p.decode_response(p.REPLICA_FETCH, p.replica_fetch_response(12, 21, "not me")[4:])
    assert (err.error_code, err.detail, err.epochs, len(err.data)) == (21, "not me", [], 0)

    raw = p.epoch_end_request(13, "orders", 4, replica_id=2, leader_epoch=7, epoch=5)
    req = p.decode_request(raw[4:])
    assert (req.api_key, req.replica_id, req.leader_epoch, req.epoch) == (p.EPOCH_END, 2, 7, 5)
    resp = p.decode_response(p.EPOCH_END, p.epoch_end_response(13, 0, epoch=5, end_offset=1210)[4:])
    assert (resp.epoch, resp.end_offset) == (5, 1210)
    with pytest.raises(CorruptRecord):
        p.decode_request(raw[4:-1])


@given(st.sampled_from([p.REPLICA_FETCH, p.EPOCH_END]), st.binary(max_size=120))
@settings(max_examples=300)
def test_replication_answers_decode_or_raise_corrupt_record(api, body):
    with contextlib.suppress(CorruptRecord):
        p.decode_response(api, body)


# -- PRODUCER_STATES and FENCES (issue 24): one PID on many partitions in one request -----
def test_producer_states_round_trip():
    parts = [("t", 0), ("t", 7), ("other", 2)]
    req = p.decode_request(p.producer_states_request(5, 42, parts)[4:])
    assert (req.api_key, req.correlation_id, req.pid) == (p.PRODUCER_STATES, 5, 42)
    assert [(e.topic, e.partition) for e in req.entries] == parts
    entries = [
        p.state_entry(0, found=True, generation=3, durable_highwater=9, last_use_ms=77),
        p.state_entry(6, "this server does not lead t/7"),
        p.state_entry(0, found=False, dropped_last_use_max_ms=123),
    ]
    r = p.decode_response(p.PRODUCER_STATES, p.entries_response(5, 0, "", entries)[4:])
    assert r.correlation_id == 5 and r.error_code == 0
    got = [(e.error_code, e.found, e.generation, e.durable_highwater) for e in r.entries]
    assert got == [(0, True, 3, 9), (6, False, 0, -1), (0, False, 0, -1)]
    assert r.entries[1].detail == "this server does not lead t/7"
    assert r.entries[0].last_use_ms == 77 and r.entries[2].dropped_last_use_max_ms == 123


def test_fences_round_trip():
    entries = [
        p.PartitionEntry("t", 0, p.FENCE_CREATE_IF_ABSENT, 1_000),
        p.PartitionEntry("t", 1, 0, 0),
    ]
    req = p.decode_request(p.fences_request(8, 42, 7, "tok", entries)[4:])
    assert (req.api_key, req.pid, req.generation, req.token) == (p.FENCES, 42, 7, "tok")
    assert req.entries == entries
    answer = [
        p.fence_entry(0, existed=True, durable_highwater=4, fence_offset=10),
        p.fence_entry(2, "older generation", existed=True, durable_highwater=4),
    ]
    r = p.decode_response(p.FENCES, p.entries_response(8, 0, "", answer)[4:])
    assert [(e.error_code, e.existed, e.durable_highwater, e.fence_offset) for e in r.entries] == [
        (0, True, 4, 10),
        (2, True, 4, -1),
    ]
    refused = p.decode_response(p.FENCES, p.entries_response(8, 7, "bad token", [])[4:])
    assert (refused.error_code, refused.detail, refused.entries) == (7, "bad token", [])


def _many(api: int, count: int, entries: bytes) -> bytes:
    head = struct.pack(">BIQ", api, 1, 42)
    if api == p.FENCES:
        head += struct.pack(">I", 3) + p.pack_str("tok")
    return head + struct.pack(">I", count) + entries


@pytest.mark.parametrize("api", [p.PRODUCER_STATES, p.FENCES])
def test_many_partitions_bad_input_is_a_clear_error(api):
    one = p.pack_str("t") + struct.pack(">I", 0) + (b"\0" * 9 if api == p.FENCES else b"")
    with pytest.raises(InvalidRequest, match="names none"):
        p.decode_request(_many(api, 0, b""))
    with pytest.raises(InvalidRequest, match="over the limit of 10000"):
        p.decode_request(_many(api, p.PARTITIONS_PER_REQUEST_MAX + 1, one * 10_001))
    with pytest.raises(InvalidRequest, match="t/0 named twice"):
        p.decode_request(_many(api, 2, one + one))
    # A count the frame cannot hold is refused before any entry is read.
    with pytest.raises(CorruptRecord, match="too short for 5000"):
        p.decode_request(_many(api, 5000, one))
    with pytest.raises(CorruptRecord):
        p.decode_request(_many(api, 1, one[:-1]))
    with pytest.raises(CorruptRecord, match="unexpected bytes"):
        p.decode_request(_many(api, 1, one + b"x"))
    with pytest.raises(ValueError, match=r"1\.\.10000 partitions"):
        p.producer_states_request(1, 42, [])


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_many_partitions_answers_decode_or_raise_corrupt_record(body):
    for api in (p.PRODUCER_STATES, p.FENCES):
        with contextlib.suppress(CorruptRecord):
            p.decode_response(api, body)


# -- REPLICA_FETCH_MANY (issue 24 item 2: fetch sessions)
def body(frame: bytes) -> bytes:
    n = unpack_header(frame[:4])
    assert n == len(frame) - 4
    return frame[4:]


def test_a_request_round_trips() -> None:
    """Issue 24 item 2 (fetch sessions): REPLICA_FETCH_MANY on the wire, a follower's fetch for
    every partition it follows on one leader server and the leader's answer."""

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
    """Issue 24 item 2 (fetch sessions): REPLICA_FETCH_MANY on the wire, a follower's fetch for
    every partition it follows on one leader server and the leader's answer."""

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
    """Issue 24 item 2 (fetch sessions): REPLICA_FETCH_MANY on the wire, a follower's fetch for
    every partition it follows on one leader server and the leader's answer."""

    resp = P.decode_response(P.REPLICA_FETCH_MANY, body(P.replica_fetch_many_response(1, 0)))
    assert resp.fetched == []


def test_a_request_naming_more_partitions_than_allowed_is_refused() -> None:
    """Issue 24 item 2 (fetch sessions): REPLICA_FETCH_MANY on the wire, a follower's fetch for
    every partition it follows on one leader server and the leader's answer."""

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
    """Issue 24 item 2 (fetch sessions): REPLICA_FETCH_MANY on the wire, a follower's fetch for
    every partition it follows on one leader server and the leader's answer."""

    head = struct.pack(">BI", P.REPLICA_FETCH_MANY, 5) + struct.pack(">IIIII", 1, 0, 1, 1, 1000)
    with pytest.raises(errors.CorruptRecord, match="too short"):
        P.decode_request(head + b"\x00" * 100)
    resp_head = struct.pack(">IH", 5, 0) + struct.pack(">H", 0) + struct.pack(">I", 1000)
    with pytest.raises(errors.CorruptRecord, match="too short"):
        P.decode_response(P.REPLICA_FETCH_MANY, resp_head)


@pytest.mark.parametrize("cut", [1, 5, 9, 17, 30])
def test_a_truncated_frame_is_a_clear_error(cut: int) -> None:
    """Issue 24 item 2 (fetch sessions): REPLICA_FETCH_MANY on the wire, a follower's fetch for
    every partition it follows on one leader server and the leader's answer."""

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
    """Issue 24 item 2 (fetch sessions): REPLICA_FETCH_MANY on the wire, a follower's fetch for
    every partition it follows on one leader server and the leader's answer."""

    frame = P.replica_fetch_many_request(
        3, [], replica_id=2, max_wait_ms=0, max_bytes=1, partition_max_bytes=1
    )
    with pytest.raises(errors.CorruptRecord, match="unexpected bytes"):
        P.decode_request(body(frame) + b"x")


# -- LIST_OFFSETS (issue 13 item 4)
@pytest.mark.parametrize("ts", [0, 1_700_000_000_123, P.LATEST_TIMESTAMP, P.EARLIEST_TIMESTAMP])
def test_request_round_trips(ts: int) -> None:
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    request and answer on the wire; malformed frames are CORRUPT_RECORD."""

    raw = P.list_offsets_request(21, "orders", 3, ts)
    assert raw[4] == P.LIST_OFFSETS == 8 and P.API_NAMES[8] == "list_offsets"
    req = P.decode_request(raw[4:])
    assert (req.api_key, req.correlation_id, req.topic, req.partition, req.timestamp_ms) == (
        P.LIST_OFFSETS,
        21,
        "orders",
        3,
        ts,
    )


def test_response_round_trips_and_an_error_has_the_same_shape() -> None:
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    request and answer on the wire; malformed frames are CORRUPT_RECORD."""

    raw = P.list_offsets_response(
        21, 0, offset=40, log_start_offset=12, high_watermark=99, leader=""
    )
    r = P.decode_response(P.LIST_OFFSETS, raw[4:])
    assert (r.correlation_id, r.error_code, r.offset, r.log_start_offset, r.high_watermark) == (
        21,
        0,
        40,
        12,
        99,
    )
    err = P.list_offsets_response(22, errors.NotLeader.code, "not me", leader="h:9")
    r = P.decode_response(P.LIST_OFFSETS, err[4:])
    assert (r.error_code, r.detail, r.leader, r.offset) == (
        errors.NotLeader.code,
        "not me",
        "h:9",
        -1,
    )


def test_malformed_requests_are_corrupt_record_not_a_crash() -> None:
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    request and answer on the wire; malformed frames are CORRUPT_RECORD."""

    raw = P.list_offsets_request(21, "orders", 3, 5)[4:]
    for cut in (raw[:-1], raw[:-8], raw[:9]):  # short timestamp, no timestamp, short topic
        with pytest.raises(CorruptRecord):
            P.decode_request(cut)
    with pytest.raises(CorruptRecord, match="unexpected bytes"):
        P.decode_request(raw + b"\x00")
    resp = P.list_offsets_response(1, 0, offset=1)[4:]
    with pytest.raises(CorruptRecord):
        P.decode_response(P.LIST_OFFSETS, resp[:-1])  # the leader string cut short


@given(st.binary(max_size=120))
@settings(max_examples=300)
def test_any_answer_decodes_or_raises_corrupt_record(body: bytes) -> None:
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    request and answer on the wire; malformed frames are CORRUPT_RECORD."""

    with contextlib.suppress(CorruptRecord):
        P.decode_response(P.LIST_OFFSETS, body)


@given(st.binary(max_size=60))
@settings(max_examples=300)
def test_any_request_body_decodes_or_raises_corrupt_record(tail: bytes) -> None:
    """Issue 13 item 4 (LIST_OFFSETS: a reader's start by time, or the log's start or end): the
    request and answer on the wire; malformed frames are CORRUPT_RECORD."""

    with contextlib.suppress(CorruptRecord):
        P.decode_request(bytes([P.LIST_OFFSETS]) + b"\x00\x00\x00\x01" + tail)
