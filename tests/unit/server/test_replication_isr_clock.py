"""The in-sync set's lag check runs on a monotonic clock, not the wall clock (issue 23 item
7): an NTP step of the wall clock must not make every follower look lagging. A real leader
partition and ``ReplicaManager`` (its maintenance loop, as the server runs it), a fake
ZooKeeper, a wall clock and a monotonic clock moved by hand, separately."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from partition_server.partition import Role
from partition_server.registry import Assignment
from pidlease.wire.cluster import PartitionState
from tests.helpers import ManualClock
from tests.unit.server.test_replication_isr_retry import KEY, fetch
from tests.unit.server.test_step_down import setup

LAG_MS = 400  # the maintenance loop ticks every LAG_MS / 4


async def one_maintenance_tick(mgr: object) -> None:
    task = asyncio.create_task(mgr._maintain())  # type: ignore[attr-defined]
    await asyncio.sleep(LAG_MS / 4 / 1000 * 1.6)  # one tick, not two
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_a_wall_clock_step_shrinks_no_in_sync_set(tmp_path: Path) -> None:
    async def go() -> None:
        ps = PartitionState([1, 2, 3], 1, 1, [1, 2, 3])
        part, mgr, registry, mono, zk = setup(tmp_path, ps, [1, 2, 3])
        wall = ManualClock(1_700_000_000_000)
        mgr.clock_ms = wall  # the wall clock; ``mono`` stays the manager's mono_ms
        mgr.s.replica_lag_time_max_ms = LAG_MS
        mgr.s.hw_checkpoint_interval_ms = 60_000
        assert registry.lease is not None
        registry.lease.confirm(5, 1_000)  # the lease holds on ``mono`` until 2_200
        mgr.apply(KEY, part, ps, Assignment())
        assert part.role is Role.LEADER and part.isr is not None
        await fetch(mgr, part, 2, 0)
        await fetch(mgr, part, 3, 0)
        # NTP steps the wall clock a minute forward (or back: the same rule): nothing
        # happened to the followers, so no follower leaves the set.
        wall.now += 60_000
        mono.now += 10
        await one_maintenance_tick(mgr)
        assert part.isr.isr == {1, 2, 3} and not part.isr.pending_remove, (
            "the wall clock's step made followers look lagging: in-sync set "
            f"{sorted(part.isr.isr)}, being removed {sorted(part.isr.pending_remove)}"
        )
        assert zk.sets == 0
        wall.now -= 120_000
        await one_maintenance_tick(mgr)
        assert part.isr.isr == {1, 2, 3} and zk.sets == 0
        # The lag check still works, on the monotonic clock: 3 stops fetching.
        mono.now += LAG_MS // 2
        await fetch(mgr, part, 2, 0)
        mono.now += LAG_MS // 2 + 50
        await fetch(mgr, part, 2, 0)
        await one_maintenance_tick(mgr)
        assert 3 not in part.isr.isr or 3 in part.isr.pending_remove
        assert 2 in part.isr.isr and 2 not in part.isr.pending_remove
        part.close()

    asyncio.run(go())
