"""The coordinator's write batcher (group commit of ZooKeeper writes) and its lease caches,
against in-memory fakes. The real-ZooKeeper behaviour is in
tests/integration/test_coordinator_lease_cache.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordinator.lease_cache import AddressCache, RecordCache
from coordinator.zk_batch import WriteBatcher
from pidlease.errors import CoordinatorUnavailable
from pidlease.wire.cluster import PidRecord
from tests.sim.zk import FakeZk


class Zk:
    """The one fake ZooKeeper (tests/sim/zk.py), with ``/pids``; ``gate`` holds each request
    "in ZooKeeper" while clear; ``down`` makes every wait fail as an unreachable ensemble."""

    def __init__(self) -> None:
        self.zk = FakeZk()
        self.zk.create("/pids", b"")
        self.client = self.zk.client("coordinator")
        self.gate = threading.Event()
        self.gate.set()
        self.zk.before_request = lambda: self.gate.wait(5)
        self.down = False

    def node(self, path: str) -> tuple[bytes, int]:
        z = self.zk.nodes[path]
        return z.data, z.version

    def wait(self, result: Any) -> Any:
        if self.down:
            raise CoordinatorUnavailable("ZooKeeper unavailable")
        return result.get()


def test_writes_queued_behind_one_in_flight_go_out_as_one_multi() -> None:
    zk = Zk()
    b = WriteBatcher(zk.client, zk.wait, batch_max=64)
    try:
        zk.gate.clear()  # the first write blocks "in ZooKeeper"
        first = b.submit("/pids/1", b"a", None)
        # While it is in flight, 20 more arrive.
        futs = [b.submit(f"/pids/{i}", b"x", None) for i in range(2, 22)]
        threading.Event().wait(0.05)
        zk.gate.set()
        assert first.result(5) is True
        assert all(f.result(5) is True for f in futs)
        assert set(zk.zk.children("/pids")) == {str(i) for i in range(1, 22)}
        assert zk.zk.ops < 21, zk.zk.multi_sizes  # fewer requests than writes
        assert max(zk.zk.multi_sizes) >= 2
    finally:
        b.stop()


def test_one_failing_write_does_not_fail_its_batch_neighbours() -> None:
    zk = Zk()
    zk.zk.create("/pids/5", b"old")
    zk.zk.nodes["/pids/5"].version = 3
    b = WriteBatcher(zk.client, zk.wait)
    try:
        zk.gate.clear()
        blocker = b.submit("/pids/100", b"z", None)
        good = [b.submit(f"/pids/{i}", b"n", None) for i in range(10, 15)]
        dup = b.submit("/pids/5", b"again", None)  # exists: NodeExistsError
        stale = b.submit("/pids/5", b"cas", 2)  # version moved: BadVersionError
        fresh = b.submit("/pids/5", b"cas", 3)  # right version: applies
        gone = b.submit("/pids/6", b"cas", 0)  # NoNodeError
        zk.gate.set()
        assert blocker.result(5) and all(f.result(5) for f in good)
        with pytest.raises(NodeExistsError):
            dup.result(5)
        with pytest.raises(BadVersionError):
            stale.result(5)
        assert fresh.result(5) is True
        with pytest.raises(NoNodeError):
            gone.result(5)
        assert zk.node("/pids/5") == (b"cas", 4)
        assert all(f"/pids/{i}" in zk.zk.nodes for i in range(10, 15))
    finally:
        b.stop()


def test_zookeeper_down_fails_every_write_of_the_batch_with_the_same_error() -> None:
    zk = Zk()
    zk.down = True
    b = WriteBatcher(zk.client, zk.wait)
    try:
        futs = [b.submit(f"/pids/{i}", b"x", None) for i in range(5)]
        for f in futs:
            with pytest.raises(CoordinatorUnavailable):
                f.result(5)
    finally:
        b.stop()


def record(pid: int, generation: int) -> PidRecord:
    return PidRecord(pid=pid, generation=generation, created_ms=1, expires_at_ms=2)


def test_record_cache_is_bounded_lru_and_never_goes_back_a_version() -> None:
    c = RecordCache(3)
    for pid in (1, 2, 3):
        c.put(record(pid, 0), 0)
    assert c.get(1) is not None  # 1 is now the newest
    c.put(record(4, 0), 0)  # evicts 2, the least recently used
    assert c.get(2) is None and len(c) == 3
    c.put(record(1, 7), 5)
    c.put(record(1, 6), 4)  # an older version arriving late is ignored
    got = c.get(1)
    assert got is not None and got[1] == 5 and got[0].generation == 7
    c.drop(1)
    assert c.get(1) is None
    off = RecordCache(0)
    off.put(record(1, 0), 0)
    assert off.get(1) is None


def test_address_cache_expires_and_drops() -> None:
    now = [0.0]
    c = AddressCache(1000, clock_s=lambda: now[0])
    c.put("t/0", "127.0.0.1:1")
    assert c.get("t/0") == "127.0.0.1:1"
    now[0] = 1.5
    assert c.get("t/0") is None
    c.put("t/0", "127.0.0.1:2")
    c.drop("t/0")
    assert c.get("t/0") is None
    assert AddressCache(0).get("t/0") is None
