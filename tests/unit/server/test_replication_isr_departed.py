"""A follower whose ZooKeeper session ended (its ``/servers/<id>`` znode gone) leaves the
in-sync set at once, not ``replica_lag_time_max_ms`` later (issue 16, follower loss). A real
leader partition and ``ReplicaManager``, a fake ZooKeeper and a fake registry whose
assignment names the live servers, writes inline, the clock moved by hand (never past the
lag time here: only the departure may remove anyone)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from partition_server.flusher import Flusher
from partition_server.isr import InSyncReplicas
from partition_server.liveness import LiveServers
from partition_server.partition import Partition
from partition_server.registry import Assignment
from partition_server.replication import ReplicaManager
from partition_server.testing import InlineExecutor, b, open_part, settle
from pidlease.errors import NotEnoughReplicas
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, ServerInfo
from tests.helpers import ManualClock
from tests.sim.zk import PartitionZk, partition_zk

LAG_MS = 10_000
KEY = ("t", 0)


def servers(*ids: int) -> Assignment:
    return Assignment(servers={i: ServerInfo(i, "127.0.0.1", 9000 + i) for i in ids})


def setup(
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


def test_a_vanished_follower_leaves_the_in_sync_set_at_once_and_the_ack_goes_out(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]))
        part, mgr, registry = setup(tmp_path, clock, [1, 2, 3], zk)
        await read(mgr, part, registry, servers(1, 2, 3))
        ack = await append(part, 0)
        await fetch(mgr, part, 2, 1)
        await fetch(mgr, part, 3, 0)  # 3 fetched before the append, then was killed
        assert not ack.done()  # 3 holds the ack back
        clock.now += 1_300  # its session times out: far below the lag time
        await read(mgr, part, registry, servers(1, 2))
        assert zk.state.isr == [1, 2], "the departed follower is still in sync"
        assert part.isr is not None and part.isr.isr == {1, 2}
        assert ack.done() and part.high_watermark == 1
        assert mgr.isr_changes[KEY] == (1, 0)  # counted as a shrink
        # It comes back (a new session) and rejoins the usual way: a fresh fetch.
        await read(mgr, part, registry, servers(1, 2, 3))
        assert zk.sets == 1
        await fetch(mgr, part, 3, 1)
        assert zk.state.isr == [1, 2, 3]
        part.close()

    asyncio.run(go())


def test_the_isr_change_rate_limit_does_not_hold_a_departure_back(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2]))
        part, mgr, registry = setup(tmp_path, clock, [1, 2], zk, min_interval_ms=60_000)
        await read(mgr, part, registry, servers(1, 2, 3))
        await append(part, 0)
        await fetch(mgr, part, 2, 1)
        await fetch(mgr, part, 3, 1)  # 3 caught up: added, a change just now
        assert zk.state.isr == [1, 2, 3]
        clock.now += 100  # well within the 60 s between changes
        await read(mgr, part, registry, servers(1, 2))
        assert zk.state.isr == [1, 2], "the rate limit held the departure back"
        part.close()

    asyncio.run(go())


def test_below_min_insync_the_departure_still_shrinks_and_produces_are_refused(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]))
        part, mgr, registry = setup(tmp_path, clock, [1, 2, 3], zk, min_insync=2)
        await read(mgr, part, registry, servers(1, 2, 3))
        await fetch(mgr, part, 2, 0)
        await fetch(mgr, part, 3, 0)
        ack = await append(part, 0)
        await read(mgr, part, registry, servers(1, 3))  # 2 is gone: 2 of 3 still fine
        assert zk.state.isr == [1, 3]
        await read(mgr, part, registry, servers(1))  # 3 too: below the minimum
        assert zk.state.isr == [1]
        # the waiting ack is refused, not acked on one copy, and nothing new is taken
        assert ack.done() and isinstance(ack.exception(), NotEnoughReplicas)
        assert part.high_watermark == 0
        end = part.log.next_offset
        with pytest.raises(NotEnoughReplicas):
            await append(part, 1)
        assert part.log.next_offset == end
        part.close()

    asyncio.run(go())


def test_no_removal_while_the_session_is_there(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]))
        part, mgr, registry = setup(tmp_path, clock, [1, 2, 3], zk)
        await read(mgr, part, registry, servers(1, 2, 3))
        ack = await append(part, 0)
        await fetch(mgr, part, 2, 1)  # 3 silent, but its session is alive (a one-way cut)
        for _ in range(8):
            clock.now += 1_000  # 8 s: below the lag time
            mgr.check_isr(clock.now)
            await read(mgr, part, registry, servers(1, 2, 3))
        assert zk.sets == 0 and zk.state.isr == [1, 2, 3] and not ack.done()
        clock.now += LAG_MS  # the lag rule still applies to it
        await fetch(mgr, part, 2, 1)
        mgr.check_isr(clock.now)
        await settle()
        assert zk.state.isr == [1, 2]
        part.close()

    asyncio.run(go())


def test_a_read_without_our_own_znode_or_before_a_server_registered_removes_nobody(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]))
        part, mgr, registry = setup(tmp_path, clock, [1, 2, 3], zk)
        # 3 has not registered yet (the cluster starting): the lag rule's business
        await read(mgr, part, registry, servers(1, 2))
        mgr.check_isr(clock.now)
        await settle()
        assert zk.sets == 0
        await read(mgr, part, registry, servers(1, 2, 3))
        # a read made outside our session (our own znode missing) says nothing
        await read(mgr, part, registry, servers(2))
        mgr.check_isr(clock.now)
        await settle()
        assert zk.sets == 0
        part.close()

    asyncio.run(go())


def test_a_departure_whose_write_fails_is_retried_by_the_tick(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]), fail_sets=1)
        part, mgr, registry = setup(tmp_path, clock, [1, 2, 3], zk)
        await read(mgr, part, registry, servers(1, 2, 3))
        await read(mgr, part, registry, servers(1, 2))
        assert zk.sets == 1 and zk.state.isr == [1, 2, 3]  # the write failed
        clock.now += 250
        mgr.check_isr(clock.now)
        await settle()
        assert zk.state.isr == [1, 2]
        part.close()

    asyncio.run(go())


def test_departed_names_counted_followers_only() -> None:
    s = InSyncReplicas(1, [1, 2, 3, 4], [1, 2, 3], now_ms=0)
    s.pending_add.add(4)  # being added: counted, so it must go too
    assert s.departed({1, 2, 4, 9}) == [2, 4]  # never the leader, never a non-replica
    s.pending_remove.add(2)
    assert s.departed({2, 3}) == [3]  # 2 is being removed already
    assert s.departed(set()) == []


def test_live_servers_gone_means_seen_then_absent() -> None:
    live = LiveServers(me=1)
    assert live.gone() == set()
    live.observe([1, 2])
    live.observe([1, 2, 3])
    live.observe([1, 3])
    assert live.gone() == {2}
    live.observe([3])  # no znode of our own: not a view to act on
    assert live.gone() == {2}
    live.observe([1, 2, 3])  # 2 came back in a new session
    assert live.gone() == set()
    assert LiveServers(me=1).gone() == set()
