"""Shared set-ups for the replica manager tests of this folder: a real leader partition and
``ReplicaManager``, a fake ZooKeeper, writes run inline, the clock moved by hand.

- ``setup``: a leader of ``KEY`` whose followers fetch through ``fetch``;
- ``setup_live``: the same with the registry's assignment naming the live servers
  (``servers``, ``read``);
- ``leased_setup``: a follower partition and a manager whose registry keeps the real
  ZooKeeper lease (``LeaseRegistry``), as the server runs it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from partition_server.flusher import Flusher
from partition_server.leadership import ZkLease
from partition_server.partition import Partition, Role
from partition_server.registry import Assignment, Registry
from partition_server.replication import ReplicaManager
from partition_server.testing import InlineExecutor, b, open_part, settle
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, ServerInfo
from tests.helpers import ManualClock
from tests.sim.zk import PartitionZk, partition_zk

LAG_MS = 10_000


KEY = ("t", 0)


TIMEOUT_MS, MARGIN_MS = 1_500, 300


def setup(
    tmp_path: Path, clock: ManualClock, isr: list[int], zk: PartitionZk
) -> tuple[Partition, ReplicaManager]:
    part = open_part(
        tmp_path, Flusher(mode="batch", interval_ms=0, executor=InlineExecutor()), clock_ms=clock
    )
    part.hosted = True
    part.become_leader(1, 1, [1, 2, 3], isr)
    settings = SimpleNamespace(
        server_id=1,
        routes={},
        replica_lag_time_max_ms=LAG_MS,
        isr_change_min_interval_ms=0,  # the rate limit has tests of its own
        replica_fetch_wait_max_ms=0,
        fetch_bytes_max=1 << 20,
    )
    registry = SimpleNamespace(zk=zk, refresh=lambda: None, assignment=None)
    mgr = ReplicaManager(
        settings, registry, {KEY: part}, tmp_path, clock_ms=clock, zk_executor=InlineExecutor()
    )
    return part, mgr


async def append(part: Partition, seq: int) -> asyncio.Future[Any]:
    raw = bytearray(b(7, seq))
    _, ack = part.append(
        memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=part.leader_epoch
    )
    assert ack is not None
    await part.wait_flushed(part.log.next_offset)
    return ack


async def fetch(mgr: ReplicaManager, part: Partition, replica: int, offset: int) -> None:
    req = P.Request(
        P.REPLICA_FETCH,
        1,
        "t",
        0,
        offset=offset,
        max_bytes=1 << 20,
        replica_id=replica,
        leader_epoch=1,
        max_wait_ms=0,
    )
    await mgr.replica_fetch(req, part)
    await settle()


def servers(*ids: int) -> Assignment:
    return Assignment(servers={i: ServerInfo(i, "127.0.0.1", 9000 + i) for i in ids})


def setup_live(
    tmp_path: Path,
    clock: ManualClock,
    isr: list[int],
    zk: PartitionZk,
    *,
    min_interval_ms: int = 0,
    min_insync: int = 1,
) -> tuple[Partition, ReplicaManager, SimpleNamespace]:
    part = open_part(
        tmp_path, Flusher(mode="batch", interval_ms=0, executor=InlineExecutor()), clock_ms=clock
    )
    part.hosted = True
    part.set_min_insync(min_insync)
    part.become_leader(1, 1, [1, 2, 3], isr)
    settings = SimpleNamespace(
        server_id=1,
        routes={},
        replica_lag_time_max_ms=LAG_MS,
        isr_change_min_interval_ms=min_interval_ms,
        replica_fetch_wait_max_ms=0,
        fetch_bytes_max=1 << 20,
    )
    registry = SimpleNamespace(zk=zk, refresh=lambda: None, assignment=servers(1, 2, 3))
    mgr = ReplicaManager(
        settings, registry, {KEY: part}, tmp_path, clock_ms=clock, zk_executor=InlineExecutor()
    )
    mgr.started = True
    return part, mgr, registry


async def read(mgr: ReplicaManager, part: Partition, registry: Any, a: Assignment) -> None:
    """One read of ZooKeeper reaching the manager, as the registry's change handler does."""
    registry.assignment = a
    mgr.apply(KEY, part, PartitionState([1, 2, 3], 1, 1, sorted(part.isr.isr)), a)  # type: ignore[union-attr]
    await settle()


# -- the manager -----------------------------------------------------------------------------
class LeaseRegistry(Registry):
    """The real lease bookkeeping, no ZooKeeper: refreshes are only counted."""

    def __init__(self, zk: Any) -> None:
        super().__init__("unused:2181", 1)
        self.zk = zk
        self.lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
        self.refreshes = 0

    def refresh(self) -> Any:
        self.refreshes += 1


def leased_setup(
    tmp_path: Path, ps: PartitionState, live: list[int]
) -> tuple[Partition, ReplicaManager, LeaseRegistry, ManualClock, PartitionZk]:
    clock = ManualClock(1_000)
    part = open_part(
        tmp_path, Flusher(mode="batch", interval_ms=0, executor=InlineExecutor()), clock_ms=clock
    )
    part.hosted = True
    part.role = Role.FOLLOWER
    zk = partition_zk(ps, live=live)
    registry = LeaseRegistry(zk)
    settings = SimpleNamespace(
        server_id=1,
        routes={},
        replica_lag_time_max_ms=10_000,
        isr_change_min_interval_ms=0,
        replica_fetch_wait_max_ms=0,
        fetch_bytes_max=1 << 20,
        zk_step_down_margin_ms=MARGIN_MS,
        zk_heartbeat_interval_ms=250,
    )
    mgr = ReplicaManager(
        settings,
        registry,
        {KEY: part},
        tmp_path,
        clock_ms=clock,
        zk_executor=InlineExecutor(),
        mono_ms=clock,
    )
    mgr.started = True
    return part, mgr, registry, clock, zk
