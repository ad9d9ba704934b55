"""The coordinator's write batcher (group commit of ZooKeeper writes) and its lease caches,
against in-memory fakes. The real-ZooKeeper behaviour is in
tests/integration/test_coordinator_lease_cache.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from coordinator.lease_cache import AddressCache, RecordCache
from coordinator.zk_batch import WriteBatcher
from pidlease.errors import CoordinatorUnavailable
from pidlease.wire.cluster import PidRecord


class Done:
    def __init__(self, value: Any) -> None:
        self.value = value


class FakeZk:
    """Znodes as {path: (data, version)}; a transaction applies all or nothing."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.requests = 0
        self.multi_sizes: list[int] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.down = False

    def _op(
        self, nodes: dict[str, tuple[bytes, int]], op: tuple[str, str, bytes, int | None]
    ) -> Any:
        kind, path, data, version = op
        if kind == "create":
            if path in nodes:
                return NodeExistsError()
            nodes[path] = (data, 0)
            return path
        if path not in nodes:
            return NoNodeError()
        if nodes[path][1] != version:
            return BadVersionError()
        nodes[path] = (data, version + 1)
        return True

    def create_async(self, path: str, data: bytes) -> Done:
        return self._single(("create", path, data, None))

    def set_async(self, path: str, data: bytes, version: int) -> Done:
        return self._single(("set", path, data, version))

    def _single(self, op: tuple[str, str, bytes, int | None]) -> Done:
        self.gate.wait(5)
        with self.lock:
            self.requests += 1
            return Done(self._op(self.nodes, op))

    def transaction(self) -> FakeTx:
        return FakeTx(self)


class FakeTx:
    def __init__(self, zk: FakeZk) -> None:
        self.zk = zk
        self.ops: list[tuple[str, str, bytes, int | None]] = []

    def create(self, path: str, data: bytes) -> None:
        self.ops.append(("create", path, data, None))

    def set_data(self, path: str, data: bytes, version: int) -> None:
        self.ops.append(("set", path, data, version))

    def commit_async(self) -> Done:
        self.zk.gate.wait(5)
        with self.zk.lock:
            self.zk.requests += 1
            self.zk.multi_sizes.append(len(self.ops))
            trial = dict(self.zk.nodes)
            results = [self.zk._op(trial, op) for op in self.ops]
            if any(isinstance(r, Exception) for r in results):
                return Done([r if isinstance(r, Exception) else RolledBackError() for r in results])
            self.zk.nodes = trial
            return Done(results)


def wait(zk: FakeZk) -> Any:
    def w(done: Done) -> Any:
        if zk.down:
            raise CoordinatorUnavailable("ZooKeeper unavailable")
        if isinstance(done.value, Exception):
            raise done.value
        return done.value

    return w


def test_writes_queued_behind_one_in_flight_go_out_as_one_multi() -> None:
    zk = FakeZk()
    b = WriteBatcher(zk, wait(zk), batch_max=64)
    try:
        zk.gate.clear()  # the first write blocks "in ZooKeeper"
        first = b.submit("/pids/1", b"a", None)
        # While it is in flight, 20 more arrive.
        futs = [b.submit(f"/pids/{i}", b"x", None) for i in range(2, 22)]
        threading.Event().wait(0.05)
        zk.gate.set()
        assert first.result(5) is True
        assert all(f.result(5) is True for f in futs)
        assert set(zk.nodes) == {f"/pids/{i}" for i in range(1, 22)}
        assert zk.requests < 21, zk.multi_sizes  # fewer requests than writes
        assert max(zk.multi_sizes) >= 2
    finally:
        b.stop()


def test_one_failing_write_does_not_fail_its_batch_neighbours() -> None:
    zk = FakeZk()
    zk.nodes["/pids/5"] = (b"old", 3)
    b = WriteBatcher(zk, wait(zk))
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
        assert zk.nodes["/pids/5"] == (b"cas", 4)
        assert all(f"/pids/{i}" in zk.nodes for i in range(10, 15))
    finally:
        b.stop()


def test_zookeeper_down_fails_every_write_of_the_batch_with_the_same_error() -> None:
    zk = FakeZk()
    zk.down = True
    b = WriteBatcher(zk, wait(zk))
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
