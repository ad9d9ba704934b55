"""The append rules of one partition (docs/protocol.md, PRODUCE), as readable code.

Specification: ``tests/unit/server/append_rules_model.py``, the reference model written from the
contract's table row by row (not from this code); the property test
``tests/unit/server/test_producer_state_property.py`` holds the table to it and holds
``ProducerStateTable.check_append`` (the fast twin, inline in the column storage of
``producer_state.py``) to ``check_append`` here, answer for answer. Read this module to
learn the rules; change both twins together.

A partition keeps per PID the generation, the highwater H (last sequence appended), the
durable highwater (last sequence fsynced) and the last K batches (for DUPLICATE answers
with the offsets they were first written at). The rules read them through ``PidView``.

Checking and applying are split: the partition checks a batch, writes it to its log only on
APPEND, then applies it to the table with the offset it got. Replaying the log after a
restart goes through the same ``apply_*`` methods, so a recovered table is the table before
the crash.

Strict topics accept only H+1, so a batch after a refused one is refused
(OUT_OF_ORDER_SEQUENCE, retried by the SDK as a consequence), and every sequence at or below
H was written, whatever the batch boundaries of a resend: a whole batch at or below the
durable highwater is DUPLICATE (offsets when it matches a kept batch exactly, else -1); at
or below H but above the durable highwater it is SEQUENCE_UNKNOWN (retry once durable).

Monotonic topics: a refusal leaves no hole. Holes between batches are allowed there, so "at
or below the highwater" does not prove a batch was written: if batch N is refused for a
reason the rules did not decide (full disk, TOO_MANY_PIDS; the partition reports it with
``note_refused``) while N+1, already in flight, is appended, the resend of N would look
like an old batch. So:

- a refused batch blocks its PID: a later batch whose base is above the lowest refused
  range not resent yet is refused SEQUENCE_UNKNOWN (retriable, expected sequence = that
  range's base), and is itself a refused range then (the table records it,
  ``ProducerStateTable.check_append``); each range is resent once a batch reaching it is
  appended, and the block lifts only when every refused range is (not at the first
  resend: issue 23 item 5), or when a takeover (a fence with a newer generation: the
  new holder resumes after the highwater) abandons them all;
- DUPLICATE is answered only for a range the partition wrote: a kept batch (an exact
  match, with its offsets), or a range every sequence of which is held by a kept batch
  or older than every kept batch, the latter only outside the ranges takeovers gave up
  (from a blocked base to where the new holder resumed; offset -1). Any other batch
  wholly at or below the durable highwater was never written and never can be:
  OUT_OF_ORDER_SEQUENCE, expected highwater + 1 (above the durable highwater it is
  SEQUENCE_UNKNOWN first, as on strict topics).

A PID with no state: sequence 0 (strict) or any sequence (monotonic) creates it, unless the
partition is full and no PID may be evicted (TOO_MANY_PIDS, leader only); any other batch is
UNKNOWN_PID. An older generation is FENCED. Dedup ``off`` and PID 0 are never checked.

Kafka batches (generation >= ``KAFKA_GENERATION_BASE``: epoch ``e`` is generation
``KAFKA_GENERATION_BASE + e``, protocol.py) follow Kafka's idempotence rules on every topic
whose dedup is not ``off`` (``check_kafka_append``): an older epoch is FENCED (Kafka's
INVALID_PRODUCER_EPOCH); a newer epoch must start at sequence 0 (the client's own epoch
bump), else OUT_OF_ORDER; the same epoch takes exactly last+1, wrapping at 2**31, else
OUT_OF_ORDER, except that a batch equal to one of the last K of this epoch is DUPLICATE
with its offsets (the caller answers it once those offsets are committed: durability is
by offset here, not by sequence); no state: sequence 0 creates it, else UNKNOWN_PID; a PID
whose state is ours (a generation below the base: leased over HTTP) is UNKNOWN_PID too, never
taken over by a Kafka epoch (which would fence its producer for good). These
rules take only last+1, so a refusal can never leave a hole, on monotonic topics too.

The table keeps a Kafka PID's sequences as *positions*: ``kafka_position(epoch, n)``, with
``n`` the count of records of that epoch before it (its sequence unwrapped), so positions
grow by one per record across wraps and epoch bumps, H + 1 is always the next batch's
position, and everything the table does with sequences (kept batches, durable highwater,
snapshots, replay) works unchanged. A Kafka sequence is ``position % 2**31``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from pidlease.wire.protocol import KAFKA_GENERATION_BASE

# Positions of one Kafka epoch: 2**40 apart (about 10**12 records, 512 wraps of the int16
# epoch's 2**31 sequences, per epoch; the 32768 epochs end below 2**55, within our i64).
KAFKA_EPOCH_SHIFT = 40
KAFKA_SEQUENCE_MOD = 2**31

DEDUP_MODES = ("strict", "monotonic", "off")


class Outcome(enum.Enum):
    APPEND = "APPEND"
    DUPLICATE = "DUPLICATE"
    FENCED = "FENCED"
    UNKNOWN_PID = "UNKNOWN_PID"
    SEQUENCE_UNKNOWN = "SEQUENCE_UNKNOWN"
    OUT_OF_ORDER = "OUT_OF_ORDER_SEQUENCE"
    TOO_MANY_PIDS = "TOO_MANY_PIDS"


class FenceOutcome(enum.Enum):
    APPEND = "APPEND"  # write a control batch, answer when durable
    SAME = "SAME"  # generation already current: OK, nothing written
    ABSENT = "ABSENT"  # no state and no create_if_absent: OK existed=false
    FENCED = "FENCED"  # older generation


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    expected_sequence: int = -1
    base_offset: int = -1  # DUPLICATE: where the batch was first written, when known
    last_offset: int = -1
    detail: str = ""


APPEND = Decision(Outcome.APPEND)


class PidView(Protocol):
    """What the rules read of a partition's producer state (``ProducerStateTable``)."""

    mode: str

    def generation(self, pid: int) -> int | None:
        """The PID's generation, or None when it has no state here."""

    def highwater(self, pid: int) -> int: ...

    def durable_highwater(self, pid: int) -> int: ...

    def kept_batches(self, pid: int) -> list[tuple[int, int, int]]:
        """(base_seq, last_seq, base_offset) of the last K batches, oldest first."""

    def blocked_from(self, pid: int) -> int | None:
        """Monotonic: the lowest sequence of the PID refused and not resent, or None."""

    def abandoned_ranges(self, pid: int) -> list[tuple[int, int]]:
        """Monotonic: the [lo, hi) sequence ranges takeovers gave up (hi -1: open)."""

    def room_for_new_pid(self, now_ms: int) -> bool: ...

    def limit_detail(self) -> str: ...


def check_append(
    view: PidView, pid: int, generation: int, base_seq: int, count: int, now_ms: int | None = None
) -> Decision:
    """The decision for a batch of ``count`` records from ``base_seq``. ``now_ms`` is given
    only by a leader deciding a new append: then the tracked-PID limit is checked."""
    if pid == 0 or view.mode == "off":
        return APPEND
    if generation >= KAFKA_GENERATION_BASE:
        return check_kafka_append(view, pid, generation, base_seq, count, now_ms)
    last_seq = base_seq + count - 1
    current = view.generation(pid)
    blocked = view.blocked_from(pid)
    if blocked is not None and base_seq > blocked:
        refused_earlier = current is None or (
            generation >= current and base_seq > view.highwater(pid)
        )
        if refused_earlier:
            return Decision(
                Outcome.SEQUENCE_UNKNOWN,
                expected_sequence=blocked,
                detail=(
                    f"an earlier batch of pid {pid} (from sequence {blocked}) was refused; "
                    f"resend it first (this batch has sequences {base_seq}..{last_seq})"
                ),
            )
    if current is None:
        return _check_new_pid(view, pid, base_seq, now_ms)
    if generation < current:
        return Decision(
            Outcome.FENCED,
            detail=(f"generation {generation} of pid {pid} is older than the current {current}"),
        )
    h = view.highwater(pid)
    if base_seq == h + 1 or (view.mode == "monotonic" and base_seq > h):
        return APPEND
    if last_seq > h:
        return Decision(
            Outcome.OUT_OF_ORDER,
            expected_sequence=h + 1,
            detail=(f"batch has sequences {base_seq}..{last_seq}, expected {h + 1} next"),
        )
    if last_seq > view.durable_highwater(pid):
        return Decision(
            Outcome.SEQUENCE_UNKNOWN,
            expected_sequence=h + 1,
            detail=(f"sequences {base_seq}..{last_seq} are appended but not yet durable; retry"),
        )
    return _check_old(view, pid, base_seq, last_seq, h)


def _check_new_pid(view: PidView, pid: int, base_seq: int, now_ms: int | None) -> Decision:
    if view.mode == "monotonic" or base_seq == 0:
        if now_ms is not None and not view.room_for_new_pid(now_ms):
            return Decision(Outcome.TOO_MANY_PIDS, detail=view.limit_detail())
        return APPEND
    return Decision(
        Outcome.UNKNOWN_PID,
        detail=(
            f"pid {pid} has no state in this partition and its batch starts at sequence "
            f"{base_seq}, not 0: the state expired or the PID was never leased here"
        ),
    )


def _check_old(view: PidView, pid: int, base_seq: int, last_seq: int, h: int) -> Decision:
    """A batch wholly at or below the durable highwater."""
    kept = view.kept_batches(pid)
    for b_base, b_last, b_off in kept:
        if (b_base, b_last) == (base_seq, last_seq):
            return Decision(
                Outcome.DUPLICATE,
                base_offset=b_off,
                last_offset=b_off + last_seq - base_seq,
                detail="batch was already written",
            )
    if view.mode != "monotonic":
        # Strict: every sequence at or below H was written.
        return Decision(
            Outcome.DUPLICATE, detail="batch was already written (offsets no longer known)"
        )
    oldest = kept[0][0] if kept else None
    older_written = True
    if oldest is None or base_seq < oldest:
        below_kept_hi = last_seq if oldest is None else min(last_seq, oldest - 1)
        older_written = not any(
            meets(lo, hi, base_seq, below_kept_hi) for lo, hi in view.abandoned_ranges(pid)
        )
    if covered(kept, base_seq, last_seq, older_written):
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


def meets(range_lo: int, range_hi: int, lo: int, hi: int) -> bool:
    """Whether ``lo..hi`` (inclusive) meets the range [range_lo, range_hi) (-1: no end)."""
    return hi >= range_lo and (range_hi == -1 or lo < range_hi)


def covered(
    kept: list[tuple[int, int, int]], base_seq: int, last_seq: int, older_written: bool
) -> bool:
    """Whether every sequence of ``base_seq..last_seq`` was written: held by a kept batch,
    or, when ``older_written``, older than all of them."""
    for seq in range(base_seq, last_seq + 1):
        older = not kept or seq < kept[0][0]
        held = any(b <= seq <= last for b, last, _ in kept)
        if not (held or (older and older_written)):
            return False
    return True


def kafka_position(generation: int, unwrapped: int) -> int:
    """The table's sequence for record ``unwrapped`` (0, 1, ...) of a Kafka epoch."""
    return ((generation - KAFKA_GENERATION_BASE) << KAFKA_EPOCH_SHIFT) + unwrapped


def kafka_base_position(
    current_generation: int | None, highwater: int, generation: int, base_seq: int
) -> int:
    """The position a Kafka batch (``generation``, ``base_seq``) takes in a PID whose state
    is (``current_generation``, ``highwater``): H + 1 when it goes on from H in the same
    epoch (whatever the wraps before), else the epoch's start plus ``base_seq`` (a new PID or
    a newer epoch: base 0 by the rules; replay takes the log as it is). Shared by both twins
    and by replay: how sequences are stored, not what is accepted."""
    start = kafka_position(generation, 0)
    if current_generation == generation and highwater >= start:
        if (highwater + 1 - start) % KAFKA_SEQUENCE_MOD == base_seq:
            return highwater + 1
        # Not the next one (only replay of an odd log gets here): the next position at or
        # after H + 1 that is this sequence.
        skip = (base_seq - (highwater + 1 - start)) % KAFKA_SEQUENCE_MOD
        return highwater + 1 + skip
    return start + base_seq


def leased_over_our_protocol(pid: int, generation: int) -> str:
    return (
        f"producer id {pid} is leased over the pidlease protocol (generation {generation}); "
        "a Kafka producer may not use it: get a producer id from InitProducerId"
    )


def check_kafka_append(
    view: PidView, pid: int, generation: int, base_seq: int, count: int, now_ms: int | None
) -> Decision:
    """Kafka's rules for a Kafka batch (see the module docstring)."""
    current = view.generation(pid)
    last_seq = (base_seq + count - 1) % KAFKA_SEQUENCE_MOD
    if current is None:
        if base_seq != 0:
            return Decision(
                Outcome.UNKNOWN_PID,
                detail=(
                    f"producer {pid} has no state in this partition and its batch starts at "
                    f"sequence {base_seq}, not 0"
                ),
            )
        if now_ms is not None and not view.room_for_new_pid(now_ms):
            return Decision(Outcome.TOO_MANY_PIDS, detail=view.limit_detail())
        return APPEND
    if current < KAFKA_GENERATION_BASE:
        return Decision(Outcome.UNKNOWN_PID, detail=leased_over_our_protocol(pid, current))
    epoch = generation - KAFKA_GENERATION_BASE
    if generation < current:
        return Decision(
            Outcome.FENCED,
            detail=f"epoch {epoch} of producer {pid} is older than the current one",
        )
    if generation > current:
        if base_seq == 0:
            return APPEND
        return Decision(
            Outcome.OUT_OF_ORDER,
            expected_sequence=0,
            detail=f"a new epoch ({epoch}) of producer {pid} must start at sequence 0",
        )
    start = kafka_position(generation, 0)
    h = view.highwater(pid)
    expected = (h + 1 - start) % KAFKA_SEQUENCE_MOD if h >= start else 0
    if base_seq == expected:
        return APPEND
    for b_base, b_last, b_off in view.kept_batches(pid):
        if b_base >= start and (b_base % KAFKA_SEQUENCE_MOD, b_last % KAFKA_SEQUENCE_MOD) == (
            base_seq,
            last_seq,
        ):
            return Decision(
                Outcome.DUPLICATE,
                base_offset=b_off,
                last_offset=b_off + count - 1,
                detail="batch was already written",
            )
    return Decision(
        Outcome.OUT_OF_ORDER,
        expected_sequence=expected,
        detail=f"batch has sequences {base_seq}..{last_seq}, expected {expected} next",
    )


def check_fence(view: PidView, pid: int, generation: int, create_if_absent: bool) -> FenceOutcome:
    """The decision for a fence (a takeover by ``generation``)."""
    if pid == 0 or view.mode == "off":
        return FenceOutcome.ABSENT  # dedup off: no generations to fence
    current = view.generation(pid)
    if current is None:
        return FenceOutcome.APPEND if create_if_absent else FenceOutcome.ABSENT
    if generation < current:
        return FenceOutcome.FENCED
    if generation == current:
        return FenceOutcome.SAME
    return FenceOutcome.APPEND
