"""``send_batch``'s columns: many records handed over in one call, routed, split into
batches and encoded without building a Python object per record where the input allows.

A call's values (and keys, and explicit sequence ids) arrive as Python lists or Arrow
arrays (``Columns``). Routing: a key picks ``crc32(key) mod partitions`` (the same hash
as ``send``: ``partitioner.partition_for_key``; for Arrow keys it is computed a byte
column at a time over every key at once, ``crc32_keys``); the records of a call without
keys (and keyed records whose key is null) go to one partition, the next of the round
robin (as Kafka's sticky partitioner does: a batch stays whole). Then, per partition, the
records are cut into runs at the batch limits and at every hole in explicit ids, and each
run's body is built in one step: for Arrow, the record heads are one numpy array and
``pyarrow.compute.binary_join_element_wise`` lays head, key and value of every record
end to end, so a batch body is one slice of that buffer.

Each run is an ``EncodedBatch``: a ``ProducerBatch`` whose body is already encoded, so the
partition's sender treats it like any other batch (ordering, the in-flight window,
resends, fencing) and a resend sends the same bytes. Its outcome goes to the call's
``BatchTracker`` (``batch_future.py``), which completes the call's one future when every
run is settled; the future's result is ``BatchMetadata``, a lazy sequence (a record's
``RecordMetadata`` is made when someone looks at it).

pyarrow and numpy are optional: they are imported only when an input is an Arrow array.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import itertools
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pidlease import errors
from pidlease.client.batch_future import BatchTracker, Positions
from pidlease.client.config import RECORD_OVERHEAD
from pidlease.client.producer_batch import ProducerBatch
from pidlease.client.structs import BatchAck
from pidlease.wire import protocol

__all__ = [
    "Columns",
    "EncodedBatch",
    "crc32_keys",
]

_REC_HEAD = protocol.REC_HEAD
_CRC_VECTOR_KEY_MAX = 64  # longer keys: zlib.crc32 key by key (a column pass per byte)


def _pyarrow(sub: str = "") -> Any:
    """pyarrow (or one of its modules), imported when Arrow input arrives. Through
    importlib, so an application's strict mypy, which has no stubs for pyarrow, sees ``Any``
    here instead of an import it cannot analyse."""
    return importlib.import_module(f"pyarrow.{sub}" if sub else "pyarrow")


def _is_arrow(x: Any) -> bool:
    return type(x).__module__.startswith("pyarrow")


def _as_bytes(x: Any, what: str) -> bytes:
    if type(x) is bytes:
        return x
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode()
    raise errors.ConfigError(f"{what} must be bytes or str, not {type(x).__name__}")


def _arrow_binary(arr: Any, what: str, *, nulls_ok: bool) -> Any:
    """``arr`` (an Arrow array or chunked array of binary or string) as one BinaryArray."""
    pa = _pyarrow()

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        arr = arr.cast(pa.binary())  # UTF-8 bytes as they are
    elif not pa.types.is_binary(t):
        raise errors.ConfigError(f"{what} must be an Arrow binary or string array, not {t}")
    if not nulls_ok and arr.null_count:
        raise errors.ConfigError(f"{what} holds {arr.null_count} nulls; a record needs a value")
    return arr


def _lengths(arr: Any) -> Any:
    """Byte lengths of a BinaryArray's items (0 for nulls), as a numpy int64 array."""
    import numpy as np

    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + n + 1)
    return np.diff(offsets[arr.offset :]).astype(np.int64)


@functools.cache
def _crc_table() -> Any:
    """CRC-32's (zlib's, reflected 0xEDB88320) byte table, as numpy uint32."""
    import numpy as np

    c = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        c = np.where(c & 1, np.uint32(0xEDB88320) ^ (c >> np.uint32(1)), c >> np.uint32(1))
    return c.astype(np.uint32)


def crc32_keys(keys: Any) -> Any:
    """``zlib.crc32`` of every item of an Arrow BinaryArray, as a numpy uint32 array (nulls
    get 0: the caller routes them apart). One pass per key byte over all keys at once."""
    import numpy as np

    n = len(keys)
    lens = _lengths(keys)
    longest = int(lens.max()) if n else 0
    if longest > _CRC_VECTOR_KEY_MAX:
        return np.fromiter(
            (0 if k is None else zlib.crc32(k) for k in keys.to_pylist()), np.uint32, n
        )
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=keys.offset + n + 1)
    starts = offsets[keys.offset : keys.offset + n].astype(np.int64)
    data_buf = keys.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(1, "u1")
    if not len(data):
        data = np.zeros(1, dtype=np.uint8)
    table = _crc_table()
    crc = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    last = len(data) - 1
    for j in range(longest):
        active = lens > j
        byte = data[np.minimum(starts + j, last)].astype(np.uint32)
        step = table[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
        crc = np.where(active, step, crc)
    return crc ^ np.uint32(0xFFFFFFFF)


@dataclass(slots=True)
class Columns:
    """One call's records, checked: ``values`` (list of bytes, or an Arrow BinaryArray
    without nulls), ``keys`` (None, a list of bytes-or-None, or a BinaryArray whose nulls
    are records without a key), ``seqs`` (None or the explicit ids), ``sizes`` (each
    record's key + value bytes; its encoded size is ``RECORD_OVERHEAD`` more)."""

    n: int
    values: Any
    keys: Any
    seqs: list[int] | None
    arrow: bool
    sizes: Any

    @classmethod
    def of(cls, values: Any, keys: Any, sequence_ids: Any, *, bytes_max: int) -> Columns:
        """Check and normalise ``send_batch``'s arguments; raises ``ConfigError`` /
        ``RecordTooLarge`` and changes nothing."""
        arrow = _is_arrow(values)
        if arrow:
            vals = _arrow_binary(values, "values", nulls_ok=False)
            n = len(vals)
            if keys is not None:
                if not _is_arrow(keys):
                    pa = _pyarrow()

                    keys = pa.array(
                        [None if k is None else _as_bytes(k, "key") for k in keys], pa.binary()
                    )
                keys = _arrow_binary(keys, "keys", nulls_ok=True)
            sizes = _lengths(vals)
            if keys is not None:
                if len(keys) != n:
                    raise errors.ConfigError(f"{len(keys)} keys for {n} values")
                sizes += _lengths(keys)
        else:
            if isinstance(values, (bytes, str)) or not isinstance(values, Sequence):
                raise errors.ConfigError(
                    "values must be a list (or other sequence) of bytes, or an Arrow array"
                )
            vals = values if type(values) is list else list(values)
            # one C pass to see that every value is bytes (the usual case): no per-record
            # Python call then
            if set(map(type, vals)) - {bytes}:
                vals = [_as_bytes(v, "value") for v in vals]
            n = len(vals)
            sizes = list(map(len, vals))
            if keys is not None:
                keys = keys.to_pylist() if _is_arrow(keys) else list(keys)
                if set(map(type, keys)) - {bytes, type(None)}:
                    keys = [None if k is None else _as_bytes(k, "key") for k in keys]
                if len(keys) != n:
                    raise errors.ConfigError(f"{len(keys)} keys for {n} values")
                sizes = [s if k is None else s + len(k) for s, k in zip(sizes, keys, strict=True)]
        seqs = None
        if sequence_ids is not None:
            seqs = _sequence_list(sequence_ids)
            if len(seqs) != n:
                raise errors.ConfigError(f"{len(seqs)} sequence ids for {n} values")
        if n:
            biggest = int(max(sizes)) + RECORD_OVERHEAD
            if biggest + protocol.BATCH_HEADER_SIZE > bytes_max:
                raise errors.RecordTooLarge(
                    f"a record of {biggest} bytes does not fit batch_bytes_max={bytes_max}"
                )
        return cls(n, vals, keys, seqs, arrow, sizes)


def _sequence_list(ids: Any) -> list[int]:
    if _is_arrow(ids):
        pa = _pyarrow()

        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not pa.types.is_integer(ids.type) or ids.null_count:
            raise errors.ConfigError("sequence_ids must be an Arrow integer array without nulls")
        seqs: list[int] = ids.to_pylist()
    else:
        seqs = list(ids)
        if not all(type(s) is int for s in seqs):
            raise errors.ConfigError("sequence_ids must be ints")
    if seqs and (min(seqs) < 0 or max(seqs) > protocol.MAX_SEQUENCE):
        raise errors.ConfigError("every sequence id must be in 0..2**63-1")
    return seqs


# -- routing ---------------------------------------------------------------------------


def route(cols: Columns, partitions: int, sticky: int) -> list[tuple[int, Positions]]:
    """(partition, input positions in order) per partition the call touches. Keyed records
    go by key hash; the rest to ``sticky``."""
    n = cols.n
    keys = cols.keys
    if keys is None or partitions == 1:
        return [(0 if partitions == 1 else sticky, range(n))] if n else []
    if cols.arrow:
        import numpy as np

        parts = (crc32_keys(keys) % np.uint32(partitions)).astype(np.int64)
        if keys.null_count:
            valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False))
            parts[~valid] = sticky
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=partitions)
        groups = []
        start = 0
        for p in range(partitions):
            c = int(counts[p])
            if c:
                groups.append((p, order[start : start + c]))
            start += c
        return groups
    by_part: dict[int, list[int]] = {}
    crc = zlib.crc32
    for i, k in enumerate(keys):
        p = sticky if k is None else crc(k) % partitions
        got = by_part.get(p)
        if got is None:
            by_part[p] = [i]
        else:
            got.append(i)
    return sorted(by_part.items())


def _take(seq: Any, pos: Positions) -> Any:
    if isinstance(pos, range):
        return seq[pos.start : pos.stop]
    if isinstance(seq, list):
        return [seq[i] for i in pos]
    return seq[pos]  # numpy


# -- explicit ids ----------------------------------------------------------------------
@dataclass(slots=True)
class IdPlan:
    """What the explicit ids of one partition's records mean, worked out before anything
    changes: which records are replays (already durable: resolved as duplicates), where
    runs must break (holes), and the partition's last given id afterwards."""

    replay: list[int]  # indices (within the group) of replayed records
    breaks: list[int]  # indices (within the group, among sent records) where a run starts
    last_given: int


def plan_ids(
    seqs: list[int], *, last_given: int, last_acked: int, strict: bool, partition: int
) -> IdPlan:
    """``send``'s rules for explicit ids, over one partition's records in order: an id at
    or below the last one given is a replay when durable, else an error; a new id must
    increase (strict: by exactly one)."""
    n = len(seqs)
    if n and seqs[0] > last_given and seqs == list(range(seqs[0], seqs[0] + n)):
        # The usual case (a replayable source's next rows): contiguous and new.
        if strict and seqs[0] != last_given + 1:
            raise errors.ConfigError(
                f"strict topic: partition {partition} needs sequence_id {last_given + 1} "
                f"next, not {seqs[0]}"
            )
        return IdPlan([], [], seqs[-1])
    replay: list[int] = []
    breaks: list[int] = []
    last = last_given
    prev_sent = None
    sent = 0
    for i, s in enumerate(seqs):
        if s <= last:
            if s <= last_acked:
                replay.append(i)
                continue
            raise errors.ConfigError(
                f"sequence_id {s} was already given to a record of partition {partition} "
                f"that is not acknowledged yet"
            )
        if strict and s != last + 1:
            raise errors.ConfigError(
                f"strict topic: partition {partition} needs sequence_id {last + 1} next, not {s}"
            )
        if prev_sent is not None and s != prev_sent + 1:
            breaks.append(sent)
        prev_sent = s
        last = s
        sent += 1
    return IdPlan(replay, breaks, last)


# -- runs ------------------------------------------------------------------------------
def chunk_bounds(
    cum_at: Callable[[int], int],
    n: int,
    *,
    body_max: int,
    records_max: int,
    breaks: Sequence[int] = (),
) -> list[tuple[int, int]]:
    """[start, end) of each run over ``n`` records, in order: each at most ``records_max``
    records and ``body_max`` bytes, and a new run at each break. ``cum_at(i)``: the
    encoded bytes of records 0..i-1 (increasing; looked at a few times per run)."""
    bounds = []
    s = 0
    ends = range(n + 1)
    while s < n:
        # the last end whose bytes from s fit: a binary search over the record indices
        e = bisect.bisect_right(ends, cum_at(s) + body_max, key=cum_at) - 1
        e = min(n, s + records_max, e)
        b = bisect.bisect_right(breaks, s)
        if b < len(breaks):
            e = min(e, breaks[b])
        e = max(e, s + 1)  # a record larger than body_max was refused before
        bounds.append((s, e))
        s = e
    return bounds


def encode_parts(cols: Columns, pos: Positions) -> tuple[Any, Any]:
    """Arrow columns: the encoded records at ``pos`` laid end to end (``(buffer,
    offsets)``: record i is ``buffer[offsets[i]:offsets[i+1]]``), as the batch format has
    them, in one pass over the columns."""
    if cols.arrow:
        import numpy as np

        pa = _pyarrow()
        pc = _pyarrow("compute")

        vals = cols.values
        keys = cols.keys
        if not isinstance(pos, range) or pos != range(cols.n):
            idx = pa.array(pos) if not isinstance(pos, range) else None
            vals = vals.take(idx) if idx is not None else vals.slice(pos.start, len(pos))
            if keys is not None:
                keys = keys.take(idx) if idx is not None else keys.slice(pos.start, len(pos))
        m = len(vals)
        head_np = np.empty((m, 2), dtype=">i4")
        head_np[:, 1] = _lengths(vals)
        cols_ = [vals]
        if keys is None:
            head_np[:, 0] = -1
        else:
            klen = _lengths(keys)
            if keys.null_count:
                valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False))
                klen[~valid] = -1
            head_np[:, 0] = klen
            cols_ = [keys, vals]
        head_arr = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(8), m, [None, pa.py_buffer(head_np)]
        ).cast(pa.binary())
        joined = pc.binary_join_element_wise(
            head_arr, *cols_, b"", null_handling="replace", null_replacement=b""
        )
        offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=joined.offset + m + 1)
        offsets = offsets[joined.offset :].astype(np.int64)
        data = joined.buffers()[2]
        return memoryview(data if data is not None else b""), offsets
    raise AssertionError("lists are encoded run by run: encode_list")


_head_no_key = functools.partial(_REC_HEAD.pack, -1)


def encode_list(vals: list[bytes], keys: list[bytes | None] | None) -> list[bytes]:
    """The records of one run given as lists, encoded: buffers to concatenate."""
    if keys is None:
        n0 = len(vals[0])
        if min(map(len, vals)) == n0 == max(map(len, vals)):
            # every value the same length (the usual case): one head, repeated by the join
            head = _head_no_key(n0)
            return [head, head.join(vals)]
        heads = map(_head_no_key, map(len, vals))
        return [b"".join(itertools.chain.from_iterable(zip(heads, vals, strict=True)))]
    pack = _REC_HEAD.pack
    parts: list[bytes] = []
    for k, v in zip(keys, vals, strict=True):
        if k is None:
            parts += (pack(-1, len(v)), v)
        else:
            parts += (pack(len(k), len(v)), k, v)
    return [b"".join(parts)]


class EncodedBatch(ProducerBatch):
    """A batch of ``send_batch``: its body already encoded (``parts``), ``count`` records.
    ``values`` holds one shared placeholder per record, so everything that counts a
    batch's records (``len(batch.values)``) counts these too; nothing can join it (it is
    appended to the accumulator closed, and ``add`` refuses). Its outcome goes to the
    call's tracker (slot ``slot``)."""

    __slots__ = ("parts", "slot", "tracker")

    def __init__(
        self,
        first_ms: float,
        first_seq: int,
        count: int,
        parts: list[Any],
        tracker: BatchTracker,
        slot: int,
    ) -> None:
        size = sum(map(len, parts)) + protocol.BATCH_HEADER_SIZE
        super().__init__(first_ms, first_seq, count, size)
        self.values = [b""] * count
        self.parts = parts
        self.size = size
        self.counted = count
        if first_seq >= 0:
            self.last_seq = first_seq + count - 1
        self.tracker = tracker
        self.slot = slot

    def add(self, key: bytes | None, value: bytes, future: Any, seq: int) -> bool:
        return False

    def full(self, smallest_record: int = RECORD_OVERHEAD) -> bool:
        return True

    def body_parts(self) -> list[bytes]:
        # The batch is built once and then frozen (a resend sends its bytes): the parts,
        # which may hold a whole Arrow buffer alive, are not needed after this.
        parts, self.parts = self.parts, []
        return parts

    def resolve(self, ack: BatchAck, condition: threading.Condition | None) -> None:
        self.tracker.settle(self.slot, ack)

    def fail(self, exc: BaseException, condition: threading.Condition | None) -> None:
        self.tracker.settle(self.slot, exc)


def _without(pos: Positions, drop: list[int]) -> Positions:
    """``pos`` without the items at indices ``drop``."""
    gone = set(drop)
    return [
        x for j, x in enumerate(pos.tolist() if hasattr(pos, "tolist") else pos) if j not in gone
    ]


@dataclass(slots=True)
class RunLimits:
    records_max: int
    bytes_max: int


def build_runs(
    cols: Columns,
    partition: int,
    pos: Positions,
    ids: IdPlan | None,
    *,
    limits: RunLimits,
    tracker: BatchTracker,
    replayed: BatchAck,
    now_ms: float,
) -> list[ProducerBatch]:
    """The runs of one partition's records of a call (``pos``, in order), each one batch:
    replayed ids are settled at once as duplicates, the rest cut at the batch limits and
    at holes in explicit ids, each run's body encoded in one step."""
    seqs = None if cols.seqs is None else _take(cols.seqs, pos)
    if ids is not None and ids.replay:
        assert seqs is not None
        tracker.add_settled(
            [int(pos[j]) for j in ids.replay], [seqs[j] for j in ids.replay], replayed
        )
        pos = _without(pos, ids.replay)
        gone = set(ids.replay)
        seqs = [s for j, s in enumerate(seqs) if j not in gone]
    n = len(pos)
    if not n:
        return []
    cum_at: Callable[[int], int]
    body_of: Callable[[int, int], list[Any]]
    if cols.arrow:
        buf, offsets = encode_parts(cols, pos)
        offs: list[int] = offsets.tolist()
        cum_at = offs.__getitem__

        def body_of(s: int, e: int) -> list[Any]:
            return [buf[offs[s] : offs[e]]]
    else:
        vals = _take(cols.values, pos)
        keys = None if cols.keys is None else _take(cols.keys, pos)
        cum: list[int] = list(itertools.accumulate(_take(cols.sizes, pos), initial=0))

        def cum_at(e: int) -> int:
            return cum[e] + RECORD_OVERHEAD * e

        def body_of(s: int, e: int) -> list[Any]:
            return encode_list(vals[s:e], None if keys is None else keys[s:e])

    bounds = chunk_bounds(
        cum_at,
        n,
        body_max=limits.bytes_max - protocol.BATCH_HEADER_SIZE,
        records_max=limits.records_max,
        breaks=ids.breaks if ids is not None else (),
    )
    runs: list[ProducerBatch] = []
    for s, e in bounds:
        slot = tracker.add(pos[s:e])
        first_seq = -1 if seqs is None else seqs[s]
        runs.append(EncodedBatch(now_ms, first_seq, e - s, body_of(s, e), tracker, slot))
    return runs
