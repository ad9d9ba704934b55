"""The scan (pidlease/spark/scan.py): the Spark source's read of records a Kafka producer
wrote: their generation (a Kafka epoch maps above 2**31 - 1, docs/kafka.md) fits the
``generation`` column, and keys, values, sequences and timestamps come through. The Reader
is replaced by one that yields the records of a stored Kafka batch (the Reader's own reading
of both formats is in tests/unit/wire/test_kafka_batch.py and
tests/integration/test_kafka_log_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P

scan = pytest.importorskip("pidlease.spark.scan")


def kafka_records() -> list[P.Record]:
    raw = bytearray(
        K.encode_kafka_batch(
            [(b"k0", b"v0"), (None, b"v1")],
            producer_id=5,
            producer_epoch=7,
            base_sequence=2**31 - 1,
            base_timestamp_ms=1_700_000_000_000,
        )
    )
    P.set_base_offset(raw, 10)
    h = P.decode_batch_header(bytes(raw))
    return list(P.iter_records(bytes(raw), h, 0, "t", 0))


class FakeReader:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> Iterator[P.Record]:
        return iter(kafka_records())

    def __exit__(self, *exc: object) -> None:
        pass


def test_scan_reads_kafka_records_with_their_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "Reader", FakeReader)
    from pidlease.spark.options import ReadSettings

    s = scan.Scan(ReadSettings(coordinator="http://127.0.0.1:1", topic="t"))
    [batch] = list(s.read(scan.OffsetRange(0, 10, 12)))
    rows = batch.to_pylist()
    assert [(r["offset"], r["key"], r["value"], r["sequence_id"]) for r in rows] == [
        (10, b"k0", b"v0", 2**31 - 1),
        (11, None, b"v1", 0),
    ]
    assert {r["generation"] for r in rows} == {P.KAFKA_GENERATION_BASE + 7}
    assert {r["pid"] for r in rows} == {5}
