"""The lease rules: what a ``lease_pid`` request means for a PID record, as pure functions.

No ZooKeeper, no sockets, no clock of its own: callers pass ``now_ms`` and the record they
read, and get back either a decision plus the record to write, or a ``PidleaseError``.
This is what the hypothesis state-machine test drives against a tiny reference model;
``service.py`` is the thin shell that does the I/O around it.

A lease's life is ``active -> expiring -> lapsed`` as time passes; a renew or a takeover
brings it back to ``active``. After ``pid_retention_ms`` past expiry the PID is forgotten
(UNKNOWN_PID) and the sweeper deletes its record.
"""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from coordinator.auth import ANONYMOUS_NAME
from pidlease.errors import InvalidRequest, ProducerFenced, UnknownPid
from pidlease.wire.cluster import PidRecord, tp_key
from pidlease.wire.protocol import MAX_GENERATION

NEW_PID = -1


@dataclass
class OwnedPidRecord(PidRecord):
    """A PID record with the principal that first leased it (``owner``). The key is
    written to ZooKeeper only for owners other than ``anonymous`` (the API without
    tokens), so records of an open cluster keep the plain ``PidRecord`` form."""

    owner: str = ANONYMOUS_NAME

    def to_bytes(self) -> bytes:
        d = asdict(self)
        if d["owner"] == ANONYMOUS_NAME:
            del d["owner"]
        return json.dumps(d, separators=(",", ":")).encode()


_RECORD_FIELDS = frozenset(f.name for f in fields(PidRecord))


def record_from_bytes(raw: bytes) -> PidRecord:
    d: dict[str, Any] = json.loads(raw)
    owner = d.pop("owner", None)
    d = {k: v for k, v in d.items() if k in _RECORD_FIELDS}  # keys of a newer version
    if owner is None or owner == ANONYMOUS_NAME:
        return PidRecord(**d)
    return OwnedPidRecord(owner=str(owner), **d)


def owner_of(record: PidRecord) -> str:
    """The principal that first leased the PID (``anonymous`` for records made without
    API tokens, or before owners were recorded)."""
    return getattr(record, "owner", None) or ANONYMOUS_NAME


def _record(owner: str, **kw: Any) -> PidRecord:
    return PidRecord(**kw) if owner == ANONYMOUS_NAME else OwnedPidRecord(owner=owner, **kw)


class LeaseState(enum.Enum):
    ACTIVE = "active"
    EXPIRING = "expiring"
    LAPSED = "lapsed"


class LeaseKind(enum.Enum):
    NEW = "new"
    RENEW = "renew"
    TAKEOVER = "takeover"


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """A validated request (``app.py`` has checked types and ranges)."""

    topic: str
    partition: int
    pid: int = NEW_PID
    expire_ms: int | None = None
    generation: int | None = None
    producer_name: str | None = None

    @property
    def tp(self) -> str:
        return tp_key(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class ExpiryLimits:
    default_ms: int
    min_ms: int
    max_ms: int
    retention_ms: int
    expiring_window_ms: int

    def clamp(self, requested_ms: int | None) -> int:
        if requested_ms is None:
            return self.default_ms
        return max(self.min_ms, min(self.max_ms, requested_ms))


def lease_state(record: PidRecord, now_ms: int, window_ms: int) -> LeaseState:
    """``expiring`` once the time left is at most min(window, expire_ms/2): a producer
    renewing at half its lease never shows as expiring, one that stopped soon does."""
    return state_at(record.expires_at_ms, record.expire_ms, now_ms, window_ms)


def state_at(expires_at_ms: int, expire_ms: int, now_ms: int, window_ms: int) -> LeaseState:
    """``lease_state`` from the two fields it reads (the PID index keeps columns, not
    records)."""
    left_ms = expires_at_ms - now_ms
    if left_ms <= 0:
        return LeaseState.LAPSED
    if left_ms <= min(window_ms, expire_ms // 2):
        return LeaseState.EXPIRING
    return LeaseState.ACTIVE


def retained(record: PidRecord, now_ms: int, retention_ms: int) -> bool:
    """Whether the PID still exists: it is forgotten ``retention_ms`` after its lease lapsed."""
    return now_ms < record.expires_at_ms + retention_ms


def classify(
    req: LeaseRequest, record: PidRecord | None, now_ms: int, limits: ExpiryLimits
) -> LeaseKind:
    """What ``req`` does given the PID's current record (for pid -1 with a producer_name,
    the record of the PID bound to that name, or None). Raises FENCED / UNKNOWN_PID /
    INVALID_REQUEST for requests that change nothing."""
    live = record is not None and retained(record, now_ms, limits.retention_ms)
    if req.pid == NEW_PID:
        if req.generation is not None:
            raise InvalidRequest("generation is only meaningful with a pid; a new lease gets one")
        if req.producer_name is None or not live:
            return LeaseKind.NEW
        return LeaseKind.TAKEOVER
    if not live:
        raise UnknownPid(
            f"pid {req.pid} was never leased or its state has expired; lease a new PID with pid -1"
        )
    assert record is not None
    if req.producer_name is not None and req.producer_name != record.producer_name:
        raise InvalidRequest(f"pid {req.pid} is not bound to producer_name {req.producer_name!r}")
    if req.generation is None:
        return LeaseKind.TAKEOVER
    if req.generation < record.generation:
        raise ProducerFenced(
            f"pid {req.pid} generation {req.generation} is fenced by "
            f"generation {record.generation}",
            current_generation=record.generation,
        )
    if req.generation > record.generation:
        raise InvalidRequest(
            f"generation {req.generation} was never issued for pid {req.pid} "
            f"(current {record.generation})"
        )
    return LeaseKind.RENEW


def _with_partition(
    partitions: dict[str, dict[str, object]], tp: str, now_ms: int
) -> dict[str, dict[str, object]]:
    # ``added_ms``: when the partition joined the lease, or last reported that it holds
    # no state of the PID and lost none (``mark_nothing_lost``; see ``leased_since``).
    out = copy.deepcopy(partitions)
    out.setdefault(tp, {"seen": False, "added_ms": now_ms})
    return out


def new_record(
    req: LeaseRequest,
    pid: int,
    generation: int,
    now_ms: int,
    limits: ExpiryLimits,
    owner: str = ANONYMOUS_NAME,
) -> PidRecord:
    expire_ms = limits.clamp(req.expire_ms)
    return _record(
        owner,
        pid=pid,
        generation=generation,
        producer_name=req.producer_name,
        expire_ms=expire_ms,
        expires_at_ms=now_ms + expire_ms,
        last_use_ms=now_ms,
        created_ms=now_ms,
        partitions={req.tp: {"seen": False, "added_ms": now_ms}},
    )


def renewed(record: PidRecord, req: LeaseRequest, now_ms: int, limits: ExpiryLimits) -> PidRecord:
    expire_ms = limits.clamp(req.expire_ms)
    return _record(
        owner_of(record),
        pid=record.pid,
        generation=record.generation,
        producer_name=record.producer_name,
        expire_ms=expire_ms,
        expires_at_ms=now_ms + expire_ms,
        last_use_ms=now_ms,
        created_ms=record.created_ms,
        partitions=_with_partition(record.partitions, req.tp, now_ms),
    )


def taken_over(
    record: PidRecord, req: LeaseRequest, now_ms: int, limits: ExpiryLimits
) -> PidRecord:
    if record.generation >= MAX_GENERATION:
        raise InvalidRequest(f"pid {record.pid} has used every generation; lease a new PID")
    out = renewed(record, req, now_ms, limits)
    out.generation = record.generation + 1
    return out


def apply(
    kind: LeaseKind, record: PidRecord, req: LeaseRequest, now_ms: int, limits: ExpiryLimits
) -> PidRecord:
    """The record to write for a RENEW or TAKEOVER of ``record``."""
    if kind is LeaseKind.RENEW:
        return renewed(record, req, now_ms, limits)
    if kind is LeaseKind.TAKEOVER:
        return taken_over(record, req, now_ms, limits)
    raise ValueError("NEW has no previous record; use new_record")


def leased_since(record: PidRecord | None, tp: str, clock_skew_max_ms: int) -> int:
    """No later than when partition ``tp`` joined ``record``'s lease, by a partition
    server's clock that may lag ours by up to ``clock_skew_max_ms``; 0 when ``tp`` is not in
    the lease (joining now: nothing of this PID can have been dropped there). Records from
    before ``added_ms`` use the PID's creation time, the earliest the partition can have
    joined."""
    if record is None or tp not in record.partitions:
        return 0
    added = record.partitions[tp].get("added_ms", record.created_ms)
    return max(1, int(added) - clock_skew_max_ms)


def may_have_lost_state(dropped_last_use_max_ms: int, leased_since_ms: int) -> bool:
    """Whether a partition with no state for a PID may have dropped it: it dropped some PID
    last used at or after the PID's lease of it began (0: not known, judged as before).
    The server applies the same test before creating an entry on a takeover's FENCE."""
    return leased_since_ms > 0 and dropped_last_use_max_ms >= leased_since_ms


def recorded_highwater(record: PidRecord | None, tp: str) -> int:
    """The highest durable highwater a leader of ``tp`` reported for the PID and this
    coordinator recorded (``mark_seen``); -1 when none was."""
    if record is None:
        return -1
    entry = record.partitions.get(tp)
    if not entry or not entry.get("seen"):
        return -1
    return int(entry.get("highwater", -1))


def next_sequence(
    pid: int,
    tp: str,
    seen: bool,
    found: bool,
    durable_highwater: int,
    *,
    dropped_last_use_max_ms: int = 0,
    leased_since_ms: int = 0,
    recorded_highwater: int = -1,
) -> int:
    """The sequence a producer must send next to a partition, from its leader's answer.

    "No state" on a partition where a leader once reported state means the server expired
    it: answering 0 would make a replayable source resend what is already in the log. The
    same holds where no leader reported state yet (the PID wrote and died before its first
    renewal) if the partition dropped a PID used since this one's lease of it began.

    State found with a durable highwater below the one a leader reported before
    (``recorded_highwater``) was rebuilt without some of the PID's batches (issue 23,
    finding 2: a fence alone after retention and a cut): sequences up to the recorded
    highwater are in the log, so resuming below it would write them again. Durable
    highwaters never go back on a partition that kept the PID's state, so that is
    UNKNOWN_PID, never a sequence at or below the recorded highwater."""
    if found:
        if durable_highwater < recorded_highwater:
            raise UnknownPid(
                f"partition {tp} reports pid {pid}'s durable highwater as "
                f"{durable_highwater}, below the {recorded_highwater} its leader reported "
                "before: the partition lost part of this PID's state; lease a new PID and "
                "resume from your own checkpoint"
            )
        return durable_highwater + 1
    if seen:
        raise UnknownPid(
            f"partition {tp} no longer holds state for pid {pid} (expired on the "
            "server); lease a new PID and resume from your own checkpoint"
        )
    if may_have_lost_state(dropped_last_use_max_ms, leased_since_ms):
        raise UnknownPid(
            f"partition {tp} holds no state for pid {pid} and has expired PIDs "
            "used since this PID's lease of it began, so its state may have been "
            "among them; lease a new PID and resume from your own checkpoint"
        )
    return 0


def mark_nothing_lost(record: PidRecord, tp: str, checked_ms: int) -> PidRecord:
    """The leader of unseen partition ``tp`` answered, asked at ``checked_ms``, that it holds
    no state for the PID and dropped none it might have had (``next_sequence`` returned 0):
    from then on ``added_ms`` counts from ``checked_ms``. So a producer that renews a
    partition it never writes to is judged only by what the partition dropped since its
    last renewal, not since its lease began days ago (which would fail it with UNKNOWN_PID
    once any PID used around then expired there)."""
    entry = record.partitions.get(tp)
    if entry is None or entry.get("seen") or entry.get("added_ms", -1) >= checked_ms:
        return record
    out = copy.deepcopy(record)
    _mark_nothing_lost_in(out.partitions, tp, checked_ms)
    return out


def _mark_nothing_lost_in(partitions: dict[str, dict[str, object]], tp: str, at_ms: int) -> None:
    entry = partitions.get(tp)
    if entry is None or entry.get("seen"):
        return
    added = entry.get("added_ms", -1)
    if not isinstance(added, int) or added < at_ms:
        entry["added_ms"] = at_ms


def mark_seen(record: PidRecord, tp: str, highwater: int) -> PidRecord:
    """A leader reported durable ``highwater`` for the PID on ``tp``. The recorded value
    never goes down: a lower report is a partition that lost state (``next_sequence``
    answers UNKNOWN_PID for it), and recording it would make the loss pass later."""
    out = copy.deepcopy(record)
    _mark_seen_in(out.partitions, tp, highwater)
    return out


def _mark_seen_in(partitions: dict[str, dict[str, object]], tp: str, highwater: int) -> None:
    entry = partitions.get(tp) or {}
    before = entry.get("highwater", -1) if entry.get("seen") else -1
    partitions[tp] = {
        "seen": True,
        "highwater": max(highwater, before if isinstance(before, int) else -1),
    }


@dataclass(frozen=True, slots=True)
class LeaderState:
    """A partition leader's PRODUCER_STATE answer for the PID, as a renewal reads it."""

    found: bool
    durable_highwater: int = -1
    dropped_last_use_max_ms: int = 0


def renew_sequence(record: PidRecord, tp: str, state: LeaderState, clock_skew_max_ms: int) -> int:
    """The sequence a renewal of ``record`` (as read, before the renewal) answers for
    ``tp``, from its leader's state (``next_sequence`` with what the record says of ``tp``)."""
    return next_sequence(
        record.pid,
        tp,
        bool(record.partitions.get(tp, {}).get("seen", False)),
        state.found,
        state.durable_highwater,
        dropped_last_use_max_ms=state.dropped_last_use_max_ms,
        leased_since_ms=leased_since(record, tp, clock_skew_max_ms),
        recorded_highwater=recorded_highwater(record, tp),
    )


def renewed_round(
    record: PidRecord,
    expire_ms: int | None,
    answered: Mapping[str, LeaderState],
    now_ms: int,
    checked_ms: int,
    limits: ExpiryLimits,
) -> PidRecord:
    """The record after a renewal round: the lease pushed out once, and every partition of
    ``answered`` (the renewals of the round that succeeded, with what their leaders said,
    asked at ``checked_ms``) added, marked seen with its highwater, or marked as having
    lost nothing. One record for the whole round, so a producer of N partitions writes its
    PID record once per renewal, not N times (issue 30, item 6)."""
    parts = copy.deepcopy(record.partitions)
    for tp, state in answered.items():
        parts.setdefault(tp, {"seen": False, "added_ms": now_ms})
        if state.found and state.durable_highwater >= 0:
            _mark_seen_in(parts, tp, state.durable_highwater)
        elif not state.found:
            _mark_nothing_lost_in(parts, tp, checked_ms)
    clamped = limits.clamp(expire_ms)
    return _record(
        owner_of(record),
        pid=record.pid,
        generation=record.generation,
        producer_name=record.producer_name,
        expire_ms=clamped,
        expires_at_ms=now_ms + clamped,
        last_use_ms=now_ms,
        created_ms=record.created_ms,
        partitions=parts,
    )


@dataclass(frozen=True, slots=True)
class FenceAnswer:
    """A partition leader's answer to a takeover's FENCE: whether the PID had state there
    (``existed``), whether the fence created a fresh entry (``created``: the server judged
    that nothing it dropped can have been this PID's), the durable highwater after the
    fence, and the server's ``dropped_last_use_max_ms``. Neither existed nor created: the
    fence wrote nothing (no state there, and creating one could hide a loss)."""

    existed: bool
    created: bool
    durable_highwater: int = -1
    dropped_last_use_max_ms: int = 0

    @property
    def fenced(self) -> bool:
        """The partition now holds the new generation: a holder of an older one is refused."""
        return self.existed or self.created


NOT_FENCED = FenceAnswer(existed=False, created=False)


def takeover_sequence(
    record: PidRecord,
    tp: str,
    answers: Mapping[str, FenceAnswer],
    leased_since_ms: Mapping[str, int],
    untracked: Collection[str] = (),
) -> int:
    """The sequence a takeover answers for partition ``tp``, from the FENCE answers of every
    partition of the PID's lease (``record`` is the record the takeover wrote; ``untracked``
    are partitions of ``dedup=off`` topics, which keep no producer state and need no fence).

    A takeover answers OK only when every leased partition holds the new generation: one
    left unfenced (no state there, and the server may not create it) would let the old
    holder go on appending there with the old generation (on a monotonic topic, any
    sequence), although the takeover said it was fenced. Such a partition makes the whole
    takeover UNKNOWN_PID (the PID's state there may be lost; the contract's answer for
    that), never OK. The requested partition is judged first, by ``next_sequence``."""
    mine = answers.get(tp, NOT_FENCED)
    seq = next_sequence(
        record.pid,
        tp,
        bool(record.partitions.get(tp, {}).get("seen", False)),
        mine.fenced,
        mine.durable_highwater if mine.fenced else -1,
        dropped_last_use_max_ms=mine.dropped_last_use_max_ms,
        leased_since_ms=leased_since_ms.get(tp, 0),
        recorded_highwater=recorded_highwater(record, tp),
    )
    for other in unfenced(answers, untracked, also=[tp, *record.partitions]):
        raise UnknownPid(
            f"takeover of pid {record.pid}: partition {other} holds no state for it and "
            "may not create one (the PID's state there may have been dropped), so it cannot "
            "be fenced and the old holder could still write there; lease a new PID and "
            "resume from your own checkpoint"
        )
    return seq


def unfenced(
    answers: Mapping[str, FenceAnswer], untracked: Collection[str], also: Iterable[str] = ()
) -> list[str]:
    """The partitions (of ``answers`` and ``also``) that keep producer state and whose
    fence did not make them hold the new generation (no answer counts as not), in order."""
    tps = sorted(set(answers) | set(also))
    return [t for t in tps if t not in untracked and not answers.get(t, NOT_FENCED).fenced]
