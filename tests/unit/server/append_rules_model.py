"""Reference model of one partition's append rules, written from the append rules
(docs/protocol.md, PRODUCE: the table, row by row, and the monotonic paragraph under it), NOT from
``partition_server/append_rules.py`` or ``partition_server/producer_state.py``.

The model is the specification the property tests hold the table to. It keeps the ground
truth the table cannot afford (every batch the partition wrote, in log order, and every
refusal) and answers each batch with the set of decisions the contract allows: one
decision where the contract is exact, several where its text leaves the choice to the
implementation (each such place says why). Every method names the contract row it follows.

Its own bookkeeping is deliberately naive (lists scanned on every call): it is read, not
run at scale.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from partition_server.append_rules import Decision, FenceOutcome, Outcome


@dataclass(frozen=True)
class Stored:
    """One batch in the log: data (``base`` >= 0) or a fence control batch (``base`` -1)."""

    offset: int
    pid: int
    gen: int
    base: int
    count: int

    @property
    def last(self) -> int:
        return self.base + self.count - 1

    @property
    def is_data(self) -> bool:
        return self.base >= 0


@dataclass(frozen=True)
class Answer:
    """One decision the contract allows. ``None`` fields are not the contract's to fix."""

    outcome: Outcome
    expected_sequence: int | None = None
    offsets: tuple[int, int] | None = None  # (base_offset, last_offset) of a DUPLICATE

    def matches(self, d: Decision) -> bool:
        if d.outcome is not self.outcome:
            return False
        if self.expected_sequence is not None and d.expected_sequence != self.expected_sequence:
            return False
        return self.offsets is None or (d.base_offset, d.last_offset) == self.offsets

    def __str__(self) -> str:
        s = self.outcome.name
        if self.expected_sequence is not None:
            s += f"(expected {self.expected_sequence})"
        if self.offsets is not None:
            s += f"(offsets {self.offsets[0]}..{self.offsets[1]})"
        return s


@dataclass(frozen=True)
class Expectation:
    """What the contract allows for one batch, and the row that says so."""

    row: str
    answers: tuple[Answer, ...]
    # set when the answer tells whether the partition still remembers a refusal
    refusal_probe: bool = False

    def allows(self, d: Decision) -> bool:
        return any(a.matches(d) for a in self.answers)

    def __str__(self) -> str:
        return f"{' or '.join(map(str, self.answers))}  [{self.row}]"


def only(row: str, answer: Answer) -> Expectation:
    return Expectation(row, (answer,))


@dataclass
class Refusal:
    """The refused ranges of a PID not yet resent (monotonic "a refusal leaves no hole":
    "the partition refuses that PID's later batches (retriable) until the refused range is
    resent"). Every batch refused with a retriable error is a refused range, also one
    refused because of an earlier refusal (SEQUENCE_UNKNOWN is retriable): a newer batch
    waits for all of them, not only for the first (issue 23 item 5)."""

    ranges: list[tuple[int, int]]  # (base, last), each refused and not resent yet
    # After a restart or a takeover that wrote nothing, the contract does not say whether
    # the partition still holds the refusal (it is in no log); the next batch that can tell
    # decides, and the model follows.
    maybe_forgotten: bool = False

    @property
    def base(self) -> int:
        """Where the resends must start: the lowest refused sequence not resent."""
        return min(b for b, _ in self.ranges)

    def resent(self, last: int) -> None:
        """A batch up to ``last`` was written: the refused sequences at or below it are
        resent (whatever the batch boundaries of the resend: sequences are the records)."""
        self.ranges = [(max(b, last + 1), e) for b, e in self.ranges if e > last]


@dataclass
class Life:
    """What the partition wrote for one PID since it last (re)learned of it, in log order."""

    batches: list[Stored] = field(default_factory=list)


class AppendRulesModel:
    """One partition: its log, its durable prefix, and the append rules on top of them."""

    def __init__(self, mode: str, batches_kept: int = 5) -> None:
        self.mode = mode
        self.batches_kept = batches_kept  # K of the contract
        self.log: list[Stored] = []
        self.fsynced_end = 0  # log offsets below this are fsynced
        self.lives: dict[int, Life] = {}  # PIDs known to the partition
        self.refusals: dict[int, Refusal] = {}  # monotonic only
        self._clock = 0  # orders refusals against takeovers
        self._refused: dict[int, list[tuple[int, int]]] = {}  # pid -> (clock, base) of each
        self._last_takeover: dict[int, int] = {}
        self._last_restart = -1  # a restart forgets every refusal (none is in a log)

    # -- the state the rows speak of ------------------------------------------------------
    def next_offset(self) -> int:
        return self.log[-1].offset + self.log[-1].count if self.log else 0

    def _data(self, pid: int) -> list[Stored]:
        life = self.lives.get(pid)
        return [b for b in life.batches if b.is_data] if life else []

    def generation(self, pid: int) -> int:
        """The stored generation: the newest one written (data or fence)."""
        return max(b.gen for b in self.lives[pid].batches)

    def highwater(self, pid: int) -> int:
        """H: the last sequence appended for the PID (-1 when none)."""
        data = self._data(pid)
        return data[-1].last if data else -1

    def durable_highwater(self, pid: int) -> int:
        durable = [b for b in self._data(pid) if b.offset + b.count <= self.fsynced_end]
        return durable[-1].last if durable else -1

    def kept(self, pid: int) -> list[Stored]:
        """The last K data batches: the ones whose offsets a DUPLICATE answer still knows."""
        return self._data(pid)[-self.batches_kept :]

    def written_offsets(self, pid: int, base: int, last: int) -> tuple[int, int] | None:
        """(offset of ``base``, offset of ``last``) when every sequence of the range was
        written in this life of the PID, else None (the range has a hole: never written)."""
        where: dict[int, int] = {}
        for b in self._data(pid):
            for s in range(b.base, b.last + 1):
                where[s] = b.offset + s - b.base
        if all(s in where for s in range(base, last + 1)):
            return where[base], where[last]
        return None

    # -- the rows -------------------------------------------------------------------------
    def decide(self, pid: int, gen: int, base: int, count: int) -> Expectation:
        """The contract's table, in its order (the first row that applies decides):

        1. pid 0, or topic dedup off                          -> OK
        2. generation < stored generation                     -> FENCED
        3. PID unknown, base 0 (strict) or any (monotonic)    -> OK, entry created
        4. PID unknown, strict, base > 0                      -> UNKNOWN_PID
        5. base == H+1 (monotonic: base > H)                  -> OK, newer generation adopted
        6. whole batch at or below the durable highwater      -> DUPLICATE, offsets if kept
        7. at or below H, above the durable highwater         -> SEQUENCE_UNKNOWN
        8. base > H+1 (strict), or a batch straddling H       -> OUT_OF_ORDER_SEQUENCE
        (NOT_LEADER and UNAUTHORIZED are the server's, not the producer state's.)

        and the monotonic paragraph: a refused range not yet resent refuses the PID's
        later batches (before rows 3 and 5, ``_after_refusals``), and row 6 answers
        DUPLICATE only for a range the partition wrote (``_duplicate``).
        """
        last = base + count - 1
        if pid == 0 or self.mode == "off":  # row 1
            return only("pid 0, or topic dedup off -> OK", Answer(Outcome.APPEND))
        if pid not in self.lives:  # rows 3 and 4 (row 2 needs a stored generation)
            if self.mode == "strict":
                if base == 0:
                    return only(
                        "PID unknown, base 0 (strict) -> OK, entry created", Answer(Outcome.APPEND)
                    )
                return only(
                    "PID unknown, strict, base > 0 -> UNKNOWN_PID", Answer(Outcome.UNKNOWN_PID)
                )
            return self._after_refusals(
                pid,
                base,
                only(
                    "PID unknown, any base (monotonic) -> OK, entry created", Answer(Outcome.APPEND)
                ),
            )
        if gen < self.generation(pid):  # row 2
            return only("generation < stored generation -> FENCED", Answer(Outcome.FENCED))
        return self._after_refusals(pid, base, self._by_sequence(pid, base, last))

    def _after_refusals(self, pid: int, base: int, rows: Expectation) -> Expectation:
        """Monotonic: "a refusal leaves no hole": while a refused range is not resent, the
        PID's later batches (base above the refused base) are refused, retriably."""
        r = self.refusals.get(pid)
        if r is None or base <= r.base:
            return rows
        blocked = Answer(Outcome.SEQUENCE_UNKNOWN)
        row = f"monotonic: refusal at sequence {r.base} not resent -> refused (retriable)"
        if r.maybe_forgotten:
            return Expectation(
                f"{row}; or, if the partition no longer holds it, {rows.row}",
                (blocked, *rows.answers),
                refusal_probe=True,
            )
        return only(row, blocked)

    def _by_sequence(self, pid: int, base: int, last: int) -> Expectation:
        h, dh = self.highwater(pid), self.durable_highwater(pid)
        if base == h + 1 or (self.mode == "monotonic" and base > h):
            return only(
                "base == H+1 (monotonic: base > H) -> OK, newer generation adopted",
                Answer(Outcome.APPEND),
            )  # row 5
        if last <= dh:  # row 6
            return self._duplicate(pid, base, last, h)
        if last <= h:  # row 7
            # no expected sequence: the row gives none for this answer
            return only(
                "at or below H, above the durable highwater -> SEQUENCE_UNKNOWN",
                Answer(Outcome.SEQUENCE_UNKNOWN),
            )
        if base > h + 1:  # row 8
            return only(
                "base > H+1 (strict) -> OUT_OF_ORDER_SEQUENCE, expected H+1",
                Answer(Outcome.OUT_OF_ORDER, h + 1),
            )
        return only(
            "a batch straddling H -> OUT_OF_ORDER_SEQUENCE, expected H+1",
            Answer(Outcome.OUT_OF_ORDER, h + 1),
        )

    def _duplicate(self, pid: int, base: int, last: int, h: int) -> Expectation:
        """Row 6, whole batch at or below the durable highwater: "DUPLICATE, with the
        offsets it was first written at when still known (last K batches per PID), else
        offset -1"; monotonic: "DUPLICATE is answered only for a range the partition wrote
        (a kept batch, or one older than every kept batch on a PID with no refusal
        since)", and a never-written one is OUT_OF_ORDER_SEQUENCE (row 8's answer, with
        the expected next sequence)."""
        for b in self.kept(pid):
            if (b.base, b.last) == (base, last):
                return only(
                    "whole batch <= durable highwater, a kept batch -> DUPLICATE with "
                    "the offsets it was first written at",
                    Answer(Outcome.DUPLICATE, offsets=(b.offset, b.offset + b.count - 1)),
                )
        written = self.written_offsets(pid, base, last)
        # Not one of the last K batches: "else offset -1". A table that still works the
        # offsets out (a part of a kept batch) tells the truth too, so that is allowed.
        dup = (
            Answer(Outcome.DUPLICATE, offsets=(-1, -1)),
            *((Answer(Outcome.DUPLICATE, offsets=written),) if written else ()),
        )
        if self.mode == "strict":
            # no holes in strict: everything at or below H was written
            return Expectation(
                "whole batch <= durable highwater, not a kept batch -> DUPLICATE, offset -1", dup
            )
        # Monotonic. Sequences from the oldest kept batch up: the table knows every batch
        # written there, so a hole in that part is provably never written. Sequences below
        # it: "older than every kept batch", trusted as written only "on a PID with no
        # refusal since".
        ooo = Answer(Outcome.OUT_OF_ORDER, h + 1)
        edge = self.kept(pid)[0].base
        if last >= edge and self.written_offsets(pid, max(base, edge), last) is None:
            return only(
                "monotonic: DUPLICATE only for a range the partition wrote; this one "
                "has a never-written hole among the kept batches -> "
                "OUT_OF_ORDER_SEQUENCE",
                ooo,
            )
        refusals = self._refused.get(pid, [])
        if last < edge and not refusals:
            return Expectation(
                "monotonic: whole batch <= durable highwater, older than every "
                "kept batch, no refusal since -> DUPLICATE, offset -1",
                dup,
            )
        if base >= edge or not refusals:
            # a written range that is not one kept batch (part of one, several, or reaching
            # below the oldest, trusted part): the contract names DUPLICATE for neither
            return Expectation(
                "monotonic: written (or trusted) range that is not a kept "
                "batch -> DUPLICATE or OUT_OF_ORDER",
                (*dup, ooo),
            )
        # "no refusal since" read in time (any refusal of the PID since) or by cause (a
        # refusal at base r can leave unwritten only sequences >= r), and "a takeover
        # clears this" read as clearing that memory too or not: the text leaves both open,
        # so DUPLICATE is allowed where some reading allows it and the range is not one a
        # refusal may have left unwritten.
        # A restart forgets the refusals before it (they are in no log: the block rule's
        # ``maybe_forgotten``), so the partition's "no refusal since" may start there.
        cleared = max(self._last_takeover.get(pid, -1), self._last_restart)
        if all(r > min(last, edge - 1) or t < cleared for t, r in refusals):
            return Expectation(
                "monotonic: reaches below every kept batch, no refusal at or "
                "below it since the last takeover or restart -> DUPLICATE or OUT_OF_ORDER",
                (*dup, ooo),
            )
        if written is not None:
            return Expectation(
                "monotonic: reaches below every kept batch after a refusal, "
                "written -> DUPLICATE or OUT_OF_ORDER",
                (*dup, ooo),
            )
        return only(
            "monotonic: reaches below every kept batch after a refusal and was never "
            "written -> OUT_OF_ORDER_SEQUENCE (DUPLICATE only for a range the "
            "partition wrote)",
            ooo,
        )

    def fence_outcomes(self, pid: int, gen: int, create_if_absent: bool) -> set[FenceOutcome]:
        if self.mode == "off":
            return {FenceOutcome.ABSENT}  # no sequence checks: no generation to record
        if pid not in self.lives:
            allowed = {FenceOutcome.APPEND if create_if_absent else FenceOutcome.ABSENT}
            if pid in self.refusals:
                # the contract does not say whether a refusal alone makes a PID known
                allowed.add(FenceOutcome.APPEND)
            return allowed
        g = self.generation(pid)
        return {
            FenceOutcome.FENCED
            if gen < g
            else FenceOutcome.SAME
            if gen == g
            else FenceOutcome.APPEND
        }

    # -- what happened --------------------------------------------------------------------
    def observe(self, pid: int, exp: Expectation, got: Decision, base: int, count: int) -> None:
        """Learn from the table's answer whether it still holds a refusal it may have lost;
        a retriable refusal (SEQUENCE_UNKNOWN) of a batch above H is a refusal like any
        other ("refused with a retriable error (..., anything)")."""
        if exp.refusal_probe:
            if got.outcome is Outcome.SEQUENCE_UNKNOWN:
                self.refusals[pid].maybe_forgotten = False
            elif got.outcome is Outcome.APPEND:
                del self.refusals[pid]
        if got.outcome is Outcome.SEQUENCE_UNKNOWN:
            self.refuse(pid, base, count)

    def append(self, pid: int, gen: int, base: int, count: int) -> Stored:
        s = Stored(self.next_offset(), pid, gen, base, count)
        self.log.append(s)
        if pid != 0 and self.mode != "off":
            self.lives.setdefault(pid, Life()).batches.append(s)
            # the refused sequences up to this batch's last were resent (or one below
            # them appended): the block ends once every refused range is
            r = self.refusals.get(pid)
            if r is not None:
                r.resent(s.last)
                if not r.ranges:
                    del self.refusals[pid]
        return s

    def refuse(self, pid: int, base: int, count: int) -> None:
        """A batch was refused with a retriable error: one the rules let through (full
        disk, NOT_LEADER...), or one refused because of an earlier refusal. A batch wholly
        at or below H leaves no hole above which anything could be appended: not a
        refused range (and never resendable on a monotonic topic)."""
        last = base + count - 1
        if pid == 0 or self.mode != "monotonic":
            return
        if pid in self.lives and last <= self.highwater(pid):
            return
        self._clock += 1
        self._refused.setdefault(pid, []).append((self._clock, base))
        r = self.refusals.get(pid)
        if r is None:
            self.refusals[pid] = Refusal([(base, last)])
        else:
            r.ranges.append((base, last))

    def fence(self, pid: int, gen: int, outcome: FenceOutcome) -> Stored | None:
        """A takeover with ``gen``; ``outcome`` is what the table answered."""
        self._clock += 1
        written = None
        if outcome is FenceOutcome.APPEND:
            written = Stored(self.next_offset(), pid, gen, -1, 1)
            self.log.append(written)
            self.lives.setdefault(pid, Life()).batches.append(written)
        if outcome in (FenceOutcome.APPEND, FenceOutcome.ABSENT):
            self._last_takeover[pid] = self._clock
            r = self.refusals.get(pid)
            if r is not None:  # "a takeover clears this"
                if outcome is FenceOutcome.APPEND:
                    del self.refusals[pid]
                else:  # nothing written for the PID: it may not have noticed
                    r.maybe_forgotten = True
        return written

    def flush(self, end_offset: int) -> list[Stored]:
        """Everything below ``end_offset`` is durable; returns the batches that became so."""
        newly = [b for b in self.log if self.fsynced_end <= b.offset < end_offset]
        self.fsynced_end = max(self.fsynced_end, end_offset)
        return newly

    def restart(self) -> None:
        """The undurable tail is lost; the table is rebuilt from snapshot and log."""
        self.log = [b for b in self.log if b.offset + b.count <= self.fsynced_end]
        for pid in list(self.lives):
            kept = [b for b in self.lives[pid].batches if b.offset + b.count <= self.fsynced_end]
            if kept:
                self.lives[pid].batches = kept
            else:
                del self.lives[pid]
        for r in self.refusals.values():  # a refusal is in no log
            r.maybe_forgotten = True
        self._clock += 1
        self._last_restart = self._clock

    def forget(self, pid: int) -> None:
        """The partition dropped the PID's state (eviction, expiry)."""
        del self.lives[pid]
        if pid in self.refusals:
            self.refusals[pid].maybe_forgotten = True

    # -- the contract's guarantees on the log ---------------------------------------------
    def log_violations(self) -> list[str]:
        """Per PID (per life): sequences in increasing order in the log, so never twice;
        strict: from 0 with no gaps."""
        if self.mode == "off":
            return []
        out = []
        for pid, life in self.lives.items():
            seqs = [s for b in life.batches if b.is_data for s in range(b.base, b.last + 1)]
            if any(a >= b for a, b in itertools.pairwise(seqs)):
                out.append(f"pid {pid}: sequences not increasing in the log: {seqs}")
            if self.mode == "strict" and seqs != list(range(len(seqs))):
                out.append(f"pid {pid}: strict log has a gap: {seqs}")
        return out

    def seqs_in_log(self, pid: int) -> list[int]:
        return [
            s for b in self.log if b.pid == pid and b.is_data for s in range(b.base, b.last + 1)
        ]


# -- Kafka producers (issue 14) ----------------------------------------------------------------
KAFKA_SEQ_MOD = 2**31  # Kafka's sequences are int32, wrapping to 0 after 2**31 - 1


@dataclass(frozen=True)
class KafkaStored:
    """One Kafka batch in the log, in Kafka's own terms (epoch, int32 sequences)."""

    offset: int
    pid: int
    epoch: int
    base: int
    count: int

    @property
    def last(self) -> int:
        return (self.base + self.count - 1) % KAFKA_SEQ_MOD


class KafkaRulesModel:
    """Kafka's idempotent-producer rules as the issue states them (docs/kafka.md), written
    from that text, NOT from the code: per producer the partition knows the epoch of its
    newest batch, the last sequence of that epoch and the last ``kept`` batches.

    - unknown producer: sequence 0 starts it, any other sequence is UNKNOWN_PRODUCER_ID;
    - epoch older than the producer's: INVALID_PRODUCER_EPOCH;
    - epoch newer: base sequence must be 0 (the client's own epoch bump), else
      OUT_OF_ORDER_SEQUENCE_NUMBER;
    - same epoch: exactly last + 1 (2**31 - 1 is followed by 0); a batch equal to one of the
      last ``kept`` batches of this epoch is a duplicate answered with its first offsets;
      anything else OUT_OF_ORDER_SEQUENCE_NUMBER.

    Kafka's codes are our outcomes here: UNKNOWN_PID, FENCED, OUT_OF_ORDER, DUPLICATE."""

    def __init__(self, kept: int = 5) -> None:
        self.kept_max = kept
        self.log: list[KafkaStored] = []

    @property
    def next_offset(self) -> int:
        return self.log[-1].offset + self.log[-1].count if self.log else 0

    def _mine(self, pid: int) -> list[KafkaStored]:
        return [b for b in self.log if b.pid == pid]

    def decide(self, pid: int, epoch: int, base: int, count: int) -> Expectation:
        mine = self._mine(pid)
        if not mine:
            if base == 0:
                return only("kafka: new producer at 0", Answer(Outcome.APPEND))
            return only("kafka: unknown producer", Answer(Outcome.UNKNOWN_PID))
        current = mine[-1].epoch
        if epoch < current:
            return only("kafka: older epoch", Answer(Outcome.FENCED))
        if epoch > current:
            if base == 0:
                return only("kafka: newer epoch at 0", Answer(Outcome.APPEND))
            return only("kafka: newer epoch not at 0", Answer(Outcome.OUT_OF_ORDER, 0))
        expected = (mine[-1].last + 1) % KAFKA_SEQ_MOD
        if base == expected:
            return only("kafka: last + 1", Answer(Outcome.APPEND))
        last = (base + count - 1) % KAFKA_SEQ_MOD
        recent = [b for b in mine if b.epoch == epoch][-self.kept_max :]
        for b in recent:
            if (b.base, b.last) == (base, last):
                offsets = (b.offset, b.offset + b.count - 1)
                return only(
                    "kafka: retry of a recent batch", Answer(Outcome.DUPLICATE, None, offsets)
                )
        return only("kafka: not last + 1", Answer(Outcome.OUT_OF_ORDER, expected))

    def append(self, pid: int, epoch: int, base: int, count: int) -> KafkaStored:
        b = KafkaStored(self.next_offset, pid, epoch, base, count)
        self.log.append(b)
        return b
