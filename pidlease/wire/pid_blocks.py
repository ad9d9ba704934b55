"""PID blocks: PIDs handed out from blocks reserved on the cluster's one ZooKeeper counter,
``/pid_block`` (``cluster.PID_BLOCK``), by the coordinator (HTTP leases) and by every
partition server (Kafka InitProducerId). One protocol, written once here:

``/pid_block`` holds the next PID nobody has reserved. A reserver takes
``[next, next + block_size)`` by a compare-and-set of that znode on its version, then hands
the block out from memory; so PIDs are unique across all reservers without a ZooKeeper
write per PID, and a reserver that dies merely wastes the rest of its block. PIDs start at
1: 0 means "not idempotent".

The retry limit, ``CAS_ATTEMPTS`` = 1,000, is the same for everyone. A conflict means
another reserver has just taken a whole block, so the conflicts one reservation meets are
bounded by how many reservers race in the same instant (coordinators plus partition
servers: tens), not by load; 1,000 is far above that while still bounding a request
thread that a damaged counter (one whose version changes without its value) would hold:
each attempt is a ZooKeeper read and write, so the coordinator's old 10,000 meant tens of
seconds, longer than any client waits. In ``wire`` because the partition server may not
import ``coordinator`` and both must write the counter the same way."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from pidlease.errors import CoordinatorUnavailable
from pidlease.wire.cluster import PID_BLOCK
from pidlease.wire.protocol import MAX_PID

FIRST_PID = 1
CAS_ATTEMPTS = 1_000


class CounterStore(Protocol):
    """The three counter operations a reservation needs (``coordinator.store.Store`` and
    :class:`ZkCounter` have them; unit tests use an in-memory fake)."""

    def read_counter(self) -> tuple[int | None, int]:
        """(value, version); value None when the counter does not exist yet."""
        ...

    def create_counter(self, value: int) -> bool:
        """Create it with ``value``; False when somebody else created it first."""
        ...

    def cas_counter(self, value: int, version: int) -> bool:
        """Set it to ``value`` if its version is still ``version``; False otherwise."""
        ...


class ZkCounter:
    """:class:`CounterStore` over a blocking kazoo client (the partition server's)."""

    def __init__(self, zk: Any) -> None:
        self._zk = zk

    def read_counter(self) -> tuple[int | None, int]:
        try:
            raw, stat = self._zk.get(PID_BLOCK)
        except NoNodeError:
            return None, -1
        return int(raw), int(stat.version)

    def create_counter(self, value: int) -> bool:
        try:
            self._zk.create(PID_BLOCK, str(value).encode())
        except NodeExistsError:
            return False
        return True

    def cas_counter(self, value: int, version: int) -> bool:
        try:
            self._zk.set(PID_BLOCK, str(value).encode(), version=version)
        except (BadVersionError, NoNodeError):
            return False
        return True


class PidBlocks:
    """Hands out PIDs from reserved blocks. Thread-safe: request threads call
    ``next_pid`` concurrently. ``attempts_max`` is for tests; servers keep the default."""

    def __init__(
        self, store: CounterStore, block_size: int, *, attempts_max: int = CAS_ATTEMPTS
    ) -> None:
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
        # Each retry re-reads the winner's value (see the module docstring for the limit).
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
