"""In-sync set changes whose ZooKeeper write fails (docs/reliability.md, finding 5): the change is
retried on a later tick or fetch, and while ZooKeeper may name a follower in sync the
leader keeps counting it towards the high watermark. A real leader partition and
``ReplicaManager``, a fake ZooKeeper, writes run inline, the clock moved by hand."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.flusher import Flusher
from partition_server.isr import InSyncReplicas
from partition_server.partition import Partition
from partition_server.replication import ReplicaManager
from partition_server.testing import InlineExecutor, b, open_part, settle
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState
from tests.helpers import ManualClock
from tests.sim.zk import PartitionZk, partition_zk

LAG_MS = 10_000
KEY = ("t", 0)


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


def test_a_failed_removal_of_a_dead_follower_is_retried(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]), fail_sets=1)
        part, mgr = setup(tmp_path, clock, [1, 2, 3], zk)
        ack = await append(part, 0)
        await fetch(mgr, part, 2, 1)
        assert not ack.done()  # follower 3 is dead: it holds the ack back
        clock.now = 1_000 + LAG_MS + 1
        await fetch(mgr, part, 2, 1)
        mgr.check_isr(clock.now)
        await settle()
        assert zk.sets == 1 and zk.state.isr == [1, 2, 3]  # the removal failed
        assert not ack.done()
        clock.now += 250  # the next maintenance tick
        mgr.check_isr(clock.now)
        await settle()
        assert zk.state.isr == [1, 2], "the failed removal was never retried"
        assert part.isr is not None and part.isr.isr == {1, 2}
        assert ack.done() and part.high_watermark == 1
        part.close()

    asyncio.run(go())


def test_a_failed_addition_keeps_counting_the_follower_and_is_retried(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        # the write is lost with the connection after ZooKeeper applied it: 3 is in sync
        # there, though the leader was told the write failed
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2]), fail_sets=1, land_failed=True)
        part, mgr = setup(tmp_path, clock, [1, 2], zk)
        await append(part, 0)
        await fetch(mgr, part, 2, 1)
        assert part.high_watermark == 1
        await fetch(mgr, part, 3, 1)  # 3 caught up: add it (the write fails)
        assert zk.sets == 1 and zk.state.isr == [1, 2, 3]
        ack = await append(part, 1)
        await fetch(mgr, part, 2, 2)
        # ZooKeeper may name 3 in sync, and 3 lacks offset 1: nothing above 1 is acked
        assert part.high_watermark == 1 and not ack.done()
        await fetch(mgr, part, 3, 2)  # the addition is asked again, and lands
        assert part.isr is not None and part.isr.isr == {1, 2, 3}
        assert not part.isr.pending_add
        assert ack.done() and part.high_watermark == 2
        part.close()

    asyncio.run(go())


def test_a_failed_addition_is_retried_and_a_dead_joiner_stops_holding_acks(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2]), fail_sets=1)
        part, mgr = setup(tmp_path, clock, [1, 2], zk)
        await append(part, 0)
        await fetch(mgr, part, 2, 1)
        await fetch(mgr, part, 3, 1)  # add 3: the write fails, not applied
        assert zk.sets == 1 and zk.state.isr == [1, 2]
        await fetch(mgr, part, 3, 1)  # its next fetch asks again
        assert zk.state.isr == [1, 2, 3]
        assert part.isr is not None and part.isr.isr == {1, 2, 3}

        # A second failed addition, then the joiner dies: it must not stall acks forever.
        zk2 = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2]), fail_sets=1)
        part2, mgr2 = setup(tmp_path / "2", clock, [1, 2], zk2)
        await append(part2, 0)
        await fetch(mgr2, part2, 2, 1)
        await fetch(mgr2, part2, 3, 1)  # the addition fails; 3 still counts
        ack = await append(part2, 1)
        await fetch(mgr2, part2, 2, 2)
        assert not ack.done()  # 3 (counted, maybe in sync) lacks it
        clock.now += LAG_MS + 1  # 3 never fetches again
        await fetch(mgr2, part2, 2, 2)
        for _ in range(3):  # maintenance ticks
            mgr2.check_isr(clock.now)
            await settle()
            clock.now += 250
        assert zk2.state.isr == [1, 2]
        assert ack.done() and part2.high_watermark == 2
        part.close()
        part2.close()

    asyncio.run(go())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove"]),
            st.sampled_from([2, 3]),
            st.sampled_from(["written", "lost", "written but lost"]),
        ),
        max_size=12,
    )
)
def test_whoever_zookeeper_may_name_in_sync_is_counted(steps: list[tuple[str, int, str]]) -> None:
    """The pure rule under any run of writes that succeed, fail, or fail after landing:
    the leader counts every follower ZooKeeper names in sync, and a failed change is left
    to be found again (no removal stuck pending, every pending addition retryable)."""
    s = InSyncReplicas(1, [1, 2, 3], [1, 2, 3], now_ms=0)
    zk = {1, 2, 3}
    for kind, r, result in steps:
        if kind == "add" and r in s.isr:
            continue  # the leader adds only followers outside the set
        if kind == "remove" and r not in s.counted() - s.pending_remove:
            continue  # ... and removes only counted ones
        new = s.begin_change([r] if kind == "add" else [], [r] if kind == "remove" else [])
        assert zk - {1} <= s.counted()  # while the write is in flight
        if result != "lost":
            zk = set(new)
        if result == "written":
            s.set_isr(new)
        else:
            s.change_failed()
            assert not s.pending_remove and s.pending_add <= s.retry_add
        assert zk - {1} <= s.counted()
