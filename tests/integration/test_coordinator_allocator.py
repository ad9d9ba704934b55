"""PID blocks on the real ZooKeeper counter: two allocators (as two coordinators would
have) on separate kazoo sessions, many threads each, never hand out the same PID, and the
counter ends past every PID handed out."""

from __future__ import annotations

import threading
import time

from coordinator.allocator import PidAllocator
from coordinator.store import Store
from pidlease.wire.cluster import PID_BLOCK


def started_store(hosts: str) -> Store:
    store = Store(hosts, request_timeout_ms=5_000)
    store.start()
    deadline = time.monotonic() + 30
    while not store.connected and time.monotonic() < deadline:
        time.sleep(0.05)
    store.ensure_layout()
    return store


def test_two_allocators_many_threads_real_zookeeper(zk_hosts: str) -> None:
    stores = [started_store(zk_hosts), started_store(zk_hosts)]
    try:
        allocs = [PidAllocator(s, block_size=5) for s in stores]
        got: list[int] = []
        lock = threading.Lock()

        def work(alloc: PidAllocator) -> None:
            mine = [alloc.next_pid() for _ in range(100)]
            with lock:
                got.extend(mine)

        threads = [threading.Thread(target=work, args=(allocs[i % 2],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(got) == 800
        assert len(set(got)) == 800
        assert min(got) == 1
        counter = int(stores[0].zk.get(PID_BLOCK)[0])
        assert max(got) < counter
        assert sum(a.blocks_fetched for a in allocs) == (counter - 1) // 5
        # One ZooKeeper write per block (plus a retry per lost race), not per PID.
        assert sum(a.blocks_fetched + a.cas_conflicts for a in allocs) < 800 // 5 * 2

        # A third allocator (a restarted coordinator) starts past everything reserved.
        third = PidAllocator(stores[1], block_size=5)
        assert third.next_pid() == counter
    finally:
        for s in stores:
            s.stop()
