"""The connection refusal guard: a producer's batch refused with a retriable error holds
back that producer's later batches on the same connection until the refused one is resent.

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

Key = tuple[str, int, int]  # (topic, partition, pid)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The refused range of one producer on one partition, on one connection: from the
    lowest refused base to the highest last sequence refused since (at dispatch or held
    back here). The producer resends from its base; a later batch may pass without that
    resend only once the partition holds up to its last (``server._refused_range_written``):
    one held-back batch the partition lacks would otherwise become a hole no resend fills."""

    generation: int
    base_sequence: int
    last_sequence: int
    code: int


class RefusalGuard:
    """Per-connection map (topic, partition, pid) -> the refusal holding its batches back."""

    __slots__ = ("_held", "keys_max", "overflowed")

    def __init__(self, keys_max: int = GUARD_KEYS_MAX) -> None:
        self._held: dict[Key, Refusal] = {}
        self.keys_max = keys_max
        self.overflowed = False  # a refusal could not be recorded: close the connection

    def __len__(self) -> int:
        return len(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def get(self, key: Key) -> Refusal | None:
        return self._held.get(key)

    def blocking(self, key: Key, generation: int, base_sequence: int) -> Refusal | None:
        """The refusal that holds this batch back, or None (it may be dispatched).

        A batch starting at or below the refused base is the producer's in-order resend:
        it clears the entry. A newer generation (a takeover) starts from its own fence and
        clears it too. An older generation passes without clearing: the partition fences
        it, and the newer generation's refusal still stands."""
        r = self._held.get(key)
        if r is None:
            return None
        if generation > r.generation or (
            generation == r.generation and base_sequence <= r.base_sequence
        ):
            del self._held[key]
            return None
        if generation < r.generation:
            return None
        return r

    def clear(self, key: Key) -> None:
        """Forget a key (the server saw the refused range is written already)."""
        self._held.pop(key, None)

    def note(
        self, key: Key, generation: int, base_sequence: int, last_sequence: int, code: int
    ) -> None:
        """Record a retriable refusal (answered at dispatch, or a batch this guard held
        back). The lowest refused base of the newest generation is kept: everything above
        it waits for its resend; the range grows to the highest refused last sequence."""
        r = self._held.get(key)
        if r is not None:
            if generation < r.generation:
                return
            if generation == r.generation:
                last = max(last_sequence, r.last_sequence)
                if base_sequence >= r.base_sequence:
                    if last > r.last_sequence:
                        self._held[key] = Refusal(r.generation, r.base_sequence, last, r.code)
                    return
                last_sequence = last
        elif len(self._held) >= self.keys_max:
            self.overflowed = True
            return
        self._held[key] = Refusal(generation, base_sequence, last_sequence, code)
