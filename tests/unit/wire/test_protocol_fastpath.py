"""validate_batch's vectorised fast path must not change which batches it accepts.

``_reference_validate_batch`` below is a verbatim copy of validate_batch from before the
fast path (record walk and all). Every test builds a batch, runs both, and requires the
same outcome: the same header back, or CorruptRecord with the same message from each.
Mutated batches have their CRC (and batch_len) recomputed via ``batch_from_records``, so
the checksum passes and what is exercised is the record walk that the fast path replaces.
"""

from __future__ import annotations

import struct

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pidlease.errors import CorruptRecord
from pidlease.wire import protocol as p
from pidlease.wire.protocol import (
    _REC_HEAD,
    BATCH_HEADER_SIZE,
    MAX_GENERATION,
    MAX_PID,
    MAX_SEQUENCE,
    BatchHeader,
    batch_crc_ok,
    decode_batch_header,
)


def _reference_validate_batch(buf, pos=0, *, max_bytes=None) -> BatchHeader:
    """validate_batch as it was before the fast path; kept here as the oracle (with the
    later rule that our flags byte holds no bit but the control flag: byte 16 = 2 is a
    Kafka batch's magic, docs/kafka.md)."""
    h = decode_batch_header(buf, pos)
    if h.flags & ~p.NATIVE_FLAGS:
        raise CorruptRecord(f"unknown batch flags {h.flags:#x}")
    if h.batch_len < BATCH_HEADER_SIZE - 12:
        raise CorruptRecord(f"batch_len {h.batch_len} is shorter than a header")
    if max_bytes is not None and h.size > max_bytes:
        raise CorruptRecord(f"batch of {h.size} bytes is over the limit of {max_bytes}")
    if pos + h.size > len(buf):
        raise CorruptRecord(f"batch says {h.size} bytes but only {len(buf) - pos} arrived")
    if not batch_crc_ok(buf, h, pos):
        raise CorruptRecord("batch checksum mismatch")
    if h.count < 1:
        raise CorruptRecord(f"batch record count must be >= 1, got {h.count}")
    if h.generation > MAX_GENERATION:
        raise CorruptRecord(f"generation {h.generation} is over 2**31-1")
    if h.pid > MAX_PID:
        raise CorruptRecord(f"pid {h.pid} is over 2**63-1")
    if h.is_control:
        if h.count != 1 or h.base_sequence != -1:
            raise CorruptRecord("a control batch holds one record and no sequence")
    elif h.base_sequence < 0 or h.base_sequence + h.count - 1 > MAX_SEQUENCE:
        raise CorruptRecord(f"base_sequence {h.base_sequence} out of range")
    end = pos + h.size
    p_ = pos + BATCH_HEADER_SIZE
    for _ in range(h.count):
        if p_ + 8 > end:
            raise CorruptRecord("record header runs past the batch")
        klen, vlen = _REC_HEAD.unpack_from(buf, p_)
        p_ += 8 + max(klen, 0) + vlen
        if klen < -1 or p_ > end:
            raise CorruptRecord("record runs past the batch")
    if p_ != end:
        raise CorruptRecord(f"{end - p_} bytes after the last record of the batch")
    return h


def _outcome(fn, buf, pos, max_bytes):
    try:
        return ("ok", fn(buf, pos, max_bytes=max_bytes))
    except CorruptRecord as exc:
        return ("corrupt", str(exc))


def _check_same(raw: bytes, *, prefix: bytes = b"", suffix: bytes = b"", max_bytes=None):
    """Both implementations agree on ``raw`` placed at ``len(prefix)`` in every buffer
    type the server and readers pass (bytes, bytearray, memoryview of each)."""
    whole = prefix + raw + suffix
    pos = len(prefix)
    results = []
    for buf in (whole, bytearray(whole), memoryview(whole), memoryview(bytearray(whole))):
        want = _outcome(_reference_validate_batch, buf, pos, max_bytes)
        got = _outcome(p.validate_batch, buf, pos, max_bytes)
        assert got == want, (buf.__class__.__name__, got, want)
        results.append(got[0])
    return results[0]


def _batch(body: bytes, count: int, *, control: bool = False) -> bytes:
    # batch_from_records fills in batch_len and the CRC over whatever body/count it gets.
    if control:
        return p.batch_from_records(
            body, count, pid=5, generation=2, base_sequence=-1, timestamp_ms=9, flags=p.FLAG_CONTROL
        )
    return p.batch_from_records(body, count, pid=5, generation=2, base_sequence=100, timestamp_ms=9)


def _body(records) -> tuple[bytes, list[int]]:
    """Encoded records and where each record header starts within the body."""
    parts, starts, off = [], [], 0
    for k, v in records:
        enc = p.encode_record(k, v)
        starts.append(off)
        parts.append(enc)
        off += len(enc)
    return b"".join(parts), starts


key_st = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=12))


@st.composite
def uniform_records(draw):
    """Records of one shape: what the fast path is for."""
    n = draw(st.integers(1, 40))
    kind = draw(st.sampled_from(["none", "empty", "bytes"]))
    klen = draw(st.integers(1, 12))
    vlen = draw(st.integers(0, 40))
    out = []
    for _ in range(n):
        key = (
            None
            if kind == "none"
            else b""
            if kind == "empty"
            else draw(st.binary(min_size=klen, max_size=klen))
        )
        out.append((key, draw(st.binary(min_size=vlen, max_size=vlen))))
    return out


@st.composite
def same_stride_records(draw):
    """Records whose sizes all match but whose headers differ (key/value split moved,
    or None vs empty key): the total length fits the fast path but its header check must
    fail and defer to the walk."""
    n = draw(st.integers(2, 30))
    total = draw(st.integers(0, 30))
    out = []
    for _ in range(n):
        k = draw(st.one_of(st.none(), st.integers(0, total)))
        if k is None:
            out.append((None, b"v" * total))
        else:
            out.append((b"k" * k, b"v" * (total - k)))
    return out


mixed_records = st.lists(st.tuples(key_st, st.binary(max_size=40)), min_size=1, max_size=40)
any_records = st.one_of(uniform_records(), same_stride_records(), mixed_records)


@settings(max_examples=400)
@given(any_records, st.binary(max_size=9), st.binary(max_size=9))
def test_valid_batches_agree(records, prefix, suffix):
    body, _ = _body(records)
    assert _check_same(_batch(body, len(records)), prefix=prefix, suffix=suffix) == "ok"


@settings(max_examples=1500)
@given(any_records, st.data())
def test_mutated_record_headers_agree(records, data):
    body, starts = _body(records)
    body = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.sampled_from(starts))
        what = data.draw(st.sampled_from(["klen", "vlen", "both", "byte"]))
        klen, vlen = _REC_HEAD.unpack_from(body, at)
        if what in ("klen", "both"):
            klen = data.draw(st.one_of(st.integers(-4, 60), st.integers(-(2**31), 2**31 - 1)))
        if what in ("vlen", "both"):
            vlen = data.draw(st.one_of(st.integers(0, 80), st.integers(0, 2**32 - 1)))
        struct.pack_into(">iI", body, at, klen, vlen)
        if what == "byte":  # one arbitrary byte of one header
            body[at + data.draw(st.integers(0, 7))] = data.draw(st.integers(0, 255))
    _check_same(_batch(bytes(body), len(records)))


@settings(max_examples=800)
@given(any_records, st.data())
def test_resized_bodies_and_counts_agree(records, data):
    body, _ = _body(records)
    how = data.draw(st.sampled_from(["truncate", "extend", "count", "all"]))
    count = len(records)
    if how in ("truncate", "all") and body:
        body = body[: data.draw(st.integers(0, len(body) - 1))]
    if how in ("extend", "all"):
        # extra bytes may themselves look like a record of the same shape
        extra = data.draw(
            st.one_of(
                st.binary(min_size=1, max_size=20), st.just(body[: len(body) // max(count, 1)])
            )
        )
        body += extra
    if how in ("count", "all"):
        count = data.draw(st.integers(0, count + 3))
    _check_same(_batch(body, count))


@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(0, 50), st.booleans())
def test_arbitrary_bodies_agree(body, count, control):
    _check_same(_batch(body, count, control=control))


@given(uniform_records(), st.integers(1, 200))
def test_max_bytes_and_header_checks_agree(records, max_bytes):
    body, _ = _body(records)
    _check_same(_batch(body, len(records)), max_bytes=max_bytes)


@settings(max_examples=200)
@given(uniform_records(), st.integers(0, 60), st.integers(0, 255))
@example(records=[(None, b"ab")] * 3, at=16, byte=0xFF)  # the CRC field: checksum fails
def test_unpatched_mutations_agree(records, at, byte):
    """Byte changes without recomputing anything (mostly checksum failures)."""
    raw = bytearray(_batch(_body(records)[0], len(records)))
    raw[at % len(raw)] = byte
    _check_same(bytes(raw))


def test_one_bad_header_in_a_uniform_batch_is_caught():
    """Regression: one header changed at the very end of an otherwise uniform batch of
    1000 while the total size still matches (klen/vlen split moved)."""
    records = [(b"key", b"v" * 100)] * 1000
    body, starts = _body(records)
    body = bytearray(body)
    struct.pack_into(">iI", body, starts[-1], 103, 0)  # same stride, different header
    assert _check_same(_batch(bytes(body), 1000)) == "ok"  # still well formed: walk accepts
    struct.pack_into(">iI", body, starts[500], 2, 100)  # a byte short: walk must reject
    assert _check_same(_batch(bytes(body), 1000)) == "corrupt"
    struct.pack_into(">iI", body, starts[500], -2, 103)  # klen < -1
    assert _check_same(_batch(bytes(body), 1000)) == "corrupt"


def test_negative_and_odd_positions_agree():
    raw = _batch(_body([(None, b"x" * 10)] * 5)[0], 5)
    for prefix in (b"", b"\0", b"\0" * 7):
        whole = prefix + raw
        for pos in (len(prefix), len(prefix) - len(whole), -len(raw)):
            for buf in (whole, memoryview(whole)):
                assert _outcome(p.validate_batch, buf, pos, None) == _outcome(
                    _reference_validate_batch, buf, pos, None
                )
