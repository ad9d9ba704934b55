"""What a coordinator remembers between leases so that a renewal costs one ZooKeeper write.

A renewal used to read the PID's record, the partition's state and the leader's server
entry from ZooKeeper, ask the leader for the producer's state, and write the record back:
four ZooKeeper round trips, each costing this process about 0.4 ms of CPU in kazoo. Two
caches remove three of them:

- ``RecordCache``: the record and znode version this coordinator last read or wrote for a
  PID. It is never trusted for a decision on its own: every change is a compare-and-set on
  the cached version, so if another coordinator (or the sweeper) changed or deleted the
  record meanwhile the write fails and the lease is decided again on a fresh read. An
  error decided on a cached record is also re-checked on a fresh read before it is sent.
- ``AddressCache``: "host:port" of each partition's leader, kept ``ttl_ms``. A stale entry
  can only send the read-only PRODUCER_STATE call to a server that is no longer leader;
  that server answers NOT_LEADER (or cannot be reached), the entry is dropped and the call
  is made again on fresh ZooKeeper data. Takeovers (FENCE) never use it.

Both are bounded and thread-safe (request threads share them).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from pidlease.wire.cluster import PidRecord


class RecordCache:
    def __init__(self, entries_max: int) -> None:
        self.entries_max = entries_max
        self._lock = threading.Lock()
        self._data: OrderedDict[int, tuple[PidRecord, int]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, pid: int) -> tuple[PidRecord, int] | None:
        with self._lock:
            got = self._data.get(pid)
            if got is None:
                self.misses += 1
                return None
            self._data.move_to_end(pid)
            self.hits += 1
            return got

    def peek(self, pid: int) -> PidRecord | None:
        """The cached record, without counting a hit or a miss or moving it (the PID
        views' freshening, ``pid_index.py``)."""
        got = self._data.get(pid)
        return None if got is None else got[0]

    def put(self, record: PidRecord, version: int) -> None:
        if self.entries_max <= 0:
            return
        with self._lock:
            current = self._data.get(record.pid)
            # Never replace a newer version by an older one (two threads finishing out of order).
            if current is not None and current[1] > version:
                return
            self._data[record.pid] = (record, version)
            self._data.move_to_end(record.pid)
            while len(self._data) > self.entries_max:
                self._data.popitem(last=False)

    def drop(self, pid: int) -> None:
        with self._lock:
            self._data.pop(pid, None)

    def __len__(self) -> int:
        return len(self._data)


class AddressCache:
    def __init__(self, ttl_ms: float, *, clock_s: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_ms / 1000
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._data: dict[str, tuple[str, float]] = {}

    def get(self, tp: str) -> str | None:
        if self.ttl_s <= 0:
            return None
        with self._lock:
            got = self._data.get(tp)
        if got is None or got[1] < self._clock_s():
            return None
        return got[0]

    def put(self, tp: str, address: str) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            self._data[tp] = (address, self._clock_s() + self.ttl_s)

    def drop(self, tp: str) -> None:
        with self._lock:
            self._data.pop(tp, None)
