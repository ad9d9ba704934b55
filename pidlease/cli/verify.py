"""The exactly-once audit of a topic (``pidlease verify``): read every partition and check,
for each producer id, that its records appear once each and in sequence order.

Per partition and PID the audit keeps the sequences seen as sorted runs ``[first, last]``
(a producer writes in order, so that is one run, appended to in O(1), however many
records). From them it counts:

- duplicates: a (pid, sequence) seen twice;
- out of order: a sequence lower than one already seen for that PID, and not a duplicate;
- gaps (strict topics only; monotonic topics allow holes): sequences missing between a
  PID's first and last sequence in the partition;
- acked but missing (with ``acked``): acknowledged (partition, pid, sequence) triples that
  are not in the log.

Records of PID 0 (not idempotent) and control records are counted but not checked.
The topic is exactly-once when every count is 0.

What it cannot see (the report says so under its verdict): it knows ids, not data. A row
the application never sent, or one row sent under two ids (two producers, or two
sequences), looks like clean records. Only a comparison with the input by content tells
(``pidlease-spark audit --against INPUT``), or ``--acked`` for what a producer was told
was written.

Records a Kafka producer wrote (docs/kafka.md) number their sequences per epoch, from 0
at each epoch the client starts, wrapping after 2**31 - 1: the audit checks each
(PID, epoch) as a producer of its own, its sequences unwrapped.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pidlease.client.reader import Reader
from pidlease.wire.protocol import KAFKA_GENERATION_BASE, Record

EXAMPLES_MAX = 5
_KAFKA_WRAP = 2**31
# (pid) for our producers, (pid, Kafka epoch) for Kafka's: one stream of sequences each.
StreamKey = int | tuple[int, int]


SCOPE = (
    "(checked: each (pid, sequence) once, in order per partition, no hole on a strict "
    "topic. Not checked: that every row of the data was sent, nor that a row was not "
    "sent under two ids; compare with the input for that: pidlease-spark audit --against)"
)


class Runs:
    """Sorted, disjoint, non-adjacent runs of integers."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __contains__(self, x: int) -> bool:
        i = bisect_right(self.starts, x) - 1
        return i >= 0 and x <= self.ends[i]

    def add(self, x: int) -> bool:
        """Add ``x``; False when it was already there."""
        if self.ends and x == self.ends[-1] + 1:  # the usual case: the next in order
            self.ends[-1] = x
            return True
        i = bisect_right(self.starts, x) - 1
        if i >= 0 and x <= self.ends[i]:
            return False
        joins_left = i >= 0 and self.ends[i] == x - 1
        joins_right = i + 1 < len(self.starts) and self.starts[i + 1] == x + 1
        if joins_left and joins_right:
            self.ends[i] = self.ends[i + 1]
            del self.starts[i + 1], self.ends[i + 1]
        elif joins_left:
            self.ends[i] = x
        elif joins_right:
            self.starts[i + 1] = x
        else:
            self.starts.insert(i + 1, x)
            self.ends.insert(i + 1, x)
        return True

    @property
    def count(self) -> int:
        return sum(e - s + 1 for s, e in zip(self.starts, self.ends, strict=True))

    def missing(self) -> int:
        """Numbers absent between the first and the last."""
        if not self.starts:
            return 0
        return (self.ends[-1] - self.starts[0] + 1) - self.count


@dataclass
class PartitionAudit:
    partition: int
    records: int = 0
    unchecked_records: int = 0  # PID 0
    duplicates: int = 0
    out_of_order: int = 0
    gaps: int = 0
    acked: int = 0
    acked_missing: int = 0
    runs: dict[StreamKey, Runs] = field(default_factory=dict)
    max_seq: dict[StreamKey, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def example(self, text: str) -> None:
        if len(self.examples) < EXAMPLES_MAX:
            self.examples.append(f"partition {self.partition}: {text}")

    def add(self, rec: Record) -> None:
        self.records += 1
        if rec.pid == 0:
            self.unchecked_records += 1
            return
        key: StreamKey = rec.pid
        seq = rec.sequence_id
        if rec.generation >= KAFKA_GENERATION_BASE:
            key = (rec.pid, rec.generation - KAFKA_GENERATION_BASE)
        runs = self.runs.get(key)
        if runs is None:
            runs = self.runs[key] = Runs()
        top = self.max_seq.get(key, -1)
        if isinstance(key, tuple):
            # Unwrap: a sequence far below the top's (mod 2**31) is past a wrap.
            wraps = max(top, 0) // _KAFKA_WRAP
            if seq < top % _KAFKA_WRAP - _KAFKA_WRAP // 2:
                wraps += 1
            seq += wraps * _KAFKA_WRAP
        if not runs.add(seq):
            self.duplicates += 1
            self.example(f"pid {key} sequence {seq} appears again at offset {rec.offset}")
        elif seq < top:
            self.out_of_order += 1
            self.example(
                f"pid {key} sequence {seq} at offset {rec.offset} comes after sequence {top}"
            )
        if seq > top:
            self.max_seq[key] = seq

    @property
    def pids(self) -> int:
        return len({k[0] if isinstance(k, tuple) else k for k in self.runs})


@dataclass
class AuditReport:
    topic: str
    dedup: str
    partitions: list[PartitionAudit]
    acked_given: bool = False

    def total(self, attr: str) -> int:
        return sum(getattr(p, attr) for p in self.partitions)

    @property
    def pids(self) -> int:
        return len({k[0] if isinstance(k, tuple) else k for p in self.partitions for k in p.runs})

    @property
    def ok(self) -> bool:
        bad = self.total("duplicates") + self.total("out_of_order") + self.total("acked_missing")
        if self.dedup == "strict":
            bad += self.total("gaps")
        return bad == 0

    def summary(self) -> str:
        lines = [
            f"verify topic {self.topic!r}: {len(self.partitions)} partitions, dedup {self.dedup}"
        ]
        for p in self.partitions:
            line = (
                f"  partition {p.partition}: {p.records} records, {p.pids} PIDs, "
                f"{p.duplicates} duplicates, {p.out_of_order} out of order, {p.gaps} gaps"
            )
            if self.acked_given:
                line += f", acked {p.acked}, missing {p.acked_missing}"
            lines.append(line)
        totals = (
            f"{self.total('records')} records from {self.pids} PIDs, "
            f"{self.total('duplicates')} duplicates, {self.total('out_of_order')} out of order, "
            f"{self.total('gaps')} gaps"
        )
        if self.acked_given:
            acked = self.total("acked")
            missing = self.total("acked_missing")
            totals += f"; acked {acked}, present {acked - missing}, missing {missing}"
        if self.dedup != "strict" and self.total("gaps"):
            totals += f" (gaps are allowed: dedup {self.dedup})"
        if self.ok:
            lines.append(f"EXACTLY-ONCE: OK - {totals}")
        else:
            lines.append(f"EXACTLY-ONCE: VIOLATED - {totals}")
            for p in self.partitions:
                lines.extend(f"  {e}" for e in p.examples)
        lines.append(SCOPE)
        return "\n".join(lines)


def load_acked(path: str | Path) -> list[tuple[int, int, int]]:
    """(partition, pid, sequence_id) triples from a JSON-lines file of
    ``{"partition": P, "pid": X, "sequence_id": S}``."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append((int(row["partition"]), int(row["pid"]), int(row["sequence_id"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise errors.ConfigError(
                    f'{path} line {n}: expected {{"partition", "pid", "sequence_id"}}: {exc}'
                ) from exc
    return out


def audit(
    topic: str,
    partitions: int,
    dedup: str,
    read: Callable[[int], Iterator[Record]],
    acked: Iterable[tuple[int, int, int]] | None = None,
) -> AuditReport:
    """The audit over any source of records: ``read(partition)`` yields its records."""
    report = AuditReport(
        topic, dedup, [PartitionAudit(p) for p in range(partitions)], acked_given=acked is not None
    )
    for pa in report.partitions:
        for rec in read(pa.partition):
            if not rec.is_control:
                pa.add(rec)
        if dedup == "strict":
            pa.gaps = sum(r.missing() for r in pa.runs.values())
            for pid, r in pa.runs.items():
                if r.missing():
                    pa.example(
                        f"pid {pid} has {r.missing()} sequences missing between "
                        f"{r.starts[0]} and {r.ends[-1]}"
                    )
    for partition, pid, seq in acked or ():
        if not 0 <= partition < partitions:
            raise errors.ConfigError(
                f"acked record names partition {partition}; topic {topic!r} has 0..{partitions - 1}"
            )
        pa = report.partitions[partition]
        pa.acked += 1
        runs = pa.runs.get(pid)
        if runs is None or seq not in runs:
            pa.acked_missing += 1
            pa.example(f"acked pid {pid} sequence {seq} is not in the log")
    return report


def verify_topic(
    coordinator_url: str,
    topic: str,
    *,
    acked: Iterable[tuple[int, int, int]] | None = None,
    api_token: str | None = None,
) -> AuditReport:
    """Audit a live topic: every partition read from its leader to the end."""
    with LeaseClient(coordinator_url, api_token=api_token) as client:
        info = client.topic(topic)

    def read(partition: int) -> Iterator[Record]:
        with Reader(coordinator_url, topic, partition, 0, api_token=api_token) as rd:
            yield from rd

    return audit(topic, info.partitions, info.dedup, read, acked)
