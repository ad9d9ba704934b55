"""The leader's bytes-per-second budget for the catch-up fetches of moving replicas
(issue 27: "throttled so producers keep their throughput"; Kafka's
``leader.replication.throttled.rate``).

A replica is *moving* while its partition is mid-move (the move's add step made the
replica list longer than the topic's replication factor: coordinator/moves.py) and it is
not in the in-sync set: the new replica catching up, or an old one that fell behind
meanwhile. Only those fetches are throttled; in-sync followers, and followers catching up
on a partition that is not moving (a restarted server), fetch as fast as they can, so
neither the producers' acks nor the redundancy after a crash wait on a rebalance.

One token bucket per server (every moving replica it leads shares the rate): it holds at
most one second of the rate, a read takes what it sent (the bucket may go below zero by
the last read's overshoot: a read returns at least one whole batch), and a fetch that
finds the bucket empty waits for it to refill, up to its wait. Pure: the caller passes the
clock (the replica manager passes its module's ``time.monotonic``, which the simulation
replaces: tests/unit/repo/test_sim_seam.py).
"""

from __future__ import annotations

from collections.abc import Callable


def is_moving(replicas: list[int], isr: list[int], replication_factor: int, replica: int) -> bool:
    """``replica`` fetches for a move: its partition holds more replicas than the topic's
    factor (between a move's add and remove steps) and it is not in sync."""
    return len(replicas) > replication_factor and replica not in isr


class MoveThrottle:
    def __init__(self, bytes_per_s: int, *, clock: Callable[[], float]) -> None:
        self.rate = max(0, bytes_per_s)  # 0: no throttle
        self.clock = clock
        self.tokens = float(self.rate)
        self._at = clock()
        self.throttled_bytes = 0  # sent to moving replicas (a metric)
        self.waits = 0  # fetches that waited for the bucket

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(float(self.rate), self.tokens + (now - self._at) * self.rate)
        self._at = now

    def allowance(self, want: int) -> int:
        """How many bytes a moving replica's read may ask for now (0: wait first)."""
        if not self.enabled:
            return want
        self._refill()
        return max(0, min(want, int(self.tokens)))

    def wait_s(self) -> float:
        """How long until the bucket holds a byte again (0 when it does)."""
        if not self.enabled:
            return 0.0
        self._refill()
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def spent(self, n: int) -> None:
        """A moving replica was sent ``n`` bytes."""
        self.throttled_bytes += n
        if self.enabled:
            self._refill()
            self.tokens -= n
