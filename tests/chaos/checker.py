"""The chaos suite's end-of-run check: read every partition and compare the log with what
the producers were told.

Pure logic (``check``) apart from I/O (``read_topic``), so the checker itself is unit
tested on synthetic logs with a duplicate, a gap, a reordering and a zombie write
(tests/chaos/test_checker.py): a checker that cannot fail proves nothing.

Violations counted, per run:

- ``acked_missing``: a send resolved OK (or DUPLICATE) whose (partition, pid, sequence)
  is not in the log, or is there at another offset than the one acknowledged;
- ``duplicated``: a (partition, pid, sequence) present more than once;
- ``out_of_order``: a PID's sequences in one partition not strictly increasing by offset;
- ``gaps``: sequences missing between a PID's first and last in a partition (strict);
- ``zombie_writes``: a record written by a producer after it was fenced by a takeover
  (its value carries ``ZOMBIE_MARK``), or any record of an older generation of a PID at
  an offset after that PID's fence in the partition.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pidlease.wire.protocol import Record

ZOMBIE_MARK = b"zombie-after-fence:"
EXAMPLES_MAX = 5


class LogRecord(Protocol):
    @property
    def offset(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def sequence_id(self) -> int: ...
    @property
    def value(self) -> bytes: ...


@dataclass(frozen=True)
class Acked:
    """What a producer was told: this (pid, sequence) is at ``offset`` in ``partition``
    (offset -1 when a DUPLICATE answer no longer knew it)."""

    partition: int
    pid: int
    sequence_id: int
    offset: int


@dataclass(frozen=True)
class Fence:
    """A takeover of ``pid`` to ``generation`` returned: from then on, no record of an
    older generation may be appended. ``offsets`` is each partition's log end offset
    read after the takeover returned (records at or beyond it came later)."""

    pid: int
    generation: int
    offsets: dict[int, int]


@dataclass
class CheckReport:
    records: int = 0
    acked: int = 0
    acked_missing: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    gaps: int = 0
    zombie_writes: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.acked_missing
            or self.duplicated
            or self.out_of_order
            or self.gaps
            or self.zombie_writes
        )

    def note(self, what: str) -> None:
        if len(self.examples) < EXAMPLES_MAX:
            self.examples.append(what)

    def summary(self) -> str:
        head = "OK" if self.ok else "VIOLATIONS"
        text = (
            f"{head}: records {self.records}, acked {self.acked}, acked-but-missing "
            f"{self.acked_missing}, duplicated {self.duplicated}, out-of-order "
            f"{self.out_of_order}, gaps {self.gaps}, zombie writes {self.zombie_writes}"
        )
        return text + "".join(f"\n  e.g. {e}" for e in self.examples)


def check(
    partitions: Mapping[int, Sequence[LogRecord]],
    acked: Iterable[Acked],
    fences: Iterable[Fence] = (),
    *,
    strict: bool = True,
) -> CheckReport:
    """Check the logs (records of each partition in offset order) against ``acked``."""
    rep = CheckReport()
    where: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    fence_list = list(fences)
    for part, recs in partitions.items():
        last_seq: dict[int, int] = {}
        seqs: dict[int, set[int]] = defaultdict(set)
        for r in recs:
            rep.records += 1
            if r.value.startswith(ZOMBIE_MARK):
                rep.zombie_writes += 1
                rep.note(f"zombie record at {part}/{r.offset}: {r.value[:60]!r}")
            for f in fence_list:
                if (
                    r.pid == f.pid
                    and r.generation < f.generation
                    and r.offset >= f.offsets.get(part, 1 << 62)
                ):
                    rep.zombie_writes += 1
                    rep.note(
                        f"generation {r.generation} of pid {r.pid} at {part}/{r.offset} "
                        f"after the fence to {f.generation}"
                    )
            if r.pid == 0:
                continue
            key = (part, r.pid, r.sequence_id)
            where[key].append(r.offset)
            if len(where[key]) > 1:
                rep.duplicated += 1
                rep.note(
                    f"pid {r.pid} seq {r.sequence_id} in partition {part} at offsets {where[key]}"
                )
            elif r.pid in last_seq and r.sequence_id < last_seq[r.pid]:
                rep.out_of_order += 1
                rep.note(
                    f"pid {r.pid} seq {r.sequence_id} after {last_seq[r.pid]} at {part}/{r.offset}"
                )
            last_seq[r.pid] = max(r.sequence_id, last_seq.get(r.pid, -1))
            seqs[r.pid].add(r.sequence_id)
        if strict:
            for pid, s in seqs.items():
                missing = (max(s) - min(s) + 1) - len(s)
                if missing:
                    rep.gaps += missing
                    rep.note(f"pid {pid} partition {part}: {missing} sequences missing")
    seen_acks: Counter[tuple[int, int, int]] = Counter()
    for a in acked:
        rep.acked += 1
        key = (a.partition, a.pid, a.sequence_id)
        seen_acks[key] += 1
        offsets = where.get(key)
        if not offsets or (a.offset >= 0 and a.offset not in offsets):
            rep.acked_missing += 1
            rep.note(
                f"acked pid {a.pid} seq {a.sequence_id} partition {a.partition} offset "
                f"{a.offset}: found at {offsets or 'nowhere'}"
            )
    return rep


def read_topic(coordinator_url: str, topic: str, partitions: int) -> dict[int, list[Record]]:
    """Every record of every partition, in offset order, through the SDK's Reader."""
    from pidlease.client.reader import Reader

    out: dict[int, list[Record]] = {}
    for part in range(partitions):
        out[part] = list(Reader(coordinator_url, topic, part, retry_timeout_ms=60_000))
    return out
