"""Property test of the append rules against a reference model.

The reference decides every append from scratch by scanning the log (the batches written
so far, and which prefix of them is durable); the implementation decides incrementally
from its producer state. Random interleavings of new sends, retries, gaps, overlaps,
zombie sends with an older generation, takeovers (fences), partial group commits,
snapshots and restarts (the undurable tail lost; state rebuilt from a snapshot plus log
replay, or from the whole log) must give identical decisions at every step, and the log
must hold each producer's sequences in order with no duplicates and (strict) no gaps.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.partition import replay_batch
from partition_server.producer_state import Decision, FenceOutcome, Outcome, ProducerStateTable, Row
from pidlease.protocol import FLAG_CONTROL, BatchHeader

K = 3
PIDS = (11, 12)


@dataclass(frozen=True)
class Stored:
    offset: int
    pid: int
    gen: int
    base: int      # -1 for a fence (control batch)
    count: int

    @property
    def last(self) -> int:
        return self.base + self.count - 1


class Reference:
    """Decisions straight from the contract's table, computed from the log alone."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.log: list[Stored] = []
        self.durable = 0  # batches in the durable prefix

    def next_offset(self) -> int:
        return self.log[-1].offset + self.log[-1].count if self.log else 0

    def decide(self, pid: int, gen: int, base: int, count: int) -> Decision:
        mine = [b for b in self.log if b.pid == pid]
        if not mine:
            if self.mode == "monotonic" or base == 0:
                return Decision(Outcome.APPEND)
            return Decision(Outcome.UNKNOWN_PID)
        if gen < max(b.gen for b in mine):
            return Decision(Outcome.FENCED)
        dur = [b for b in self.log[:self.durable] if b.pid == pid]
        return self._by_sequence(mine, dur, base, count)

    def _by_sequence(self, mine: list[Stored], durable: list[Stored], base: int,
                     count: int) -> Decision:
        """The sequence rows of the table for a known PID whose generation is current:
        ``mine`` its batches in the log, ``durable`` those in the durable prefix."""
        last = base + count - 1
        data = [b for b in mine if b.base >= 0]
        h = data[-1].last if data else -1
        dur = [b for b in durable if b.base >= 0]
        dh = dur[-1].last if dur else -1
        if base == h + 1 or (self.mode == "monotonic" and base > h):
            return Decision(Outcome.APPEND)
        if last <= dh:
            for b in data[-K:]:
                if (b.base, b.last) == (base, last):
                    return Decision(Outcome.DUPLICATE, base_offset=b.offset,
                                    last_offset=b.offset + count - 1)
            return Decision(Outcome.DUPLICATE)
        if last <= h:
            return Decision(Outcome.SEQUENCE_UNKNOWN, expected_sequence=h + 1)
        return Decision(Outcome.OUT_OF_ORDER, expected_sequence=h + 1)

    def fence(self, pid: int, gen: int, create: bool) -> FenceOutcome:
        mine = [b for b in self.log if b.pid == pid]
        if not mine:
            return FenceOutcome.APPEND if create else FenceOutcome.ABSENT
        g = max(b.gen for b in mine)
        return (FenceOutcome.FENCED if gen < g else FenceOutcome.SAME if gen == g
                else FenceOutcome.APPEND)


def strip(d: Decision) -> tuple[Outcome, int, int, int]:
    return d.outcome, d.expected_sequence, d.base_offset, d.last_offset


def rebuild(mode: str, log: list[Stored], snap: tuple[int, list[Row]] | None) -> ProducerStateTable:
    """What recovery does: snapshot rows, then replay the log from the snapshot's offset."""
    t = ProducerStateTable(mode=mode, batches_kept=K)
    start = 0
    if snap is not None and snap[0] <= (log[-1].offset + log[-1].count if log else 0):
        start, rows = snap
        t.load_rows(rows)
    for b in log:
        if b.offset < start:
            continue
        # the very function recovery replays stored batch headers with
        replay_batch(t, BatchHeader(b.offset, 0, 0, FLAG_CONTROL if b.base < 0 else 0, b.pid,
                                    b.gen, b.base, b.count, 0), 0)
    return t


send = st.tuples(st.just("send"), st.sampled_from(PIDS), st.integers(1, 3),
                st.sampled_from(["next", "next", "next", "retry", "recent", "recent", "gap",
                                 "overlap", "old_gen"]),
                st.integers(0, 7))
# Weighted towards sends so that producers build up enough batches for the K-window,
# SEQUENCE_UNKNOWN and restart cases to come up often.
op = st.one_of(
    send, send, send, send, send, send,
    st.tuples(st.just("flush"), st.sampled_from([0.0, 0.5, 1.0, 1.0])),
    st.tuples(st.just("flush"), st.floats(0, 1)),
    st.tuples(st.just("fence"), st.sampled_from(PIDS), st.booleans()),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restart"), st.booleans()),
)


def run(mode: str, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    ref = Reference(mode)
    sut = ProducerStateTable(mode=mode, batches_kept=K)
    gens = {pid: 3 for pid in PIDS}            # each producer's current generation
    nexts = {pid: 0 for pid in PIDS}           # each producer's next sequence
    sent: dict[int, list[tuple[int, int]]] = {pid: [] for pid in PIDS}
    snap: tuple[int, list[Row]] | None = None

    def write(s: Stored) -> None:
        ref.log.append(s)

    for o in ops:
        kind = o[0]
        if kind == "send":
            _, pid, count, variant, r = o
            gen = gens[pid]
            base = nexts[pid]
            if variant == "retry" and sent[pid]:
                base, count = sent[pid][r % len(sent[pid])]
            elif variant == "recent" and sent[pid]:  # around the K-batch window's edge
                base, count = sent[pid][-1 - r % min(len(sent[pid]), K + 2)]
            elif variant == "gap":
                base += 1 + r % 3
            elif variant == "overlap":
                base = max(0, base - 1)
            elif variant == "old_gen":
                gen -= 1
            want = ref.decide(pid, gen, base, count)
            got = sut.check_append(pid, gen, base, count)
            assert strip(got) == strip(want), (o, ref.log)
            if got.outcome is Outcome.APPEND:
                off = ref.next_offset()
                write(Stored(off, pid, gen, base, count))
                sut.apply_append(pid, gen, base, count, off, 0)
                sent[pid].append((base, count))
                nexts[pid] = base + count
        elif kind == "flush":
            target = ref.durable + int(o[1] * (len(ref.log) - ref.durable))
            ref.durable = target
            sut.mark_durable(ref.log[target - 1].offset + ref.log[target - 1].count if target else 0)
        elif kind == "fence":
            _, pid, create = o
            gens[pid] += 1
            want_f = ref.fence(pid, gens[pid], create)
            got_f = sut.check_fence(pid, gens[pid], create)
            assert got_f == want_f, o
            if got_f is FenceOutcome.APPEND:
                write(Stored(ref.next_offset(), pid, gens[pid], -1, 1))
                sut.apply_fence(pid, gens[pid], 0)
            # the server answers a fence once everything before it is durable; the new
            # holder resumes after the durable highwater the lease reports
            ref.durable = len(ref.log)
            sut.mark_durable(ref.next_offset())
            e = sut.get(pid)
            nexts[pid] = (e.durable_highwater + 1) if e is not None else 0
        elif kind == "snapshot":
            ref.durable = len(ref.log)
            sut.mark_durable(ref.next_offset())
            snap = (ref.next_offset(), sut.export_rows())
        elif kind == "restart":
            del ref.log[ref.durable:]
            sut = rebuild(mode, ref.log, snap if o[1] else None)
            for pid in PIDS:  # producers resume from what the server holds
                e = sut.get(pid)
                if e is not None:
                    nexts[pid] = e.highwater + 1

    # the log: per PID, sequences in order, no duplicates, and no gaps when strict
    for pid in PIDS:
        seqs = [s for b in ref.log if b.pid == pid and b.base >= 0
                for s in range(b.base, b.base + b.count)]
        assert seqs == sorted(set(seqs)), (pid, seqs)
        if mode == "strict":
            assert seqs == list(range(len(seqs))), (pid, seqs)
    # a rebuild from the whole log equals the live state
    ref.durable = len(ref.log)
    sut.mark_durable(ref.next_offset())
    again = rebuild(mode, ref.log, None)
    assert [r[:3] + (r[4],) for r in again.export_rows()] == \
        [r[:3] + (r[4],) for r in sorted(sut.export_rows(), key=lambda r: again.pids().index(r[0]))]


@settings(max_examples=500, deadline=None)
@given(st.lists(op, max_size=80))
def test_strict_matches_reference(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    run("strict", ops)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=80))
def test_monotonic_matches_reference(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    run("monotonic", ops)


# -- the tracked-PID limit --------------------------------------------------------------
# Three producers on a partition that tracks at most two: new PIDs evict the least recently
# used idle one (strict: idle >= IDLE ms; monotonic: expired, idle >= EXPIRE ms) or are
# refused TOO_MANY_PIDS. The reference keeps, per known PID, where its current "life" in
# the log began (its state is what the log says since then) and the last-use order.
LIMIT_PIDS = (11, 12, 13)
LIMIT = 2
IDLE = 10
EXPIRE = 40


class LimitedReference(Reference):
    def __init__(self, mode: str) -> None:
        super().__init__(mode)
        self.life: dict[int, int] = {}     # pid -> offset its current state starts at
        self.lru: list[int] = []           # least recently used first
        self.last_use: dict[int, int] = {}
        self.life_starts: dict[int, set[int]] = {}  # offsets where a PID's lives began

    def _mine(self, pid: int, upto: int | None = None) -> list[Stored]:
        start = self.life.get(pid)
        if start is None:
            return []
        logged = self.log if upto is None else self.log[:upto]
        return [b for b in logged if b.pid == pid and b.offset >= start]

    def in_flight(self, pid: int) -> bool:
        return any(b.pid == pid and b.base >= 0 and b.offset >= self.life[pid]
                   for b in self.log[self.durable:])

    def evictable(self, now: int) -> int | None:
        for pid in self.lru:
            if self.in_flight(pid):
                continue  # never evicted; look further
            idle = now - self.last_use[pid]
            return pid if idle >= (EXPIRE if self.mode == "monotonic" else IDLE) else None
        return None

    def decide_at(self, pid: int, gen: int, base: int, count: int, now: int) -> Decision:
        if pid not in self.life:
            if self.mode == "monotonic" or base == 0:
                if len(self.life) >= LIMIT and self.evictable(now) is None:
                    return Decision(Outcome.TOO_MANY_PIDS)
                return Decision(Outcome.APPEND)
            return Decision(Outcome.UNKNOWN_PID)
        mine = self._mine(pid)
        if gen < max(b.gen for b in mine):
            return Decision(Outcome.FENCED)
        return self._by_sequence(mine, self._mine(pid, self.durable), base, count)

    def fence_at(self, pid: int, gen: int, create: bool) -> FenceOutcome:
        if pid not in self.life:
            return FenceOutcome.APPEND if create else FenceOutcome.ABSENT
        g = max(b.gen for b in self._mine(pid))
        return (FenceOutcome.FENCED if gen < g else FenceOutcome.SAME if gen == g
                else FenceOutcome.APPEND)

    def touch(self, pid: int, now: int) -> None:
        if pid in self.life:
            self.last_use[pid] = max(self.last_use[pid], now)
            self.lru.remove(pid)
            self.lru.append(pid)

    def written(self, s: Stored, now: int) -> None:
        """``s`` was appended (data or fence): create or touch its PID's state."""
        self.log.append(s)
        if s.pid in self.life:
            self.touch(s.pid, now)
            return
        while len(self.life) >= LIMIT:  # what the table does: evict while it may
            victim = self.evictable(now)
            if victim is None:
                break
            del self.life[victim]
            self.lru.remove(victim)
        self.life[s.pid] = s.offset
        self.life_starts.setdefault(s.pid, set()).add(s.offset)
        self.lru.append(s.pid)
        self.last_use[s.pid] = now


limited_send = st.tuples(st.just("send"), st.sampled_from(LIMIT_PIDS), st.integers(1, 3),
                         st.sampled_from(["next", "next", "next", "retry", "recent", "gap",
                                          "overlap", "old_gen", "first"]),
                         st.integers(0, 7))
limited_op = st.one_of(
    limited_send, limited_send, limited_send, limited_send,
    st.tuples(st.just("flush"), st.sampled_from([0.0, 0.5, 1.0, 1.0])),
    st.tuples(st.just("fence"), st.sampled_from(LIMIT_PIDS), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([1, 5, 10, 25, 45])),
    st.tuples(st.just("touch"), st.sampled_from(LIMIT_PIDS)),
)


def run_limited(mode: str, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    ref = LimitedReference(mode)
    sut = ProducerStateTable(mode=mode, batches_kept=K, pids_max=LIMIT, evict_idle_min_ms=IDLE,
                             expire_ms=EXPIRE)
    now = 0
    gens = {pid: 3 for pid in LIMIT_PIDS}
    nexts = {pid: 0 for pid in LIMIT_PIDS}
    sent: dict[int, list[tuple[int, int]]] = {pid: [] for pid in LIMIT_PIDS}
    for o in ops:
        kind = o[0]
        if kind == "send":
            _, pid, count, variant, r = o
            gen, base = gens[pid], nexts[pid]
            if variant == "retry" and sent[pid]:
                base, count = sent[pid][r % len(sent[pid])]
            elif variant == "recent" and sent[pid]:
                base, count = sent[pid][-1 - r % min(len(sent[pid]), K + 2)]
            elif variant == "gap":
                base += 1 + r % 3
            elif variant == "overlap":
                base = max(0, base - 1)
            elif variant == "old_gen":
                gen -= 1
            elif variant == "first":  # a producer starting over (its state may be gone)
                base = 0
            want = ref.decide_at(pid, gen, base, count, now)
            got = sut.check_append(pid, gen, base, count, now)
            assert strip(got) == strip(want), (o, now, ref.log, ref.lru)
            if got.outcome is Outcome.APPEND:
                off = ref.next_offset()
                ref.written(Stored(off, pid, gen, base, count), now)
                sut.apply_append(pid, gen, base, count, off, now)
                sent[pid].append((base, count))
                nexts[pid] = base + count
            elif got.outcome in (Outcome.DUPLICATE, Outcome.SEQUENCE_UNKNOWN):
                ref.touch(pid, now)   # what the partition does on these answers
                sut.touch(pid, now)
        elif kind == "flush":
            target = ref.durable + int(o[1] * (len(ref.log) - ref.durable))
            ref.durable = target
            sut.mark_durable(ref.log[target - 1].offset + ref.log[target - 1].count if target else 0)
        elif kind == "fence":
            _, pid, create = o
            gens[pid] += 1
            want_f = ref.fence_at(pid, gens[pid], create)
            got_f = sut.check_fence(pid, gens[pid], create)
            assert got_f == want_f, o
            if got_f is FenceOutcome.APPEND:
                ref.written(Stored(ref.next_offset(), pid, gens[pid], -1, 1), now)
                sut.apply_fence(pid, gens[pid], now)
            elif got_f is FenceOutcome.SAME:
                ref.touch(pid, now)
                sut.touch(pid, now)
            ref.durable = len(ref.log)
            sut.mark_durable(ref.next_offset())
            e = sut.get(pid)
            nexts[pid] = (e.durable_highwater + 1) if e is not None else 0
        elif kind == "tick":
            now += o[1]
        elif kind == "touch":  # PRODUCER_STATE, as a lease renewal sends it
            ref.touch(o[1], now)
            sut.touch(o[1], now)
        assert sut.pids() == ref.lru, (o, now)
    # Per life of a PID: sequences in order, no duplicates; strict: from 0 with no gaps, so
    # an evicted PID's sequences are accepted again only by a producer starting over at 0.
    for pid in LIMIT_PIDS:
        lives: list[list[Stored]] = []
        for b in ref.log:
            if b.pid == pid:
                if b.offset in ref.life_starts[pid]:
                    lives.append([])
                lives[-1].append(b)
        for life in lives:
            seqs = [s for b in life if b.base >= 0 for s in range(b.base, b.base + b.count)]
            assert seqs == sorted(set(seqs)), (pid, seqs)
            if mode == "strict":
                assert seqs == list(range(len(seqs))), (pid, seqs)


@settings(max_examples=400, deadline=None)
@given(st.lists(limited_op, max_size=80))
def test_strict_with_pid_limit_matches_reference(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    run_limited("strict", ops)


@settings(max_examples=300, deadline=None)
@given(st.lists(limited_op, max_size=80))
def test_monotonic_with_pid_limit_matches_reference(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    run_limited("monotonic", ops)
