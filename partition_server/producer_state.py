"""Producer state of one partition: the column storage the append rules read and write.
Pure: no I/O and no clock of its own; callers pass ``now_ms`` and offsets.

The rules themselves (what each batch is answered, and why) are in ``append_rules.py``,
readable, with the reference model ``tests/unit/server/append_rules_model.py`` as their
specification. ``ProducerStateTable.check_append`` here is their fast twin, inline over the
columns (one call per batch, no interface in between); the property test holds it to
``append_rules.check_append`` answer for answer, so change both together. This module keeps
re-exporting the rules' names (``Outcome``, ``FenceOutcome``, ``Decision``, ...).

Per PID we keep the generation, the highwater H (last sequence appended), the durable
highwater (last sequence fsynced), the last K batches (for DUPLICATE answers with the
offsets they were first written at) and the last-use time, in last-use (LRU) order, so PID
expiry pops from the front.

Blocks (``note_refused``) and the ranges takeovers gave up live in two side dicts that are
empty in the common case (so the hot path pays one truth test of an empty dict) and are not
in snapshots: a restart opens new connections, and the SDK resends its earliest unresolved
batch first on a new connection, so a block has nothing left to stop; the given-up ranges
are lost too (see ``_abandoned``).

Storage (1M PIDs per partition must fit in about 200 bytes each): no object per
PID. A ``dict`` maps a PID to a slot; per slot, ``array`` columns hold the pid, generation,
highwater, last use, the LRU list's links and the newest batch (its base offset, and its
length: its last sequence is the highwater). Older batches of a PID (up to K-1) live in a
shared pool of rings, allocated only when a PID has a second batch, as (length, offset
distance to the next newer batch) pairs of u32: in strict mode a PID's batches are
contiguous in sequence, so that is all it takes. A PID whose batches do not fit that form
(a hole in its sequence ids, which monotonic topics allow, or a distance over 2**32) keeps
its batches as flat (base_seq, last_seq, base_offset) triples in an ``array('q')`` of its
own. The durable highwater equals the highwater except for PIDs in ``_dhw`` (batches in
flight), and the in-flight batches sit in ``_pending``: both hold only PIDs being written.

Tracked-PID limit (after Kafka's KIP-936): a partition tracks at most ``pids_max`` PIDs. Room
for a new PID is made by evicting the least recently used PID with nothing in flight, but
only one idle for at least ``evict_idle_min_ms`` (strict) or already past ``expire_ms``
(monotonic: an evicted PID's old sequence ids would be accepted again, a duplicate). When
nothing may go, the leader's check refuses the new PID with TOO_MANY_PIDS (``check_append``
with ``now_ms``); applying what a log holds (replay, followers) never refuses: the table
then holds more than the limit until PIDs become evictable.

Dropping state (expiry, eviction) is the leader's alone (``drops_allowed``, kept by the
partition from its role): a follower's last-use times come only from replicated appends,
never from the renewals the leader sees, so a follower dropping on its own clock could
forget a live producer before it takes over (docs/reliability.md, finding 7). A follower
applies what the log holds and may exceed the limit; on becoming leader, ``raise_last_use``
gives every PID a full expiry period from then.

What was dropped leaves a trace: ``dropped_last_use_max_ms``, the largest last use of any
PID this partition ever expired or evicted (kept in snapshots). A PID whose lease of this
partition began after it cannot have had its state dropped here, so a takeover may create
a fresh entry (sequence 0) for it (``may_create``); otherwise "no state" may mean "state
lost", and sequence 0 would replay what is already in the log (finding 6).
"""

from __future__ import annotations

import itertools
import sys
from array import array
from collections.abc import Iterable, Iterator
from operator import itemgetter

from partition_server import append_rules
from partition_server.append_rules import APPEND as _APPEND
from partition_server.append_rules import (
    DEDUP_MODES,
    KAFKA_EPOCH_SHIFT,
    KAFKA_SEQUENCE_MOD,
    Decision,
    FenceOutcome,
    Outcome,
    kafka_base_position,
    leased_over_our_protocol,
)
from pidlease.wire.protocol import KAFKA_GENERATION_BASE, BatchHeader

__all__ = [
    "BLOCKED_UNTRACKED_MAX",
    "DEDUP_MODES",
    "EVICT_IDLE_MIN_MS_DEFAULT",
    "Decision",
    "FenceOutcome",
    "Outcome",
    "ProducerEntry",
    "ProducerStateTable",
    "Row",
    "adopt_rows",
    "batch_triples",
    "cut_row",
    "pids_with_data",
]

# The default of pid_evict_idle_min_ms: the coordinator's longest lease (24 h,
# settings.LEASE_MAX_MS), so no PID that may still hold a valid lease is evicted.
EVICT_IDLE_MIN_MS_DEFAULT = 86_400_000

# Blocks kept for PIDs the partition does not track (new PIDs refused TOO_MANY_PIDS on a
# monotonic topic); see ``ProducerStateTable.note_refused`` for why dropping beyond it is safe.
BLOCKED_UNTRACKED_MAX = 10_000
# Ranges given up by takeovers kept per PID (``ProducerStateTable._abandoned``).
_HOLES_MAX = 4
# Refused ranges a block remembers per PID (``ProducerStateTable.note_refused``): more than
# an SDK can have refused at once (its ``max_in_flight`` is at most 100).
REFUSED_RANGES_MAX = 128

_U32 = 0xFFFF_FFFF
_NIL = -1  # end of the LRU list
_NO_RING = -1  # the PID has at most one batch, kept in the newest-batch columns
_WIDE = -2  # the PID's batches are in ``_wide`` (flat triples)


class ProducerEntry:
    """A copy of one PID's state in one partition (what ``get`` and ``touch`` return);
    changing it changes nothing in the table."""

    __slots__ = (
        "batches",
        "durable_highwater",
        "generation",
        "highwater",
        "last_use_ms",
        "pending",
    )

    def __init__(
        self, generation: int, highwater: int, durable_highwater: int, last_use_ms: int
    ) -> None:
        self.generation = generation
        self.highwater = highwater
        self.durable_highwater = durable_highwater
        # (base_seq, last_seq, base_offset) of the last K data batches, oldest first, as
        # flat triples.
        self.batches = array("q")
        self.last_use_ms = last_use_ms
        # (last_offset, last_seq) of appended batches not yet fsynced, oldest first.
        self.pending: list[tuple[int, int]] | None = None


# One row of a snapshot: pid, generation, highwater, last_use_ms, and the last K batches
# as flat (base_seq, last_seq, base_offset) triples.
Row = tuple[int, int, int, int, "array[int]"]


class ProducerStateTable:
    """Producer state of one partition. ``mode`` is the topic's dedup mode; ``pids_max``
    the tracked-PID limit, ``evict_idle_min_ms`` how long a PID must be idle before it may
    be evicted to make room, ``expire_ms`` the PID expiry (monotonic topics evict only
    expired PIDs; None: never)."""

    # Slots: with a per-instance dict, going from 29 to 30 attributes made every
    # check+apply about 15% slower (measured on CPython 3.11: 1.6 -> 1.85 us; the
    # instance dict's layout changes at that size). A new attribute must be named here;
    # a missing one fails loudly (AttributeError).
    __slots__ = (
        "mode",
        "batches_kept",
        "pids_max",
        "evict_idle_min_ms",
        "expire_ms",
        "expired_total",
        "evicted_total",
        "refused_total",
        "blocks_dropped_total",
        "_ring_words",
        "_ring_zero",
        "_slot",
        "_free",
        "_pid",
        "_gen",
        "_hw",
        "_lu",
        "_prev",
        "_next",
        "_nb_off",
        "_nb_span",
        "_ring",
        "_head",
        "_tail",
        "_rings",
        "_ring_free",
        "_wide",
        "_dhw",
        "_pending",
        "_blocked",
        "_blocked_untracked",
        "_abandoned",
        "dropped_last_use_max_ms",
        "drops_allowed",
    )

    def __init__(
        self,
        *,
        mode: str = "strict",
        batches_kept: int = 5,
        pids_max: int = 1_000_000,
        evict_idle_min_ms: int = EVICT_IDLE_MIN_MS_DEFAULT,
        expire_ms: int | None = None,
    ) -> None:
        if mode not in DEDUP_MODES:
            raise ValueError(f"dedup mode must be one of {DEDUP_MODES}, not {mode!r}")
        if batches_kept < 1:
            raise ValueError("batches_kept must be at least 1")
        self.mode = mode
        self.batches_kept = batches_kept
        self.pids_max = pids_max
        self.evict_idle_min_ms = evict_idle_min_ms
        self.expire_ms = expire_ms
        self.expired_total = 0
        self.evicted_total = 0
        self.refused_total = 0  # new PIDs refused TOO_MANY_PIDS
        self.blocks_dropped_total = 0  # untracked PIDs' blocks over BLOCKED_UNTRACKED_MAX
        # Survive ``clear`` (a rebuild from the log): what was dropped stays dropped.
        self.dropped_last_use_max_ms = 0
        self.drops_allowed = True  # the partition leads (see the module docstring)
        self._ring_words = 2 * (batches_kept - 1)
        self._ring_zero = array("I", bytes(4 * self._ring_words))
        self._init_storage()

    def _init_storage(self) -> None:
        self._slot: dict[int, int] = {}
        self._free: list[int] = []
        self._pid = array("q")
        self._gen = array("I")
        self._hw = array("q")
        self._lu = array("q")
        self._prev = array("i")
        self._next = array("i")
        self._nb_off = array("q")  # base offset of the newest batch; -1: no batch yet
        self._nb_span = array("I")  # its last_seq - base_seq (its last_seq is the highwater)
        self._ring = array("i")  # ring of older batches, _NO_RING or _WIDE
        self._head = _NIL  # least recently used
        self._tail = _NIL  # most recently used
        self._rings = array("I")  # pool: per ring, K-1 (span, offset distance) pairs
        self._ring_free: list[int] = []
        self._wide: dict[int, array[int]] = {}  # slot -> flat triples
        self._dhw: dict[int, int] = {}  # pid -> durable highwater, when != H
        self._pending: dict[int, list[tuple[int, int]]] = {}  # pid -> (last_offset, last_seq)
        # Monotonic only. pid -> the ranges refused with a retriable error and not resent
        # yet (``note_refused``, and the batches the block itself refused), as flat sorted
        # disjoint [base, last] pairs, for tracked PIDs and for new ones refused
        # TOO_MANY_PIDS; in refusal order, oldest first (the untracked entries' bound
        # drops from the front).
        self._blocked: dict[int, list[int]] = {}
        self._blocked_untracked = 0
        # Monotonic only. pid -> the ranges a takeover gave up, as flat [lo, hi) pairs
        # (hi -1: up to the new holder's first append, not made yet): a block was
        # cleared by a takeover, so nothing from the blocked base to where the new holder
        # resumed was ever written, and "older than every kept batch" proves nothing
        # there. Ranges outside them still count as written when older than every kept
        # batch, so a source that replays everything after a takeover still gets
        # DUPLICATE. At most ``_HOLES_MAX`` ranges per PID (the oldest two merge: more
        # OUT_OF_ORDER, never a false DUPLICATE). Cost: a dict entry and a small list,
        # about 150 bytes, only for PIDs that had a refusal given up by a takeover;
        # dropped with the PID; not in snapshots (after a restart such a range is
        # DUPLICATE again: only a producer sending below where it resumed could meet it,
        # and the SDK never does).
        self._abandoned: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, pid: int) -> bool:
        return pid in self._slot

    def get(self, pid: int) -> ProducerEntry | None:
        s = self._slot.get(pid)
        return None if s is None else self._entry(pid, s)

    def tracks(self, pid: int) -> bool:
        """Whether appends of ``pid`` are checked (and so tracked) here."""
        return pid != 0 and self.mode != "off"

    def _entry(self, pid: int, s: int) -> ProducerEntry:
        hw = self._hw[s]
        e = ProducerEntry(self._gen[s], hw, self._dhw.get(pid, hw), self._lu[s])
        e.batches = self._flat(s)
        pend = self._pending.get(pid)
        e.pending = list(pend) if pend is not None else None
        return e

    # -- the read interface of the rules (append_rules.PidView) ----------------------------
    def generation(self, pid: int) -> int | None:
        s = self._slot.get(pid)
        return None if s is None else self._gen[s]

    def highwater(self, pid: int) -> int:
        return self._hw[self._slot[pid]]

    def durable_highwater(self, pid: int) -> int:
        return self._dhw.get(pid, self._hw[self._slot[pid]])

    def kept_batches(self, pid: int) -> list[tuple[int, int, int]]:
        return batch_triples(self._flat(self._slot[pid]))

    def abandoned_ranges(self, pid: int) -> list[tuple[int, int]]:
        holes = self._abandoned.get(pid, [])
        return [(holes[i], holes[i + 1]) for i in range(0, len(holes), 2)]

    def room_for_new_pid(self, now_ms: int) -> bool:
        return len(self._slot) < self.pids_max or self._evictable(now_ms) is not None

    # -- append rules: the fast twin of append_rules.check_append ---------------------------
    def check_append(
        self, pid: int, generation: int, base_seq: int, count: int, now_ms: int | None = None
    ) -> Decision:
        """The decision for a batch. ``now_ms`` is given only by a leader deciding a new
        append: then a new PID is refused TOO_MANY_PIDS when the table is full and no PID
        may be evicted (counted in ``refused_total``). Without it the limit is not checked."""
        if not self.tracks(pid):
            return _APPEND
        if generation >= KAFKA_GENERATION_BASE:
            return self._check_kafka(pid, generation, base_seq, count, now_ms)
        last_seq = base_seq + count - 1
        s = self._slot.get(pid)
        if self._blocked and pid in self._blocked:
            d = self._check_blocked(pid, s, generation, base_seq, last_seq)
            if d is not None:
                return d
        if s is None:
            if self.mode == "monotonic" or base_seq == 0:
                if (
                    now_ms is not None
                    and len(self._slot) >= self.pids_max
                    and self._evictable(now_ms) is None
                ):
                    self.refused_total += 1
                    return Decision(Outcome.TOO_MANY_PIDS, detail=self.limit_detail())
                return _APPEND
            return Decision(
                Outcome.UNKNOWN_PID,
                detail=(
                    f"pid {pid} has no state in this partition and its batch starts at sequence "
                    f"{base_seq}, not 0: the state expired or the PID was never leased here"
                ),
            )
        g = self._gen[s]
        if generation < g:
            return Decision(
                Outcome.FENCED,
                detail=(f"generation {generation} of pid {pid} is older than the current {g}"),
            )
        h = self._hw[s]
        if base_seq == h + 1 or (self.mode == "monotonic" and base_seq > h):
            return _APPEND
        if self.mode == "monotonic" and last_seq <= h:
            return self._check_monotonic_old(pid, s, base_seq, last_seq, h)
        if last_seq <= self._dhw.get(pid, h):
            b = self._flat(s)
            for i in range(0, len(b), 3):
                if b[i] == base_seq and b[i + 1] == last_seq:
                    return Decision(
                        Outcome.DUPLICATE,
                        base_offset=b[i + 2],
                        last_offset=b[i + 2] + count - 1,
                        detail="batch was already written",
                    )
            return Decision(
                Outcome.DUPLICATE, detail="batch was already written (offsets no longer known)"
            )
        if last_seq <= h:
            return Decision(
                Outcome.SEQUENCE_UNKNOWN,
                expected_sequence=h + 1,
                detail=(
                    f"sequences {base_seq}..{last_seq} are appended but not yet durable; retry"
                ),
            )
        return Decision(
            Outcome.OUT_OF_ORDER,
            expected_sequence=h + 1,
            detail=(f"batch has sequences {base_seq}..{last_seq}, expected {h + 1} next"),
        )

    def _check_kafka(
        self, pid: int, generation: int, base_seq: int, count: int, now_ms: int | None
    ) -> Decision:
        """Kafka's rules (append_rules.check_kafka_append) over the columns."""
        s = self._slot.get(pid)
        if s is None:
            if base_seq:
                return Decision(
                    Outcome.UNKNOWN_PID,
                    detail=(
                        f"producer {pid} has no state in this partition and its batch "
                        f"starts at sequence {base_seq}, not 0"
                    ),
                )
            if (
                now_ms is not None
                and len(self._slot) >= self.pids_max
                and self._evictable(now_ms) is None
            ):
                self.refused_total += 1
                return Decision(Outcome.TOO_MANY_PIDS, detail=self.limit_detail())
            return _APPEND
        g = self._gen[s]
        if g < KAFKA_GENERATION_BASE:
            return Decision(Outcome.UNKNOWN_PID, detail=leased_over_our_protocol(pid, g))
        epoch = generation - KAFKA_GENERATION_BASE
        if generation != g:
            if generation < g:
                return Decision(
                    Outcome.FENCED,
                    detail=f"epoch {epoch} of producer {pid} is older than the current one",
                )
            if base_seq == 0:
                return _APPEND
            return Decision(
                Outcome.OUT_OF_ORDER,
                expected_sequence=0,
                detail=f"a new epoch ({epoch}) of producer {pid} must start at sequence 0",
            )
        start = epoch << KAFKA_EPOCH_SHIFT
        h = self._hw[s]
        nxt = (h + 1 - start) % KAFKA_SEQUENCE_MOD if h >= start else 0
        if base_seq == nxt:
            return _APPEND
        last_seq = (base_seq + count - 1) % KAFKA_SEQUENCE_MOD
        b = self._flat(s)
        for i in range(0, len(b), 3):
            if (
                b[i] >= start
                and b[i] % KAFKA_SEQUENCE_MOD == base_seq
                and b[i + 1] % KAFKA_SEQUENCE_MOD == last_seq
            ):
                return Decision(
                    Outcome.DUPLICATE,
                    base_offset=b[i + 2],
                    last_offset=b[i + 2] + count - 1,
                    detail="batch was already written",
                )
        return Decision(
            Outcome.OUT_OF_ORDER,
            expected_sequence=nxt,
            detail=f"batch has sequences {base_seq}..{last_seq}, expected {nxt} next",
        )

    def _check_blocked(
        self, pid: int, s: int | None, generation: int, base_seq: int, last_seq: int
    ) -> Decision | None:
        """The refusal of a batch after a refused one of the same PID (monotonic), or None
        when the other rules decide (a fenced batch, the resend itself, an old batch). The
        refused batch's range joins the block: it is a refusal like any other, and a newer
        batch must wait for its resend too."""
        ranges = self._blocked[pid]
        blocked = ranges[0]
        if base_seq <= blocked:
            return None
        if s is not None and (generation < self._gen[s] or base_seq <= self._hw[s]):
            return None
        _add_range(ranges, base_seq, last_seq)
        return Decision(
            Outcome.SEQUENCE_UNKNOWN,
            expected_sequence=blocked,
            detail=(
                f"an earlier batch of pid {pid} (from sequence {blocked}) was refused; resend it "
                f"first (this batch has sequences {base_seq}..{last_seq})"
            ),
        )

    def _check_monotonic_old(
        self, pid: int, s: int, base_seq: int, last_seq: int, h: int
    ) -> Decision:
        """A monotonic batch wholly at or below the highwater ``h``: SEQUENCE_UNKNOWN while
        any of it is in flight (as on strict topics); then DUPLICATE only for a range the
        partition wrote ("a refusal leaves no hole", docs/protocol.md), else OUT_OF_ORDER."""
        if last_seq > self._dhw.get(pid, h):
            return Decision(
                Outcome.SEQUENCE_UNKNOWN,
                expected_sequence=h + 1,
                detail=(
                    f"sequences {base_seq}..{last_seq} are appended but not yet durable; retry"
                ),
            )
        b = self._flat(s)
        for i in range(0, len(b), 3):
            if b[i] == base_seq and b[i + 1] == last_seq:
                return Decision(
                    Outcome.DUPLICATE,
                    base_offset=b[i + 2],
                    last_offset=b[i + 2] + last_seq - base_seq,
                    detail="batch was already written",
                )
        # Below the oldest kept batch every sequence counts as written (a refusal blocks
        # the PID until its resend is written) except in a range a takeover gave up.
        older_written = True
        if self._abandoned and pid in self._abandoned and (not b or base_seq < b[0]):
            older_written = not _meets(
                self._abandoned[pid], base_seq, min(last_seq, b[0] - 1) if b else last_seq
            )
        if _covered(b, base_seq, last_seq, older_written):
            return Decision(
                Outcome.DUPLICATE,
                detail="batch was already written (offsets no "
                "longer known, or it was written split otherwise)",
            )
        return Decision(
            Outcome.OUT_OF_ORDER,
            expected_sequence=h + 1,
            detail=(
                f"sequences {base_seq}..{last_seq} of pid {pid} are at or below its highwater "
                f"{h} but were never written here (they fall in a hole between written batches, "
                "or a takeover gave them up); they can never be appended"
            ),
        )

    def note_refused(self, pid: int, generation: int, base_seq: int, count: int) -> None:
        """The leader refused this batch with a retriable error the rules did not decide
        (full disk, TOO_MANY_PIDS, ...) after ``check_append`` allowed it. Monotonic topics
        block the PID from ``base_seq`` (see the module docstring); strict topics need no
        block (they accept only H+1); ``off`` and pid 0: nothing.

        Bound: blocks of tracked PIDs go with the PID; blocks of PIDs not tracked (a new
        PID refused TOO_MANY_PIDS) are at most ``BLOCKED_UNTRACKED_MAX``, the least recently
        refused dropped first (counted in ``blocks_dropped_total``). That is safe because
        such a block matters only until the producer resends the refused batch, which an
        SDK does first, right after the answers of the batches it had in flight (at most
        ``max_in_flight``, already on the wire behind the refused one) and one backoff;
        every refused resend moves the PID to the young end again. A drop needs that many
        other new PIDs refused within that window, and even then the PID's next batch is
        refused TOO_MANY_PIDS for as long as the partition stays full.

        The block remembers every refused range not resent yet (this one, and each batch
        it refuses itself, ``_check_blocked``) and lifts range by range as the resends are
        appended (``apply_append``): a batch passes only from at or below the lowest range
        still refused, so a newer batch can never be appended above a refused one that
        was not resent, and no refused range becomes a hole that "older than every kept
        batch" would later answer DUPLICATE (issue 23 item 5: the block used to lift at
        the resend of the first refused batch). At most ``REFUSED_RANGES_MAX`` ranges per
        PID: past that the newest are not remembered (a client that pipelines that many
        refused batches and then resends them out of its own order can leave a hole among
        them, as a client that sends out of order can on any monotonic topic)."""
        if self.mode != "monotonic" or pid == 0 or generation >= KAFKA_GENERATION_BASE:
            return  # (Kafka batches: their rules take only last+1, so no hole to guard)
        last_seq = base_seq + count - 1
        s = self._slot.get(pid)
        if s is not None and last_seq <= self._hw[s]:
            return  # at or below the highwater: nothing above it waits for this one
        blocked = self._blocked
        old = blocked.pop(pid, None)
        ranges = old if old is not None else []
        _add_range(ranges, base_seq, last_seq)
        blocked[pid] = ranges
        if old is None and pid not in self._slot:
            self._blocked_untracked += 1
            if self._blocked_untracked > BLOCKED_UNTRACKED_MAX:
                self._drop_oldest_untracked_block()

    def _drop_oldest_untracked_block(self) -> None:
        for p in self._blocked:
            if p not in self._slot:
                del self._blocked[p]
                self._blocked_untracked -= 1
                self.blocks_dropped_total += 1
                return

    def _unblock(self, pid: int) -> bool:
        """Clear ``pid``'s block (before it is created, or while tracked); whether it had
        one."""
        if pid not in self._blocked:
            return False
        del self._blocked[pid]
        if pid not in self._slot:
            self._blocked_untracked -= 1
        return True

    def blocked_from(self, pid: int) -> int | None:
        """The base sequence ``pid`` is blocked from (monotonic): the lowest base of the
        ranges refused and not resent yet, or None."""
        ranges = self._blocked.get(pid)
        return None if ranges is None else ranges[0]

    def refused_ranges(self, pid: int) -> list[tuple[int, int]]:
        """The (base, last) ranges of ``pid`` refused and not resent yet, lowest first."""
        r = self._blocked.get(pid, [])
        return [(r[i], r[i + 1]) for i in range(0, len(r), 2)]

    def _resent(self, pid: int, last_seq: int) -> None:
        """``pid`` appended a batch up to ``last_seq``: the refused ranges at or below it are
        resent (a range it reaches into is left from ``last_seq + 1`` on); the block lifts
        with the last one."""
        ranges = self._blocked[pid]
        i = 0
        while i < len(ranges) and ranges[i] <= last_seq:
            if ranges[i + 1] > last_seq:
                ranges[i] = last_seq + 1
                break
            i += 2
        if i:
            del ranges[:i]
        if not ranges:
            self._unblock(pid)

    def limit_detail(self) -> str:
        """Why a new PID was refused and what to do (the partition prefixes its name)."""
        if self.mode == "monotonic":
            rule = (
                "none is past its expiry (pid_expire_ms"
                + (f"={self.expire_ms} ms" if self.expire_ms is not None else "")
                + "; monotonic topics evict only expired PIDs, or old sequence ids of an "
                "evicted PID would be accepted again)"
            )
        else:
            rule = (
                f"none has been idle for pid_evict_idle_min_ms={self.evict_idle_min_ms} ms "
                "with nothing in flight"
            )
        return (
            f"this partition already tracks {len(self._slot)} producer ids, its limit "
            f"tracked_pids_max_per_partition={self.pids_max}, and {rule}; a new producer "
            "id is refused rather than forgetting a live one's state. Retry later, or use "
            "fewer distinct PIDs (reuse producer names so a restarted producer takes its "
            "PID over instead of leasing a new one), raise "
            "PIDLEASE_TRACKED_PIDS_MAX_PER_PARTITION, or lower "
            + (
                "PIDLEASE_PID_EXPIRE_MS"
                if self.mode == "monotonic"
                else "PIDLEASE_PID_EVICT_IDLE_MIN_MS"
            )
        )

    def check_fence(self, pid: int, generation: int, create_if_absent: bool) -> FenceOutcome:
        # Not on the per-batch path: the readable rules answer directly.
        return append_rules.check_fence(self, pid, generation, create_if_absent)

    # -- applying what was written (live appends and log replay) ---------------------------
    def apply_append(
        self,
        pid: int,
        generation: int,
        base_seq: int,
        count: int,
        base_offset: int,
        now_ms: int,
        *,
        durable: bool = False,
    ) -> None:
        if not self.tracks(pid):
            return
        if self._blocked and pid in self._blocked:
            # On the leader only a resend (from at or below the lowest range still
            # refused) passes the check; on a follower or in replay the log is the truth.
            # Kafka positions are not sequences: a Kafka batch ends any block.
            if generation >= KAFKA_GENERATION_BASE:
                self._unblock(pid)
            else:
                self._resent(pid, base_seq + count - 1)
        s = self._slot.get(pid)
        if generation >= KAFKA_GENERATION_BASE:
            # A Kafka sequence (i32, wrapping, 0 at each new epoch) becomes its position.
            if s is None:
                base_seq = kafka_base_position(None, -1, generation, base_seq)
            else:
                base_seq = kafka_base_position(self._gen[s], self._hw[s], generation, base_seq)
        last_seq = base_seq + count - 1
        if s is None:
            s = self._create(pid, generation, now_ms)
        else:
            self._touch(s, now_ms)
            ring = self._ring[s]
            if ring == _WIDE:
                w = self._wide[s]
                newest = w[-1] if w else -1
            else:
                newest = self._nb_off[s]
            if newest >= 0 and base_offset <= newest:
                # Already applied: replay over a snapshot whose rows were captured while
                # appends went on starts at the capture's first offset. Makes replay
                # idempotent.
                return
        if self._abandoned and pid in self._abandoned:
            self._close_hole(pid, base_seq)
        if generation > self._gen[s]:  # noqa: PLR1730 (max() is slower on the hot path)
            self._gen[s] = generation
        old_hw = self._hw[s]
        self._push(s, base_seq, last_seq, base_offset, old_hw)
        self._hw[s] = last_seq
        if durable:
            if self._dhw:
                self._dhw.pop(pid, None)
        else:
            if pid not in self._dhw:
                self._dhw[pid] = old_hw
            pend = self._pending.get(pid)
            if pend is None:
                self._pending[pid] = [(base_offset + count - 1, last_seq)]
            else:
                pend.append((base_offset + count - 1, last_seq))

    def apply_fence(self, pid: int, generation: int, now_ms: int) -> None:
        if self.mode == "off" or pid == 0:
            return
        s = self._slot.get(pid)
        if s is None:
            # A block of an untracked PID is given up too: the new holder starts afresh.
            blocked = self.blocked_from(pid) if self._blocked else None
            if blocked is not None:
                self._unblock(pid)
            self._create(pid, generation, now_ms)
            if blocked is not None:
                self._open_hole(pid, blocked)
            return
        self._touch(s, now_ms)
        if generation > self._gen[s]:
            self._gen[s] = generation
            # A takeover gives up the refused range: the new holder resumes after the
            # highwater, so nothing of it will be resent; never DUPLICATE it by age. All
            # the ranges still refused go: from the lowest on, up to where it resumes.
            blocked = self.blocked_from(pid) if self._blocked else None
            if blocked is not None:
                self._unblock(pid)
                self._open_hole(pid, blocked)

    def _open_hole(self, pid: int, lo: int) -> None:
        holes = self._abandoned.setdefault(pid, [])
        if holes and holes[-1] == -1:  # the last takeover's holder wrote nothing yet
            holes[-2] = min(holes[-2], lo)
            return
        holes.extend((lo, -1))
        if len(holes) > 2 * _HOLES_MAX:
            del holes[1:3]  # merge the oldest two: [lo0, hi1)

    def _close_hole(self, pid: int, base_seq: int) -> None:
        """The first append after a takeover ends the range it gave up."""
        holes = self._abandoned[pid]
        if holes[-1] != -1:
            return
        if base_seq > holes[-2]:
            holes[-1] = base_seq
        else:  # the new holder went back to or below the refused base: nothing given up
            del holes[-2:]
            if not holes:
                del self._abandoned[pid]

    def _create(self, pid: int, generation: int, now_ms: int) -> int:
        if len(self._slot) >= self.pids_max:
            self._make_room(now_ms)
        if self._free:
            s = self._free.pop()
            self._pid[s] = pid
            self._gen[s] = generation
            self._hw[s] = -1
            self._lu[s] = now_ms
            self._nb_off[s] = -1
            self._nb_span[s] = 0
            self._ring[s] = _NO_RING
        else:
            s = len(self._pid)
            self._pid.append(pid)
            self._gen.append(generation)
            self._hw.append(-1)
            self._lu.append(now_ms)
            self._prev.append(_NIL)
            self._next.append(_NIL)
            self._nb_off.append(-1)
            self._nb_span.append(0)
            self._ring.append(_NO_RING)
        self._slot[pid] = s
        self._link_tail(s)
        return s

    # -- the tracked-PID limit -------------------------------------------------------------
    def _evictable(self, now_ms: int) -> int | None:
        """The slot of the PID eviction would take now, or None: the least recently used
        one with nothing in flight, if it has been idle long enough."""
        s = self._head
        pending = self._pending
        pid_col = self._pid
        while s != _NIL and pid_col[s] in pending:
            s = self._next[s]
        if s == _NIL:
            return None
        idle = now_ms - self._lu[s]
        if self.mode == "monotonic":
            return s if self.expire_ms is not None and idle >= self.expire_ms else None
        return s if idle >= self.evict_idle_min_ms else None

    def _make_room(self, now_ms: int) -> None:
        # Evict down to below the limit as far as the rule allows; when it does not allow
        # enough, the table grows past the limit (replay and followers never refuse; the
        # leader checked with ``check_append`` first). Followers never evict.
        if not self.drops_allowed:
            return
        while len(self._slot) >= self.pids_max:
            s = self._evictable(now_ms)
            if s is None:
                return
            self._drop(s)
            self.evicted_total += 1

    # -- durability ------------------------------------------------------------------------
    def mark_durable(self, end_offset: int) -> None:
        """Every offset below ``end_offset`` is fsynced: raise durable highwaters."""
        if not self._pending:
            return
        done = []
        for pid, pend in self._pending.items():
            i = 0
            n = len(pend)
            while i < n and pend[i][0] < end_offset:
                i += 1
            if not i:
                continue
            self._set_dhw(pid, pend[i - 1][1])
            if i == n:
                done.append(pid)
            else:
                del pend[:i]
        for pid in done:
            del self._pending[pid]

    def _set_dhw(self, pid: int, dhw: int) -> None:
        s = self._slot.get(pid)
        if s is None:
            return
        if dhw == self._hw[s]:
            self._dhw.pop(pid, None)
        else:
            self._dhw[pid] = dhw

    def mark_pending(self, pid: int, base_seq: int, last_seq: int, last_offset: int) -> None:
        """A batch already applied is not durable after all (a replicated partition's
        batch above the high watermark, found at recovery): its sequences are in flight
        again. Call in log order; the first call for a PID lowers its durable highwater
        to just below that batch."""
        s = self._slot.get(pid)
        if s is None or not self.tracks(pid):
            return
        if self._gen[s] >= KAFKA_GENERATION_BASE:
            # The header's Kafka sequences are not the table's positions: take those of the
            # kept batch written at these offsets (applied just before).
            b = self._flat(s)
            first = last_offset - (last_seq - base_seq)
            at = [i for i in range(0, len(b), 3) if b[i + 2] == first]
            if not at:
                return  # older than the kept batches: a Kafka PID's DUPLICATE waits by offset
            base_seq, last_seq = b[at[0]], b[at[0] + 1]
        pend = self._pending.get(pid)
        if pend is None:
            pend = self._pending[pid] = []
            self._set_dhw(pid, min(self._dhw.get(pid, self._hw[s]), base_seq - 1))
        pend.append((last_offset, last_seq))

    # -- last use and expiry ---------------------------------------------------------------
    def touch(self, pid: int, now_ms: int) -> ProducerEntry | None:
        s = self._slot.get(pid)
        if s is None:
            return None
        self._touch(s, now_ms)
        return self._entry(pid, s)

    def refresh(self, pid: int, now_ms: int) -> bool:
        """``touch`` without building the entry (the DUPLICATE path): whether it is tracked."""
        s = self._slot.get(pid)
        if s is None:
            return False
        self._touch(s, now_ms)
        return True

    def _touch(self, s: int, now_ms: int) -> None:
        if now_ms > self._lu[s]:  # noqa: PLR1730
            self._lu[s] = now_ms
        if s != self._tail:
            self._unlink(s)
            self._link_tail(s)

    def _link_tail(self, s: int) -> None:
        t = self._tail
        self._prev[s] = t
        self._next[s] = _NIL
        if t == _NIL:
            self._head = s
        else:
            self._next[t] = s
        self._tail = s

    def _unlink(self, s: int) -> None:
        p, n = self._prev[s], self._next[s]
        if p == _NIL:
            self._head = n
        else:
            self._next[p] = n
        if n == _NIL:
            self._tail = p
        else:
            self._prev[n] = p

    def _remove(self, s: int) -> None:
        pid = self._pid[s]
        self._unlink(s)
        del self._slot[pid]
        ring = self._ring[s]
        if ring >= 0:
            w = self._ring_words
            self._rings[ring * w : ring * w + w] = self._ring_zero
            self._ring_free.append(ring)
        elif ring == _WIDE:
            del self._wide[s]
        self._ring[s] = _NO_RING
        self._pid[s] = 0
        self._dhw.pop(pid, None)
        self._pending.pop(pid, None)
        if self._blocked:
            self._blocked.pop(pid, None)
        if self._abandoned:
            self._abandoned.pop(pid, None)
        self._free.append(s)

    def _drop(self, s: int) -> None:
        """Forget slot ``s`` for good (expiry, eviction), remembering how recent it was."""
        lu = self._lu[s]
        if lu > self.dropped_last_use_max_ms:  # noqa: PLR1730
            self.dropped_last_use_max_ms = lu
        self._remove(s)

    def note_dropped(self, last_use_ms: int) -> None:
        """Raise ``dropped_last_use_max_ms`` to at least ``last_use_ms`` (a snapshot's value)."""
        if last_use_ms > self.dropped_last_use_max_ms:  # noqa: PLR1730
            self.dropped_last_use_max_ms = last_use_ms

    def may_create(self, leased_since_ms: int) -> bool:
        """Whether a PID with no entry here, leased on this partition since
        ``leased_since_ms``, certainly never had state dropped here, so that creating a fresh
        entry for it (its next sequence 0) loses nothing. 0: the caller does not know (an
        older coordinator), and the entry is created as before."""
        return leased_since_ms <= 0 or self.dropped_last_use_max_ms < leased_since_ms

    def raise_last_use(self, now_ms: int) -> None:
        """Every PID's last use to at least ``now_ms`` (a replica becoming leader: it never
        saw the renewals, so every PID starts a full expiry period). O(n) in C: one column
        fill; the LRU order holds, as max(x, now) keeps the order of x."""
        lu = self._lu
        n = len(lu)
        if not n:
            return
        if max(lu) <= now_ms:
            self._lu = array("q", (now_ms,)) * n
            return
        # Some last use lies ahead of now (the clock went back): keep those.
        self._lu = array("q", map(max, lu, itertools.repeat(now_ms, n)))

    def expire(self, now_ms: int, expire_ms: int, limit: int = 100_000) -> int:
        """Drop PIDs unused for ``expire_ms``; at most ``limit`` per call (bounded pauses).
        Only where the partition leads (``drops_allowed``)."""
        dropped = 0
        if not self.drops_allowed:
            return 0
        lu = self._lu
        while self._head != _NIL and dropped < limit:
            s = self._head
            if lu[s] + expire_ms > now_ms:
                break
            if self._pid[s] in self._pending:  # in flight: it was just used, keep it
                self._touch(s, now_ms)
                continue
            self._drop(s)
            dropped += 1
        self.expired_total += dropped
        return dropped

    # -- batches ---------------------------------------------------------------------------
    def _push(self, s: int, base_seq: int, last_seq: int, base_offset: int, old_hw: int) -> None:
        """Add a batch as the newest of slot ``s`` (whose newest so far ends at ``old_hw``)."""
        ring = self._ring[s]
        span = last_seq - base_seq
        if ring == _WIDE:
            w = self._wide[s]
            w.extend((base_seq, last_seq, base_offset))
            if len(w) > 3 * self.batches_kept:
                del w[:3]
            return
        off0 = self._nb_off[s]
        if off0 < 0 or self._ring_words == 0:
            if 0 <= span <= _U32:
                self._nb_off[s] = base_offset
                self._nb_span[s] = span
                return
        else:
            doff = base_offset - off0
            if base_seq == old_hw + 1 and 0 < doff <= _U32 and 0 <= span <= _U32:
                words = self._ring_words
                rings = self._rings
                if ring < 0:
                    if self._ring_free:
                        ring = self._ring_free.pop()
                    else:
                        ring = len(rings) // words
                        rings.extend(self._ring_zero)
                    self._ring[s] = ring
                p = ring * words
                if words > 2:
                    rings[p + 2 : p + words] = rings[p : p + words - 2]
                rings[p] = self._nb_span[s]
                rings[p + 1] = doff
                self._nb_off[s] = base_offset
                self._nb_span[s] = span
                return
        # Not in the compact form: this PID keeps flat triples from now on.
        flat = self._flat(s)
        flat.extend((base_seq, last_seq, base_offset))
        if len(flat) > 3 * self.batches_kept:
            del flat[: len(flat) - 3 * self.batches_kept]
        self._set_wide(s, flat)

    def _set_wide(self, s: int, flat: array[int]) -> None:
        ring = self._ring[s]
        if ring >= 0:
            w = self._ring_words
            self._rings[ring * w : ring * w + w] = self._ring_zero
            self._ring_free.append(ring)
        self._ring[s] = _WIDE
        self._wide[s] = flat
        self._nb_off[s] = -1
        self._nb_span[s] = 0

    def _flat(self, s: int) -> array[int]:
        """Slot ``s``'s kept batches as flat (base_seq, last_seq, base_offset) triples,
        oldest first."""
        ring = self._ring[s]
        if ring == _WIDE:
            return array("q", self._wide[s])
        off = self._nb_off[s]
        if off < 0:
            return array("q")
        last = self._hw[s]
        base = last - self._nb_span[s]
        if ring == _NO_RING:
            return array("q", (base, last, off))
        out = [(base, last, off)]
        if ring >= 0:
            rings = self._rings
            p = ring * self._ring_words
            for i in range(p, p + self._ring_words, 2):
                doff = rings[i + 1]
                if doff == 0:
                    break
                last = base - 1
                base = last - rings[i]
                off -= doff
                out.append((base, last, off))
        flat = array("q")
        for t in reversed(out):
            flat.extend(t)
        return flat

    def _set_batches(self, s: int, flat: array[int]) -> None:
        """Load slot ``s``'s batches (flat triples, oldest first, at most K) in the compact
        form when they fit it, else as flat triples."""
        n = len(flat) // 3
        if n == 0:
            return
        hw = self._hw[s]
        compact = flat[-2] == hw and (n == 1 or self._ring_words > 0)
        if compact:
            for i in range(n):
                b, last, off = flat[3 * i], flat[3 * i + 1], flat[3 * i + 2]
                if not 0 <= last - b <= _U32:
                    compact = False
                    break
                if i and (b != flat[3 * i - 2] + 1 or not 0 < off - flat[3 * i - 1] <= _U32):
                    compact = False
                    break
        if not compact:
            self._set_wide(s, array("q", flat))
            return
        self._nb_off[s] = flat[-1]
        self._nb_span[s] = flat[-2] - flat[-3]
        if n == 1:
            return
        words = self._ring_words
        if self._ring_free:
            ring = self._ring_free.pop()
        else:
            ring = len(self._rings) // words
            self._rings.extend(self._ring_zero)
        self._ring[s] = ring
        p = ring * words
        # Newest-but-one first: its span and the offset distance to the batch after it.
        for j, i in enumerate(range(n - 2, -1, -1)):
            self._rings[p + 2 * j] = flat[3 * i + 1] - flat[3 * i]
            self._rings[p + 2 * j + 1] = flat[3 * i + 5] - flat[3 * i + 2]

    # -- snapshots -------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """Tracked PIDs, least recently used first."""
        out = []
        s = self._head
        nxt = self._next
        pid_col = self._pid
        while s != _NIL:
            out.append(pid_col[s])
            s = nxt[s]
        return out

    def pids_written_below(self, offset: int) -> list[int]:
        """Tracked PIDs whose newest batch is below ``offset`` (or that have none): below a
        log start, the PIDs whose state no batch left in the log carries."""
        out = []
        for pid in self.pids():
            s = self._slot[pid]
            if self._ring[s] == _WIDE:
                w = self._wide[s]
                newest = w[-1] if w else -1
            else:
                newest = self._nb_off[s]
            if newest < offset:
                out.append(pid)
        return out

    def export_rows(self, pids: Iterable[int] | None = None) -> list[Row]:
        """Rows of ``pids`` (all when None) that are still tracked, for a snapshot of the
        log prefix the caller will fsync before writing it: highwaters count as durable."""
        if pids is None:
            pids = self.pids()
        get = self._slot.get
        gen, hws, lu, ring, nb_off, nb_span = (
            self._gen,
            self._hw,
            self._lu,
            self._ring,
            self._nb_off,
            self._nb_span,
        )
        out = []
        for pid in pids:
            s = get(pid)
            if s is None:
                continue
            hw = hws[s]
            off = nb_off[s]
            if ring[s] == _NO_RING and off >= 0:  # one batch: the common case, inline
                flat = array("q", (hw - nb_span[s], hw, off))
            else:
                flat = self._flat(s)
            out.append((pid, gen[s], hw, lu[s], flat))
        return out

    def rows_after(
        self, after_pid: int, limit: int
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """At most ``limit`` rows of the PIDs above ``after_pid``, in PID order, as columns
        (pids, generations, durable highwaters, last uses): what an operator's view of
        every PID reads (PRODUCER_LIST). Read-only: no PID's last use moves."""
        pids = sorted(p for p in self._slot if p > after_pid) if after_pid >= 0 else None
        if pids is None:
            pids = sorted(self._slot)
        del pids[limit:]
        slot, dhw = self._slot, self._dhw
        slots = [slot[p] for p in pids]
        gen, hws, lu = self._gen, self._hw, self._lu
        hw = [hws[s] for s in slots]
        if dhw:
            hw = [dhw.get(p, h) for p, h in zip(pids, hw, strict=True)]
        return pids, [gen[s] for s in slots], hw, [lu[s] for s in slots]

    def durable_lags(self, pids: Iterable[int]) -> dict[int, int]:
        """The durable highwaters of ``pids`` that lag their highwater (batches above the
        high watermark), for a snapshot beside ``export_rows`` of the same PIDs (no await
        in between): a rebuild that loses those batches (a cut) goes back to it
        (``cut_row``). A PID not named here has its durable highwater at its highwater."""
        dhw = self._dhw
        if not dhw:
            return {}
        return {pid: dhw[pid] for pid in pids if pid in dhw}

    def load_rows(self, rows: Iterable[Row]) -> None:
        """Replace the state with ``rows``, ordered by last use (expiry pops the front)."""
        self.clear()
        keep = 3 * self.batches_kept
        ordered = sorted(rows, key=itemgetter(3))
        n = len(ordered)
        pids = [r[0] for r in ordered]
        self._slot = dict(zip(pids, range(n), strict=True))
        if len(self._slot) == n:
            # Recovery of a million PIDs: build the columns in bulk, slots in last-use order.
            self._pid = array("q", pids)
            self._gen = array("I", [r[1] for r in ordered])
            self._hw = array("q", [r[2] for r in ordered])
            self._lu = array("q", [r[3] for r in ordered])
            self._prev = array("i", range(-1, n - 1))
            self._next = array("i", range(1, n + 1))
            if n:
                self._next[n - 1] = _NIL
                self._head, self._tail = 0, n - 1
            self._nb_off = array("q", bytes(8 * n))
            self._nb_span = array("I", bytes(4 * n))
            self._ring = array("i", [_NO_RING]) * n
            nb_off, nb_span = self._nb_off, self._nb_span
            for s, r in enumerate(ordered):
                flat = r[4]
                if len(flat) == 3 and flat[1] == r[2] and 0 <= flat[1] - flat[0] <= _U32:
                    nb_off[s] = flat[2]
                    nb_span[s] = flat[1] - flat[0]
                else:
                    nb_off[s] = -1
                    if flat:
                        self._set_batches(s, array("q", flat[-keep:]) if len(flat) > keep else flat)
            return
        self.clear()
        for pid, gen, hw, last_use_ms, flat in ordered:
            dup = self._slot.get(pid)
            if dup is not None:  # a PID twice: the later row wins
                self._remove(dup)
            s = self._create_loaded(pid, gen, hw, last_use_ms)
            self._set_batches(s, array("q", flat[-keep:]) if len(flat) > keep else flat)

    def _create_loaded(self, pid: int, gen: int, hw: int, last_use_ms: int) -> int:
        limit, self.pids_max = self.pids_max, sys.maxsize  # a snapshot is never cut
        try:
            s = self._create(pid, gen, last_use_ms)
        finally:
            self.pids_max = limit
        self._hw[s] = hw
        return s

    def clear(self) -> None:
        self._init_storage()

    def items(self) -> Iterator[tuple[int, ProducerEntry]]:
        """(pid, a copy of its entry), least recently used first."""
        for pid in self.pids():
            yield pid, self._entry(pid, self._slot[pid])

    # -- memory ----------------------------------------------------------------------------
    def memory_bytes(self, sample_max: int = 64) -> int:
        """Estimated bytes held: the columns and the ring pool (exact), the PID dict with its
        int keys and slot values, and the side structures (sampled, bounded cost)."""
        total = sys.getsizeof(self._slot) + 64 * len(self._slot)
        for col in (
            self._pid,
            self._gen,
            self._hw,
            self._lu,
            self._prev,
            self._next,
            self._nb_off,
            self._nb_span,
            self._ring,
            self._rings,
        ):
            total += sys.getsizeof(col)
        total += sys.getsizeof(self._free) + 32 * len(self._free)
        total += sys.getsizeof(self._ring_free) + 32 * len(self._ring_free)
        for side in (self._wide, self._dhw, self._pending, self._blocked, self._abandoned):
            total += sys.getsizeof(side)
            n = len(side)
            if not n:
                continue
            per = 0
            sampled = 0
            for v in side.values():
                if sampled >= sample_max:
                    break
                sampled += 1
                per += 32 + sys.getsizeof(v)
                if isinstance(v, list):
                    per += sum(sys.getsizeof(x) + 64 for x in v)
            total += n * per // sampled
        return total


def _meets(holes: list[int], lo: int, hi: int) -> bool:
    """Whether ``lo..hi`` (inclusive) meets one of the [lo, hi) ranges in ``holes``
    (flat pairs; hi -1: no end)."""
    for i in range(0, len(holes), 2):
        h_lo, h_hi = holes[i], holes[i + 1]
        if hi >= h_lo and (h_hi == -1 or lo < h_hi):
            return True
    return False


def _covered(flat: array[int], base_seq: int, last_seq: int, older_written: bool) -> bool:
    """Whether every sequence of ``base_seq..last_seq`` was written: held by the kept
    batches (flat triples, in sequence order), or, when ``older_written``, older than all
    of them."""
    if not flat:
        return older_written
    nxt = base_seq
    if older_written and nxt < flat[0]:
        nxt = flat[0]
        if nxt > last_seq:
            return True
    for i in range(0, len(flat), 3):
        if flat[i] > nxt:
            return False
        if flat[i + 1] >= nxt:
            nxt = flat[i + 1] + 1
            if nxt > last_seq:
                return True
    return False


def _add_range(ranges: list[int], base: int, last: int) -> None:
    """Add the refused range [base, last] to the flat sorted disjoint pairs ``ranges``
    (overlapping or touching ranges merge); past ``REFUSED_RANGES_MAX`` pairs a range above
    all of them is not added (``note_refused``)."""
    i = 0
    while i < len(ranges) and ranges[i + 1] < base - 1:
        i += 2
    j = i
    while j < len(ranges) and ranges[j] <= last + 1:
        base = min(base, ranges[j])
        last = max(last, ranges[j + 1])
        j += 2
    if i == j and i == len(ranges) and len(ranges) >= 2 * REFUSED_RANGES_MAX:
        return
    ranges[i:j] = [base, last]


# -- the rules of rebuilding state (partition_server/rebuild.py applies them) -------------
def pids_with_data(headers: Iterable[BatchHeader], end: int) -> set[int]:
    """The PIDs whose state the log below ``end`` carries: those with a *data* batch
    there. A FENCE raises a generation and carries no sequence: a PID whose only batch
    left is a fence (retention deleted its data batches, then a takeover) keeps the row
    that holds its highwater; rebuilt from the fence alone it would be at -1 and a takeover
    would restart it at sequence 0 (issue 23 item 2)."""
    return {h.pid for h in headers if not h.is_control and h.base_offset < end}


def cut_row(row: Row, end: int, durable_highwater: int | None) -> Row | None:
    """A PID's row once its batches at or above ``end`` are gone (a cut at ``end``, or a
    rebuild whose log starts at ``end`` and holds no data batch of it). Such batches were
    above the high watermark (a cut never goes below it), so their sequences were never
    committed: a resend must append again, never be answered DUPLICATE. The highwater is
    the last kept batch's, or, when every kept batch went, ``durable_highwater`` (the
    committed one, which the row's K batches may no longer show: more than K were cut,
    issue 23 item 4). None when that is not known (a snapshot from before PLSNAP05) or
    when the PID had nothing committed: as if it never wrote here. The generation stays:
    a fence in the cut range keeps refusing the older generation, which the coordinator
    has moved past."""
    pid, gen, hw, last_use, flat = row
    kept = array("q")
    for i in range(0, len(flat), 3):
        if flat[i + 2] < end:
            kept.extend(flat[i : i + 3])
    if len(kept) == len(flat):
        return row
    if kept:
        return (pid, gen, kept[-2], last_use, kept)
    if durable_highwater is None:
        return None
    hw = min(hw, durable_highwater)
    return None if hw < 0 else (pid, gen, hw, last_use, kept)


def row_below(row: Row, start: int) -> Row | None:
    """A leader's row as a replica starting over at ``start`` (the leader's log start, so
    everything below it is committed) needs it before it replays the log from there: the
    PID's state as of ``start``. The row itself when every batch it keeps is below (or it
    keeps none); its batches below ``start`` when some are at or above it (those the
    replica fetches and replays; without the ones below, its row would skip from its own
    older batches to the fetched ones, and a resend of a committed batch the leader still
    answers DUPLICATE would be OUT_OF_ORDER_SEQUENCE there, Kafka's rule: simulation seed
    500201); None when all are at or above it: the log from ``start`` carries the PID."""
    flat = row[4]
    if flat and all(flat[i + 2] >= start for i in range(0, len(flat), 3)):
        return None
    return cut_row(row, start, None)


def adopt_rows(mine: Iterable[Row], theirs: Iterable[Row]) -> list[Row]:
    """``mine`` with ``theirs`` taking over the PIDs they name (a follower starting over
    adopting its leader's rows; a rebuild restoring rows over the fences replay found):
    their highwater and batches win, the generation and last use never go back."""
    rows = {r[0]: r for r in mine}
    for pid, gen, hw, last_use, flat in theirs:
        m = rows.get(pid)
        if m is None:
            rows[pid] = (pid, gen, hw, last_use, flat)
        else:
            rows[pid] = (pid, max(gen, m[1]), hw, max(last_use, m[3]), flat)
    return list(rows.values())


def batch_triples(flat: array[int]) -> list[tuple[int, int, int]]:
    """(base_seq, last_seq, base_offset) tuples from a flat batch array."""
    return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
