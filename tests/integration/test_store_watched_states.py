"""The coordinator's kept partition states (issue 24): a topic description reads from
ZooKeeper only the partition states it does not keep, and a state is dropped as soon as its
znode's data watch fires, so a description after a change shows the change. Real
ZooKeeper."""

from __future__ import annotations

import time

from kazoo.client import KazooClient

from coordinator.store import Store
from pidlease.wire.cluster import PartitionState, partition_path


def started_store(hosts: str) -> Store:
    store = Store(hosts, request_timeout_ms=5_000)
    store.start()
    deadline = time.monotonic() + 30
    while not store.connected and time.monotonic() < deadline:
        time.sleep(0.05)
    store.ensure_layout()
    return store


def test_kept_states_follow_every_change_and_save_the_reads(zk_hosts: str) -> None:
    store = started_store(zk_hosts)
    zk = KazooClient(hosts=zk_hosts)
    zk.start(timeout=30)
    try:
        for p in range(50):
            zk.create(
                partition_path("wide", p),
                PartitionState([1, 2], 1, 0, [1, 2]).to_bytes(),
                makepath=True,
            )
        parts = [*range(50), 50]  # and one that does not exist
        first = store.get_partition_states("wide", parts, watched=True)
        assert [s.leader if s else None for s in first] == [1] * 50 + [None]
        reads = store.read_requests
        again = store.get_partition_states("wide", parts, watched=True)
        assert again == first
        assert store.read_requests - reads == 1  # only the absent one is read again
        # another client moves partition 7: the kept state goes with the watch, and the
        # next read sees the new leader (no stale answer once the event is in)
        zk.set(partition_path("wide", 7), PartitionState([1, 2], 2, 1, [2]).to_bytes())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = store.get_partition_states("wide", [7], watched=True)[0]
            if got is not None and got.leader == 2:
                break
            time.sleep(0.01)
        assert got == PartitionState([1, 2], 2, 1, [2])
        reads = store.read_requests
        assert store.get_partition_states("wide", [7], watched=True)[0] == got
        assert store.read_requests == reads  # kept again, with a new watch
        # a second change is seen too (the watch was armed again by the read)
        zk.set(partition_path("wide", 7), PartitionState([1, 2], 1, 2, [1]).to_bytes())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = store.get_partition_states("wide", [7], watched=True)[0]
            if got is not None and got.leader == 1:
                break
            time.sleep(0.01)
        assert got == PartitionState([1, 2], 1, 2, [1])
        # a deleted partition is not answered from what was kept
        zk.delete(partition_path("wide", 8))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if store.get_partition_states("wide", [8], watched=True)[0] is None:
                break
            time.sleep(0.01)
        assert store.get_partition_states("wide", [8], watched=True) == [None]
        # unwatched reads still go to ZooKeeper every time
        reads = store.read_requests
        store.get_partition_states("wide", [0, 1], watched=False)
        assert store.read_requests - reads == 2
    finally:
        zk.stop()
        zk.close()
        store.stop()
