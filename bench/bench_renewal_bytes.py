"""ZooKeeper bytes one renewal round writes, for a producer leasing 1, 100 and 1000
partitions (issue 30, item 6).

Starts ZooKeeper and one partition server as real processes (LocalCluster, plus its
coordinator, used only to create the topics), then runs the coordinator's own lease service
(``coordinator.service.LeaseService`` with the real ``Store`` and ``LeaderClient``) in this
process, so that its kazoo client can be wrapped: every ``create`` and ``set`` it sends
(alone or inside a ``multi``) is counted, payload and path bytes. Per partition count N:

- a PID is leased on partition 0 and the other N-1 partitions are added in one batch, the
  way the SDK's lease keeper starts (``pidlease/client/lease_keeper.py``);
- one record is written to every partition and a first renewal round marks them seen;
- then ``--rounds`` renewal rounds, each one batch of N renewals (what the keeper sends at
  half the lease), are measured: ZooKeeper writes and bytes per round, and the wall time.

    python bench/bench_renewal_bytes.py [--partitions 1,100,1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from typing import Any

from coordinator.allocator import PidAllocator
from coordinator.leaders import LeaderClient
from coordinator.leases import LeaseRequest
from coordinator.metrics import Metrics
from coordinator.service import LeaseService
from coordinator.settings import CoordinatorSettings
from coordinator.store import Store
from pidlease.testing.devcluster import LocalCluster
from pidlease.testing.wire import WireClient
from pidlease.wire import protocol as P


class ByteCounter:
    """Wraps one KazooClient: counts the create/set requests it sends and their bytes."""

    def __init__(self, zk: Any) -> None:
        self.lock = threading.Lock()
        self.writes = 0
        self.bytes = 0
        self._zk = zk
        create, set_, begin = zk.create_async, zk.set_async, zk.transaction

        def count(path: str, data: bytes) -> None:
            with self.lock:
                self.writes += 1
                self.bytes += len(data) + len(path.encode())

        def create_async(path: str, value: bytes = b"", *a: Any, **kw: Any) -> Any:
            count(path, value)
            return create(path, value, *a, **kw)

        def set_async(path: str, value: bytes, *a: Any, **kw: Any) -> Any:
            count(path, value)
            return set_(path, value, *a, **kw)

        def transaction() -> Any:
            tx = begin()
            tx_create, tx_set = tx.create, tx.set_data

            def tx_create_counted(path: str, value: bytes = b"", *a: Any, **kw: Any) -> Any:
                count(path, value)
                return tx_create(path, value, *a, **kw)

            def tx_set_counted(path: str, value: bytes, *a: Any, **kw: Any) -> Any:
                count(path, value)
                return tx_set(path, value, *a, **kw)

            tx.create, tx.set_data = tx_create_counted, tx_set_counted
            return tx

        zk.create_async, zk.set_async, zk.transaction = create_async, set_async, transaction

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return self.writes, self.bytes


def wait_connected(store: Store, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.connected:
        if time.monotonic() > deadline:
            raise RuntimeError("ZooKeeper did not connect")
        time.sleep(0.05)
    store.ensure_layout()


def measure(cluster: LocalCluster, n: int, rounds: int) -> dict[str, float]:
    topic = f"renew{n}"
    cluster.create_topic(topic, n)
    settings = CoordinatorSettings(zk=cluster.zk_hosts, lease_secret=cluster.secret)
    store = Store(settings.zk)
    store.start()
    leaders = LeaderClient(timeout_ms=settings.leader_request_timeout_ms)
    svc = LeaseService(settings, store, PidAllocator(store, 100), leaders, Metrics())
    try:
        wait_connected(store)
        counter = ByteCounter(store.zk)
        first = svc.lease(LeaseRequest(topic, 0))
        pid, gen = first.record.pid, first.record.generation
        reqs = [LeaseRequest(topic, p, pid, None, gen) for p in range(n)]
        added = svc.lease_batch(reqs[1:])
        assert all(a["error"] == "NONE" for a in added), added[:3]
        w = WireClient(cluster.servers[0].address)
        try:
            for p in range(n):
                batch = P.encode_batch(
                    [(None, b"x")], pid=pid, generation=gen, base_sequence=0, timestamp_ms=0
                )
                assert w.produce(topic, p, batch, first.lease_token).error_code == 0
        finally:
            w.close()
        warm = svc.lease_batch(reqs)  # marks every partition seen (highwater 0)
        assert all(a["error"] == "NONE" and a["sequence_number"] == 1 for a in warm), warm[:3]
        record_bytes = len(store.get_pid(pid)[0].to_bytes())  # type: ignore[index]
        w0, b0 = counter.snapshot()
        started = time.perf_counter()
        for _ in range(rounds):
            out = svc.lease_batch(reqs)
            assert all(a["error"] == "NONE" for a in out), out[:3]
        took = time.perf_counter() - started
        w1, b1 = counter.snapshot()
        return {
            "partitions": n,
            "record_bytes": record_bytes,
            "writes_per_round": (w1 - w0) / rounds,
            "bytes_per_round": (b1 - b0) / rounds,
            "ms_per_round": took * 1000 / rounds,
        }
    finally:
        svc.close()
        leaders.close()
        store.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", default="1,100,1000")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    counts = [int(x) for x in args.partitions.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-renewal-") as tmp:
        cluster = LocalCluster(tmp, servers=1, coordinators=1, kafka=False).start()
        try:
            print(
                f"{'partitions':>10} {'record B':>10} {'ZK writes/round':>16} "
                f"{'ZK bytes/round':>15} {'ms/round':>9}"
            )
            for n in counts:
                r = measure(cluster, n, args.rounds)
                print(
                    f"{r['partitions']:>10} {r['record_bytes']:>10} "
                    f"{r['writes_per_round']:>16.0f} {r['bytes_per_round']:>15,.0f} "
                    f"{r['ms_per_round']:>9.0f}"
                )
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
