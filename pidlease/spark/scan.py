"""The read side of the data source: ``spark.read.format("pidlease")``.

Planning (on the driver) asks the coordinator for the topic's partitions and each one's
high watermark, and cuts ``[0, high watermark)`` of every partition into offset ranges of
at most ``split_records`` records: one Spark partition per range, so a big topic partition
is read by several tasks at once. Records appended after planning are not read: a batch
read is a snapshot. A partition whose watermark the coordinator could not learn is read
in one range to its end.

Each task fetches its range from the partition's leader with the SDK's ``Reader``
(checksums checked, control records skipped) and hands Spark Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from pidlease.client.lease_client import LeaseClient
from pidlease.client.reader import Reader
from pidlease.spark.options import ReadSettings
from pidlease.wire.protocol import Record

SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, pid BIGINT, generation BIGINT, "
    "sequence_id BIGINT, key BINARY, value BINARY, timestamp TIMESTAMP"
)
ARROW_BATCH_RECORDS = 8192


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition; ``end`` -1: to the end."""

    partition: int
    start: int
    end: int


def plan_ranges(high_watermarks: Sequence[int], split_records: int) -> list[OffsetRange]:
    """Ranges covering every partition (watermark -1: unknown, one open range)."""
    out: list[OffsetRange] = []
    for p, end in enumerate(high_watermarks):
        if end < 0:
            out.append(OffsetRange(p, 0, -1))
            continue
        for start in range(0, end, split_records):
            out.append(OffsetRange(p, start, min(start + split_records, end)))
    if not out:  # an empty topic still needs one (empty) task
        out.append(OffsetRange(0, 0, 0))
    return out


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("pid", pa.int64()),
            ("generation", pa.int64()),  # Kafka epochs map above 2**31 (docs/kafka.md)
            ("sequence_id", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )


class ArrowRecords:
    """Records of one topic partition gathered into Arrow batches of ``_arrow_schema``: the
    batch read's and the stream read's one copy."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.schema = _arrow_schema()
        self.offsets: list[int] = []
        self.pids: list[int] = []
        self.gens: list[int] = []
        self.seqs: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes] = []
        self.stamps: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, rec: Record) -> bool:
        """Gather ``rec``; True once a batch's worth (``ARROW_BATCH_RECORDS``) is held."""
        self.offsets.append(rec.offset)
        self.pids.append(rec.pid)
        self.gens.append(rec.generation)
        self.seqs.append(rec.sequence_id)
        self.keys.append(rec.key)
        self.values.append(rec.value)
        self.stamps.append(rec.timestamp_ms * 1000)
        return len(self.offsets) >= ARROW_BATCH_RECORDS

    def batch(self) -> Any:
        """The records gathered, as one Arrow record batch; the buffers start empty again."""
        import pyarrow as pa

        n = len(self.offsets)
        arrays = [
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.pids, pa.int64()),
            pa.array(self.gens, pa.int64()),
            pa.array(self.seqs, pa.int64()),
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array(self.stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        ]
        for column in (self.offsets, self.pids, self.gens, self.seqs, self.stamps):
            column.clear()
        self.keys.clear()
        self.values.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


class Scan(DataSourceReader):
    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings

    def partitions(self) -> Sequence[InputPartition]:
        with LeaseClient(self.settings.coordinator, api_token=self.settings.api_token) as client:
            info = client.topic(self.settings.topic)
        marks = {p.partition: p.high_watermark for p in info.partition_states}
        return plan_ranges(
            [marks.get(p, -1) for p in range(info.partitions)], self.settings.split_records
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        if partition.end == partition.start:
            return
        topic, p, end = self.settings.topic, partition.partition, partition.end
        out = ArrowRecords(topic, p)
        with Reader(
            self.settings.coordinator, topic, p, partition.start, api_token=self.settings.api_token
        ) as reader:
            for rec in reader:
                if 0 <= end <= rec.offset:
                    break
                if out.add(rec):
                    yield out.batch()
        if out:
            yield out.batch()
