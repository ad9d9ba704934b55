"""PID blocks: hands out PIDs from blocks reserved on the shared ZooKeeper counter.

``/pid_block`` holds the next PID nobody has reserved. A coordinator reserves
``[next, next + block_size)`` by a compare-and-set of that znode on its version, then
hands the block out from memory; so PIDs are unique across coordinators without a
ZooKeeper write per PID, and a coordinator that dies merely wastes the rest of its block
(blocks of 100 by default, as in Kafka's idempotent-producer design). PIDs start at 1:
0 means "not idempotent".
"""

from __future__ import annotations

import threading
from typing import Protocol

from pidlease.errors import CoordinatorUnavailable
from pidlease.wire.protocol import MAX_PID

FIRST_PID = 1


class CounterStore(Protocol):
    """The three counter operations the allocator needs (``store.Store`` has them; unit
    tests use an in-memory fake)."""

    def read_counter(self) -> tuple[int | None, int]:
        """(value, version); value None when the counter does not exist yet."""
        ...

    def create_counter(self, value: int) -> bool:
        """Create it with ``value``; False when somebody else created it first."""
        ...

    def cas_counter(self, value: int, version: int) -> bool:
        """Set it to ``value`` if its version is still ``version``; False otherwise."""
        ...


class PidAllocator:
    """Thread-safe: request threads call ``next_pid`` concurrently."""

    def __init__(self, store: CounterStore, block_size: int, *, attempts_max: int = 10_000) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._store = store
        self.block_size = block_size
        self._attempts_max = attempts_max
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0  # exclusive; next == end means "no block in hand"
        self.blocks_fetched = 0
        self.cas_conflicts = 0

    def next_pid(self) -> int:
        with self._lock:
            if self._next >= self._end:
                self._next, self._end = self._reserve_block()
                self.blocks_fetched += 1
            pid = self._next
            self._next += 1
            return pid

    @property
    def remaining_in_block(self) -> int:
        with self._lock:
            return self._end - self._next

    def _reserve_block(self) -> tuple[int, int]:
        # Conflicts only happen when coordinators reserve at the same instant, so a bounded
        # number of immediate retries is enough; each retry re-reads the winner's value.
        for _ in range(self._attempts_max):
            value, version = self._store.read_counter()
            if value is None:
                end = FIRST_PID + self.block_size
                if self._store.create_counter(end):
                    return FIRST_PID, end
                self.cas_conflicts += 1
                continue
            if value < FIRST_PID:
                raise CoordinatorUnavailable(
                    f"PID counter holds {value}, below {FIRST_PID}; the ZooKeeper data is damaged"
                )
            end = value + self.block_size
            if end - 1 > MAX_PID:
                raise CoordinatorUnavailable("every 63-bit PID has been handed out")
            if self._store.cas_counter(end, version):
                return value, end
            self.cas_conflicts += 1
        raise CoordinatorUnavailable(
            f"could not reserve a PID block after {self._attempts_max} "
            "compare-and-set conflicts; retry"
        )
