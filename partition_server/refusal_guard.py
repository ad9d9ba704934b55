"""The connection refusal guard: a producer's batch refused with a retriable error holds
back that producer's later batches on the same connection until the refused one, and every
one held back behind it, is resent.

Why: a producer pipelines batches N, N+1, ... on one connection. When N is refused with a
retriable error (NOT_LEADER in a transition, UNKNOWN_TOPIC_OR_PARTITION just before the
assignment arrives, SERVER_UNAVAILABLE on a full disk, TOO_MANY_PIDS, SEQUENCE_UNKNOWN)
and the cause clears a moment later, N+1 would be appended while N was not. On a strict
topic the partition refuses N+1 itself (a gap); on a monotonic topic it is appended, and
N's resend is then "at or below the highwater" and answered DUPLICATE: an acknowledged
record that is not in the log. The partition's own rules are the first defence (see
docs/protocol.md); this guard is the second, at the one place that sees the connection's order.

Pure: no sockets, no partitions. The server asks ``blocking`` before it dispatches a
PRODUCE and tells ``note`` about every retriable refusal it answered synchronously.
"""

from __future__ import annotations

from dataclasses import dataclass

# Keys one connection may hold back at once. A producer holds one key per partition it
# writes; past this many the server closes the connection instead of forgetting a key
# (a closed connection applies nothing more, so it is always safe).
GUARD_KEYS_MAX = 4096
# Refused ranges one key may hold (more than an SDK has in flight: ``max_in_flight`` <= 100).
GUARD_RANGES_MAX = 128

PartitionPid = tuple[str, int, int]  # (topic, partition, pid)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The refused range of one producer on one partition, on one connection: from the
    lowest refused base not resent yet to the highest last sequence refused since (at
    dispatch or held back here). The producer resends from its base; a later batch may pass
    without that resend only once the partition holds up to its last
    (``server._refused_range_written``): one held-back batch the partition lacks would
    otherwise become a hole no resend fills."""

    generation: int
    base_sequence: int
    last_sequence: int
    code: int


@dataclass(slots=True)
class _Held:
    """One key's refusals: the generation, the code of the lowest refusal, and each refused
    range not resent yet as flat sorted disjoint [base, last] pairs."""

    generation: int
    code: int
    ranges: list[int]

    def summary(self) -> Refusal:
        return Refusal(self.generation, self.ranges[0], self.ranges[-1], self.code)


class RefusalGuard:
    """Per-connection map (topic, partition, pid) -> the refusals holding its batches back."""

    __slots__ = ("_held", "keys_max", "overflowed")

    def __init__(self, keys_max: int = GUARD_KEYS_MAX) -> None:
        self._held: dict[PartitionPid, _Held] = {}
        self.keys_max = keys_max
        self.overflowed = False  # a refusal could not be recorded: close the connection

    def __len__(self) -> int:
        return len(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def get(self, key: PartitionPid) -> Refusal | None:
        h = self._held.get(key)
        return None if h is None else h.summary()

    def blocking(
        self,
        key: PartitionPid,
        generation: int,
        base_sequence: int,
        last_sequence: int | None = None,
    ) -> Refusal | None:
        """The refusal that holds this batch back, or None (it may be dispatched).

        A batch starting at or below the lowest refused range still held is the producer's
        in-order resend: the refused ranges it covers (up to ``last_sequence``; without it,
        the whole lowest range) are taken as resent, and the entry goes with the last one.
        A later batch waits for the resend of every range refused before it, not only the
        first (issue 23 item 5: the entry used to go at the first resend, so a batch newer
        than the ones held back behind it passed). If the resend is refused again, the
        server notes it again. A newer generation (a takeover) starts from its own fence
        and clears the entry. An older generation passes without clearing: the partition
        fences it, and the newer generation's refusal still stands."""
        h = self._held.get(key)
        if h is None:
            return None
        if generation > h.generation:
            del self._held[key]
            return None
        if generation < h.generation:
            return None
        ranges = h.ranges
        if base_sequence > ranges[0]:
            return h.summary()
        upto = last_sequence if last_sequence is not None else max(base_sequence, ranges[1])
        i = 0
        while i < len(ranges) and ranges[i] <= upto:
            if ranges[i + 1] > upto:
                ranges[i] = upto + 1
                break
            i += 2
        del ranges[:i]
        if not ranges:
            del self._held[key]
        return None

    def clear(self, key: PartitionPid) -> None:
        """Forget a key (the server saw the refused range is written already)."""
        self._held.pop(key, None)

    def note(
        self, key: PartitionPid, generation: int, base_sequence: int, last_sequence: int, code: int
    ) -> None:
        """Record a retriable refusal (answered at dispatch, or a batch this guard held
        back). Per key the newest generation's refusals are kept, each range until it is
        resent; the code is that of the lowest. Past ``GUARD_RANGES_MAX`` ranges of one
        key, or ``keys_max`` keys, nothing is forgotten: ``overflowed`` (the server closes
        the connection, which applies nothing more)."""
        h = self._held.get(key)
        if h is not None and generation < h.generation:
            return
        if h is None or generation > h.generation:
            if h is None and len(self._held) >= self.keys_max:
                self.overflowed = True
                return
            self._held[key] = _Held(generation, code, [base_sequence, last_sequence])
            return
        ranges = h.ranges
        if base_sequence < ranges[0]:
            h.code = code
        i = 0
        while i < len(ranges) and ranges[i + 1] < base_sequence - 1:
            i += 2
        j = i
        lo, hi = base_sequence, last_sequence
        while j < len(ranges) and ranges[j] <= hi + 1:
            lo, hi = min(lo, ranges[j]), max(hi, ranges[j + 1])
            j += 2
        if i == j and len(ranges) >= 2 * GUARD_RANGES_MAX:
            self.overflowed = True
            return
        ranges[i:j] = [lo, hi]
