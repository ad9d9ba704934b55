"""An unreachable follower of an idle partition (issue 16): the leader removes it once and
does not add it back on its old fetch, so ZooKeeper sees one write, not one a second; it
rejoins after a fetch of its own, and the shrink and expand are counted. A real leader
partition and ``ReplicaManager``, a fake ZooKeeper, writes run inline, a hand-moved clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

from partition_server.replication import ReplicaManager
from partition_server.testing import settle
from pidlease.wire.cluster import PartitionState
from tests.helpers import ManualClock
from tests.sim.zk import partition_zk
from tests.unit.server.test_replication_isr_retry import KEY, LAG_MS, append, fetch, setup

TICK_MS = 250  # the maintenance tick for this lag time (replication._maintain)


async def run(mgr: ReplicaManager, clock: ManualClock, until_ms: int, fetchers: list[int]) -> None:
    """Move the clock to ``until_ms`` by ticks: each tick ``fetchers`` fetch up to the
    leader's end (an idle partition: nothing new) and the maintenance pass runs."""
    part = mgr.partitions[KEY]
    while clock.now < until_ms:
        clock.now += TICK_MS
        for r in fetchers:
            await fetch(mgr, part, r, part.log.next_offset)
        mgr.check_isr(clock.now)
        await settle()  # a leadership write takes a few turns of the loop (read, commit)


def test_an_unreachable_follower_of_an_idle_partition_is_removed_once(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]))
        part, mgr = setup(tmp_path, clock, [1, 2, 3], zk)
        mgr.s.isr_change_min_interval_ms = 1_000
        await append(part, 0)
        await fetch(mgr, part, 2, 1)
        await fetch(mgr, part, 3, 1)  # 3 holds everything, then becomes unreachable
        assert part.high_watermark == 1
        await run(mgr, clock, 1_000 + LAG_MS + 30_000, fetchers=[2])
        assert zk.state.isr == [1, 2]
        assert zk.sets == 1, f"{zk.sets} ZooKeeper writes for one follower's departure"
        assert mgr.isr_changes[KEY] == (1, 0)

        # 3 is reachable again: its own fetch (at the end) lets it back in, once
        await run(mgr, clock, clock.now + 5_000, fetchers=[2, 3])
        assert zk.state.isr == [1, 2, 3] and zk.sets == 2
        assert mgr.isr_changes[KEY] == (1, 1)
        part.close()

    asyncio.run(go())


def test_a_follower_back_right_after_its_removal_waits_the_minimum_interval(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(PartitionState([1, 2, 3], 1, 1, [1, 2, 3]))
        part, mgr = setup(tmp_path, clock, [1, 2, 3], zk)
        mgr.s.isr_change_min_interval_ms = 2_000
        await append(part, 0)
        await fetch(mgr, part, 2, 1)
        await fetch(mgr, part, 3, 1)
        await run(mgr, clock, 1_000 + LAG_MS + 1, fetchers=[2])
        assert zk.state.isr == [1, 2]
        removed_at = clock.now
        await fetch(mgr, part, 3, 1)  # back at once
        assert zk.state.isr == [1, 2]
        clock.now = removed_at + 1_999
        await fetch(mgr, part, 3, 1)
        assert zk.state.isr == [1, 2]
        clock.now = removed_at + 2_000
        await fetch(mgr, part, 3, 1)
        assert zk.state.isr == [1, 2, 3] and zk.sets == 2
        part.close()

    asyncio.run(go())
