"""Micro-benchmark of ``protocol.validate_batch``: the per-record walk it used to do for
every batch against the current version (strided fast path for uniform records, the walk
otherwise). Single process, no server; prints the best-of-``--repeat`` microseconds per
batch for each shape, with the batch passed as a memoryview as the partition server does.

    .venv/bin/python bench/bench_validate.py [--repeat 7] [--number 2000]
"""

from __future__ import annotations

import argparse
import random
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pidlease.errors import CorruptRecord
from pidlease.wire import protocol as P


def old_validate_batch(buf, pos=0, *, max_bytes=None):
    """validate_batch before the fast path (the same copy the differential test in
    tests/unit/wire/test_protocol_fastpath.py uses as its oracle)."""
    h = P.decode_batch_header(buf, pos)
    if h.batch_len < P.BATCH_HEADER_SIZE - 12:
        raise CorruptRecord(f"batch_len {h.batch_len} is shorter than a header")
    if max_bytes is not None and h.size > max_bytes:
        raise CorruptRecord(f"batch of {h.size} bytes is over the limit of {max_bytes}")
    if pos + h.size > len(buf):
        raise CorruptRecord(f"batch says {h.size} bytes but only {len(buf) - pos} arrived")
    if not P.batch_crc_ok(buf, h, pos):
        raise CorruptRecord("batch checksum mismatch")
    if h.count < 1:
        raise CorruptRecord(f"batch record count must be >= 1, got {h.count}")
    if h.generation > P.MAX_GENERATION:
        raise CorruptRecord(f"generation {h.generation} is over 2**31-1")
    if h.pid > P.MAX_PID:
        raise CorruptRecord(f"pid {h.pid} is over 2**63-1")
    if h.is_control:
        if h.count != 1 or h.base_sequence != -1:
            raise CorruptRecord("a control batch holds one record and no sequence")
    elif h.base_sequence < 0 or h.base_sequence + h.count - 1 > P.MAX_SEQUENCE:
        raise CorruptRecord(f"base_sequence {h.base_sequence} out of range")
    end = pos + h.size
    p = pos + P.BATCH_HEADER_SIZE
    for _ in range(h.count):
        if p + 8 > end:
            raise CorruptRecord("record header runs past the batch")
        klen, vlen = P._REC_HEAD.unpack_from(buf, p)  # noqa: SLF001 - the reference reads the same struct
        p += 8 + max(klen, 0) + vlen
        if klen < -1 or p > end:
            raise CorruptRecord("record runs past the batch")
    if p != end:
        raise CorruptRecord(f"{end - p} bytes after the last record of the batch")
    return h


def shapes() -> dict[str, list[tuple[bytes | None, bytes]]]:
    rnd = random.Random(7)
    return {
        "1000 x 100 B, no key": [(None, rnd.randbytes(100)) for _ in range(1000)],
        "1000 x 1 KiB, 16 B key": [(rnd.randbytes(16), rnd.randbytes(1024)) for _ in range(1000)],
        # sizes differ record to record: the fast path gives up after one length check
        "1000 x 0-200 B, mixed keys": [
            (
                rnd.choice([None, b"", rnd.randbytes(rnd.randint(1, 16))]),
                rnd.randbytes(rnd.randint(0, 200)),
            )
            for _ in range(1000)
        ],
        # same total size, headers differ: the worst case (8 slices, then the walk)
        "1000 x 100 B, key/value split varies": [
            (b"k" * (i % 5), rnd.randbytes(100 - i % 5)) for i in range(1000)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=2000)
    args = ap.parse_args()
    print(f"{'batch':40} {'old us':>8} {'new us':>8} {'speedup':>8}")
    for name, records in shapes().items():
        batch = memoryview(
            P.encode_batch(records, pid=1, generation=1, base_sequence=0, timestamp_ms=0)
        )
        assert old_validate_batch(batch) == P.validate_batch(batch)
        per = {}
        for label, fn in (("old", old_validate_batch), ("new", P.validate_batch)):
            best = min(
                timeit.repeat(
                    lambda fn=fn, batch=batch: fn(batch), number=args.number, repeat=args.repeat
                )
            )
            per[label] = best / args.number * 1e6
        print(f"{name:40} {per['old']:8.1f} {per['new']:8.1f} {per['old'] / per['new']:7.1f}x")
    crc = min(timeit.repeat(lambda: P.zlib.crc32(batch), number=args.number, repeat=args.repeat))
    print(f"(CRC-32 alone of the last batch: {crc / args.number * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
