"""Producer state of one partition and the append rules that use it (CONTRACT "Append
rules"). Pure: no I/O and no clock of its own; callers pass ``now_ms`` and offsets.

Per PID we keep the generation, the highwater H (last sequence appended), the durable
highwater (last sequence fsynced), the last K batches (for DUPLICATE answers with the
offsets they were first written at) and the last-use time. The table is an OrderedDict in
last-use order, so PID expiry pops from the front (the seed's "expired from one end").

Checking and applying are split: the partition checks a batch, writes it to its log only on
APPEND, then applies it here with the offset it got. Replaying the log after a restart goes
through the same ``apply_*`` methods, so a recovered table is the table before the crash.
"""

from __future__ import annotations

import enum
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

DEDUP_MODES = ("strict", "monotonic", "off")


class Outcome(enum.Enum):
    APPEND = "APPEND"
    DUPLICATE = "DUPLICATE"
    FENCED = "FENCED"
    UNKNOWN_PID = "UNKNOWN_PID"
    SEQUENCE_UNKNOWN = "SEQUENCE_UNKNOWN"
    OUT_OF_ORDER = "OUT_OF_ORDER_SEQUENCE"


class FenceOutcome(enum.Enum):
    APPEND = "APPEND"           # write a control batch, answer when durable
    SAME = "SAME"               # generation already current: OK, nothing written
    ABSENT = "ABSENT"           # no state and no create_if_absent: OK existed=false
    FENCED = "FENCED"           # older generation


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    expected_sequence: int = -1
    base_offset: int = -1       # DUPLICATE: where the batch was first written, when known
    last_offset: int = -1
    detail: str = ""


class ProducerEntry:
    """One PID's state in one partition. Slots keep the per-PID memory small (1M PIDs)."""

    __slots__ = (
        "batches",
        "durable_highwater",
        "generation",
        "highwater",
        "last_use_ms",
        "pending",
    )

    def __init__(self, generation: int, highwater: int, durable_highwater: int,
                 last_use_ms: int) -> None:
        self.generation = generation
        self.highwater = highwater
        self.durable_highwater = durable_highwater
        # (base_seq, last_seq, base_offset) of the last K data batches, oldest first, as
        # flat triples in an int64 array: no int objects, ~5x less memory than tuples.
        self.batches = array("q")
        self.last_use_ms = last_use_ms
        # (last_offset, last_seq) of appended batches not yet fsynced, oldest first.
        self.pending: list[tuple[int, int]] | None = None


# One row of a snapshot: pid, generation, highwater, last_use_ms, and the last K batches
# as flat (base_seq, last_seq, base_offset) triples.
Row = tuple[int, int, int, int, "array[int]"]


class ProducerStateTable:
    """Producer state of one partition. ``mode`` is the topic's dedup mode."""

    def __init__(self, *, mode: str = "strict", batches_kept: int = 5,
                 pids_max: int = 1_000_000) -> None:
        if mode not in DEDUP_MODES:
            raise ValueError(f"dedup mode must be one of {DEDUP_MODES}, not {mode!r}")
        self.mode = mode
        self.batches_kept = batches_kept
        self.pids_max = pids_max
        self.entries: OrderedDict[int, ProducerEntry] = OrderedDict()
        self._pending_pids: dict[int, None] = {}
        self.expired_total = 0
        self.evicted_total = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, pid: int) -> ProducerEntry | None:
        return self.entries.get(pid)

    def tracks(self, pid: int) -> bool:
        """Whether appends of ``pid`` are checked (and so tracked) here."""
        return pid != 0 and self.mode != "off"

    # -- append rules ----------------------------------------------------------------------
    def check_append(self, pid: int, generation: int, base_seq: int, count: int) -> Decision:
        if not self.tracks(pid):
            return _APPEND
        last_seq = base_seq + count - 1
        e = self.entries.get(pid)
        if e is None:
            if self.mode == "monotonic" or base_seq == 0:
                return _APPEND
            return Decision(Outcome.UNKNOWN_PID, detail=(
                f"pid {pid} has no state in this partition and its batch starts at sequence "
                f"{base_seq}, not 0: the state expired or the PID was never leased here"))
        if generation < e.generation:
            return Decision(Outcome.FENCED, detail=(
                f"generation {generation} of pid {pid} is older than the current {e.generation}"))
        h = e.highwater
        if base_seq == h + 1 or (self.mode == "monotonic" and base_seq > h):
            return _APPEND
        if last_seq <= e.durable_highwater:
            b = e.batches
            for i in range(0, len(b), 3):
                if b[i] == base_seq and b[i + 1] == last_seq:
                    return Decision(Outcome.DUPLICATE, base_offset=b[i + 2],
                                    last_offset=b[i + 2] + count - 1,
                                    detail="batch was already written")
            return Decision(Outcome.DUPLICATE, detail="batch was already written (offsets no "
                            "longer known)")
        if last_seq <= h:
            return Decision(Outcome.SEQUENCE_UNKNOWN, expected_sequence=h + 1, detail=(
                f"sequences {base_seq}..{last_seq} are appended but not yet durable; retry"))
        return Decision(Outcome.OUT_OF_ORDER, expected_sequence=h + 1, detail=(
            f"batch has sequences {base_seq}..{last_seq}, expected {h + 1} next"))

    def check_fence(self, pid: int, generation: int, create_if_absent: bool) -> FenceOutcome:
        if not self.tracks(pid):
            return FenceOutcome.ABSENT  # dedup off: no generations to fence
        e = self.entries.get(pid)
        if e is None:
            return FenceOutcome.APPEND if create_if_absent else FenceOutcome.ABSENT
        if generation < e.generation:
            return FenceOutcome.FENCED
        if generation == e.generation:
            return FenceOutcome.SAME
        return FenceOutcome.APPEND

    # -- applying what was written (live appends and log replay) ---------------------------
    def apply_append(self, pid: int, generation: int, base_seq: int, count: int,
                     base_offset: int, now_ms: int, *, durable: bool = False) -> None:
        if not self.tracks(pid):
            return
        last_seq = base_seq + count - 1
        e = self._entry_for_write(pid, generation, now_ms)
        b = e.batches
        if b and base_offset <= b[-1]:
            # Already applied: replay over a snapshot whose rows were captured while
            # appends went on starts at the capture's first offset. Makes replay idempotent.
            return
        e.generation = max(e.generation, generation)
        e.highwater = last_seq
        b.append(base_seq)
        b.append(last_seq)
        b.append(base_offset)
        if len(b) > 3 * self.batches_kept:
            del b[:3]
        if durable:
            e.durable_highwater = last_seq
        else:
            if e.pending is None:
                e.pending = []
                self._pending_pids[pid] = None
            e.pending.append((base_offset + count - 1, last_seq))

    def apply_fence(self, pid: int, generation: int, now_ms: int) -> None:
        if self.mode == "off" or pid == 0:
            return
        e = self._entry_for_write(pid, generation, now_ms)
        e.generation = max(e.generation, generation)

    def _entry_for_write(self, pid: int, generation: int, now_ms: int) -> ProducerEntry:
        e = self.entries.get(pid)
        if e is None:
            if len(self.entries) >= self.pids_max:
                self._evict_one()
            e = ProducerEntry(generation, -1, -1, now_ms)
            self.entries[pid] = e
        else:
            self._touch(pid, e, now_ms)
        return e

    def _evict_one(self) -> None:
        # The bound on tracked PIDs: drop the least recently used idle PID. Its producer
        # then gets UNKNOWN_PID (strict), never a silent duplicate.
        for pid, e in self.entries.items():
            if e.pending is None:
                del self.entries[pid]
                self.evicted_total += 1
                return

    def mark_durable(self, end_offset: int) -> None:
        """Every offset below ``end_offset`` is fsynced: raise durable highwaters."""
        done = []
        for pid in self._pending_pids:
            e = self.entries.get(pid)
            if e is None or e.pending is None:
                done.append(pid)
                continue
            pend = e.pending
            i = 0
            while i < len(pend) and pend[i][0] < end_offset:
                e.durable_highwater = pend[i][1]
                i += 1
            if i == len(pend):
                e.pending = None
                done.append(pid)
            elif i:
                del pend[:i]
        for pid in done:
            del self._pending_pids[pid]

    def mark_pending(self, pid: int, base_seq: int, last_seq: int, last_offset: int) -> None:
        """A batch already applied is not durable after all (a replicated partition's
        batch above the high watermark, found at recovery): its sequences are in flight
        again. Call in log order; the first call for a PID lowers its durable highwater
        to just below that batch."""
        e = self.entries.get(pid)
        if e is None or not self.tracks(pid):
            return
        if e.pending is None:
            e.pending = []
            self._pending_pids[pid] = None
            e.durable_highwater = min(e.durable_highwater, base_seq - 1)
        e.pending.append((last_offset, last_seq))

    # -- last use and expiry ---------------------------------------------------------------
    def touch(self, pid: int, now_ms: int) -> ProducerEntry | None:
        e = self.entries.get(pid)
        if e is not None:
            self._touch(pid, e, now_ms)
        return e

    def _touch(self, pid: int, e: ProducerEntry, now_ms: int) -> None:
        e.last_use_ms = max(e.last_use_ms, now_ms)
        self.entries.move_to_end(pid)

    def expire(self, now_ms: int, expire_ms: int, limit: int = 100_000) -> int:
        """Drop PIDs unused for ``expire_ms``; at most ``limit`` per call (bounded pauses)."""
        dropped = 0
        while self.entries and dropped < limit:
            pid, e = next(iter(self.entries.items()))
            if e.last_use_ms + expire_ms > now_ms:
                break
            if e.pending is not None:  # in flight: it was just used, keep it
                self._touch(pid, e, now_ms)
                continue
            del self.entries[pid]
            dropped += 1
        self.expired_total += dropped
        return dropped

    # -- snapshots -------------------------------------------------------------------------
    def pids(self) -> list[int]:
        return list(self.entries)

    def export_rows(self, pids: Iterable[int] | None = None) -> list[Row]:
        """Rows of ``pids`` (all when None) that are still tracked, for a snapshot of the
        log prefix the caller will fsync before writing it: highwaters count as durable."""
        if pids is None:
            return [(pid, e.generation, e.highwater, e.last_use_ms, array("q", e.batches))
                    for pid, e in self.entries.items()]
        get = self.entries.get
        out = []
        for pid in pids:
            e = get(pid)
            if e is not None:
                out.append((pid, e.generation, e.highwater, e.last_use_ms, array("q", e.batches)))
        return out

    def load_rows(self, rows: Iterable[Row]) -> None:
        """Replace the state with ``rows``, ordered by last use (expiry pops the front)."""
        self.entries.clear()
        self._pending_pids.clear()
        keep = 3 * self.batches_kept
        for pid, gen, hw, last_use_ms, flat in sorted(rows, key=lambda r: r[3]):
            e = ProducerEntry(gen, hw, hw, last_use_ms)
            e.batches = array("q", flat[-keep:]) if len(flat) > keep else array("q", flat)
            self.entries[pid] = e

    def clear(self) -> None:
        self.entries.clear()
        self._pending_pids.clear()

    def items(self) -> Iterator[tuple[int, ProducerEntry]]:
        return iter(self.entries.items())


_APPEND = Decision(Outcome.APPEND)


def batch_triples(flat: array[int]) -> list[tuple[int, int, int]]:
    """(base_seq, last_seq, base_offset) tuples from a flat batch array."""
    return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
