"""How to store Kafka producers' batches, measured (docs/kafka.md, "On-disk format").

(a) as sent: a Produce's RecordBatch v2 is validated (header, CRC-32C, the records' length
    prefixes) and written to the segment byte for byte (base offset filled in); a Kafka
    Fetch copies the stored batches out as they are.
(b) converted: a Produce's batch is validated the same way, its records parsed and
    re-encoded as one of our batches (CRC-32), and written; a Kafka Fetch converts each
    stored batch back to RecordBatch v2.
(ours) for scale: the same records as our own batches on our PRODUCE path
    (``validate_batch`` + append) and our FETCH (the stored bytes as they are).

CPU time (process time, best of ``--repeat``) per record, in microseconds, of the produce
path (validate + convert if any + log append to a segment in a temporary directory, page
cache only: no fsync, which both pay alike) and of the fetch path (log read of the same
batches + what Kafka consumers need), for 100-byte values with an 8-byte key, batches of
1, 100 and 1000 records. Single process, no server, no sockets: only what differs.

    PYTHONPATH=. python bench/bench_kafka_format.py [--repeat 5] [--records 20000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from partition_server.log import PartitionLog
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P

VALUE = b"v" * 100
SIZES = (1, 100, 1000)


def kafka_batches(per_batch: int, total: int) -> list[bytes]:
    out = []
    seq = 0
    for _ in range(max(1, total // per_batch)):
        recs = [(f"k{seq + i:07d}".encode(), VALUE) for i in range(per_batch)]
        out.append(
            K.encode_kafka_batch(
                recs,
                producer_id=42,
                producer_epoch=0,
                base_sequence=seq,
                base_timestamp_ms=1_700_000_000_000,
            )
        )
        seq += per_batch
    return out


def our_batches(per_batch: int, total: int) -> list[bytes]:
    out = []
    seq = 0
    for _ in range(max(1, total // per_batch)):
        recs = [(f"k{seq + i:07d}".encode(), VALUE) for i in range(per_batch)]
        out.append(P.encode_batch(recs, pid=42, generation=1, base_sequence=seq, timestamp_ms=1))
        seq += per_batch
    return out


def kafka_to_native(raw: bytes, h: P.BatchHeader) -> bytes:
    """(b)'s produce-side conversion: every record parsed and re-encoded as ours."""
    parts = [P.encode_record(r.key, r.value) for r in P.iter_records(raw, h, 0)]
    return P.batch_from_parts(
        parts,
        h.count,
        pid=h.pid,
        generation=P.kafka_epoch(h) + 1,  # any generation of ours: what is measured is CPU
        base_sequence=h.base_sequence,
        timestamp_ms=h.timestamp_ms,
    )


def produce(log: PartitionLog, batches: list[bytes], convert: bool | None) -> None:
    if convert is None:  # ours: SDK batches through our PRODUCE path
        for raw in batches:
            h = P.validate_batch(raw)
            out = bytearray(raw)
            P.set_base_offset(out, log.next_offset)
            log.append(out, h.count)
        return
    for raw in batches:
        h = K.validate_kafka_batch(raw)
        out = bytearray(kafka_to_native(raw, h) if convert else raw)
        P.set_base_offset(out, log.next_offset)
        log.append(out, h.count)


def fetch(log: PartitionLog, max_bytes: int, kafka: bool = True) -> int:
    """Read the whole log as a Kafka consumer would (``max_bytes`` a fetch) and convert:
    stored Kafka batches are copied, ours converted per record (``kafka`` False: as our
    FETCH serves them, no conversion). Returns records read."""
    offset = 0
    n = 0
    while offset < log.next_offset:
        chunks = log.read(offset, max_bytes, log.next_offset)
        data = K.native_to_kafka(chunks) if kafka else b"".join(chunks)
        for h, _ in P.iter_batches(data, check_crc=False):
            offset = h.base_offset + h.count
            n += h.count
    return n


def best(repeat: int, fn: Callable[[], None]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def measure(per_batch: int, total: int, repeat: int) -> dict[str, float]:
    batches = kafka_batches(per_batch, total)
    n = per_batch * len(batches)
    out: dict[str, float] = {}
    runs: tuple[tuple[str, bool | None, list[bytes]], ...] = (
        ("a", False, batches),
        ("b", True, batches),
        ("n", None, our_batches(per_batch, total)),
    )
    for name, convert, batches in runs:
        with tempfile.TemporaryDirectory() as d:
            logs: list[PartitionLog] = []

            def run_produce(
                convert: bool | None = convert,
                d: str = d,
                logs: list[PartitionLog] = logs,
                batches: list[bytes] = batches,
            ) -> None:
                sub = Path(d) / f"p{len(logs)}"
                sub.mkdir()
                lg, _ = PartitionLog.open(sub, 1 << 30)
                logs.append(lg)
                produce(lg, batches, convert)

            out[f"{name}_produce"] = best(repeat, run_produce) / n * 1e6
            last = logs[-1]

            def run_fetch(last: PartitionLog = last, kafka: bool = convert is not None) -> None:
                assert fetch(last, 1 << 20, kafka) == n

            out[f"{name}_fetch"] = best(repeat, run_fetch) / n * 1e6
            for lg in logs:
                lg.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--records", type=int, default=20_000, help="records per measurement")
    args = ap.parse_args()
    print("CPU microseconds per record (100 B values, 8 B keys; best of", args.repeat, "runs)")
    print(
        f"{'records/batch':>13} | {'(a) produce':>11} {'(b) produce':>11} | "
        f"{'(a) fetch':>9} {'(b) fetch':>9} | {'(a) total':>9} {'(b) total':>9} | "
        f"{'ours prod':>9} {'ours fetch':>10}"
    )
    for size in SIZES:
        m = measure(size, max(args.records, size), args.repeat)
        ta, tb = m["a_produce"] + m["a_fetch"], m["b_produce"] + m["b_fetch"]
        print(
            f"{size:>13} | {m['a_produce']:>11.2f} {m['b_produce']:>11.2f} | "
            f"{m['a_fetch']:>9.2f} {m['b_fetch']:>9.2f} | {ta:>9.2f} {tb:>9.2f} | "
            f"{m['n_produce']:>9.2f} {m['n_fetch']:>10.2f}"
        )


if __name__ == "__main__":
    main()
