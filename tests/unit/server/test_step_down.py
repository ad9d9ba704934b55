"""Leader step-down on a fake clock (docs/replication.md, Step-down): ``ZkLease`` (how long
the ZooKeeper session is certainly alive) and ``ReplicaManager``'s use of it: a leader
steps down when its lease ends (waiting acks NOT_LEADER, replica fetches refused, even
when the timer is late), leads nothing without a lease, and leads again only by a
compare-and-set (``step_in``). A real partition, a fake ZooKeeper, writes run inline."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from partition_server.flusher import Flusher
from partition_server.leadership import ZkLease
from partition_server.partition import Partition, Role
from partition_server.registry import Assignment, Registry
from partition_server.replication import ReplicaManager
from partition_server.testing import InlineExecutor, open_part, settle
from pidlease import errors
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState
from tests.helpers import ManualClock
from tests.sim.zk import PartitionZk, partition_zk
from tests.unit.server.test_replication_isr_retry import KEY, append, fetch

TIMEOUT_MS, MARGIN_MS = 1_500, 300


# -- ZkLease ---------------------------------------------------------------------------------
def test_a_confirmed_request_makes_the_lease_end_a_margin_before_the_earliest_expiry() -> None:
    lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
    assert not lease.valid(0)
    assert lease.confirm(5, 1_000)  # a new session's lease begins
    assert lease.valid(2_199) and not lease.valid(2_200)  # 1000 + 1500 - 300
    assert not lease.confirm(5, 900)  # an older send time never shortens it
    assert lease.valid_until_ms == 2_200
    lease.confirm(5, 1_400)
    assert lease.valid(2_599) and not lease.valid(2_600)
    assert lease.held_by(5, 2_000) and not lease.held_by(6, 2_000)
    assert not lease.held_by(None, 2_000)


def test_another_session_restarts_the_lease_and_a_lost_session_ends_it() -> None:
    lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
    lease.confirm(5, 1_000)
    # A new session says nothing of the gap between the two: its lease counts from its
    # own confirmation, and the old session's leaderships are over.
    assert lease.confirm(6, 500)
    assert lease.valid_until_ms == 1_700
    assert not lease.held_by(5, 600) and lease.held_by(6, 600)
    lease.lost()
    assert not lease.valid(600) and lease.session is None


def test_the_granted_timeout_replaces_the_asked_one_and_bounds_the_margin() -> None:
    lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
    lease.set_session_timeout(4_000)  # minSessionTimeout above what was asked
    lease.confirm(1, 0)
    assert lease.valid_until_ms == 3_700
    lease.set_session_timeout(400)  # maxSessionTimeout below it: never outlive the session
    assert lease.margin_ms == 200
    lease.confirm(1, 10_000)
    assert lease.valid_until_ms == 10_200
    with pytest.raises(ValueError, match="margin"):
        ZkLease(1_000, 1_000)


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


def setup(
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


def test_a_leader_steps_down_when_its_lease_ends(tmp_path: Path) -> None:
    async def go() -> None:
        ps = PartitionState([1, 2, 3], 1, 1, [1, 2, 3])
        part, mgr, registry, clock, zk = setup(tmp_path, ps, [1, 2, 3])
        assert registry.lease is not None
        registry.lease.confirm(5, 1_000)  # valid until 2200
        mgr.apply(KEY, part, ps, Assignment())
        assert part.role is Role.LEADER
        ack = await append(part, 0)
        await fetch(mgr, part, 2, 1)  # 3 has not fetched: the ack waits
        assert not ack.done()
        clock.now = 2_199
        mgr.check_lease()
        assert part.role is Role.LEADER and mgr.step_downs_total == 0
        clock.now = 2_200
        mgr.check_lease()
        assert part.role is Role.FOLLOWER and mgr.step_downs_total == 1
        await settle()
        assert ack.done() and isinstance(ack.exception(), errors.NotLeader)
        assert mgr.inherited[KEY] == 1  # leads again only through step_in
        assert mgr.step_downs[-1]["epoch"] == 1
        assert zk.sets == 0  # stepping down writes nothing (ZooKeeper may be unreachable)
        part.close()

    asyncio.run(go())


def test_a_fetch_after_the_lease_ended_is_refused_even_before_the_timer_runs(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        ps = PartitionState([1, 2, 3], 1, 1, [1, 2])
        part, mgr, registry, clock, _ = setup(tmp_path, ps, [1, 2, 3])
        assert registry.lease is not None
        registry.lease.confirm(5, 1_000)
        mgr.apply(KEY, part, ps, Assignment())
        ack = await append(part, 0)
        clock.now = 2_250  # the lease ended; no check_lease has run (a busy loop)
        req = P.Request(
            P.REPLICA_FETCH,
            1,
            "t",
            0,
            offset=1,
            max_bytes=1 << 20,
            replica_id=2,
            leader_epoch=1,
            max_wait_ms=0,
        )
        answer = P.decode_response(P.REPLICA_FETCH, (await mgr.replica_fetch(req, part))[4:])
        assert answer.error_code == errors.NotLeader.code
        assert part.high_watermark == 0, "the fetch moved the high watermark: an ack"
        await settle()
        assert isinstance(ack.exception(), errors.NotLeader)
        part.close()

    asyncio.run(go())


def test_without_a_lease_nothing_is_led_and_the_lease_back_leads_only_by_step_in(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        ps = PartitionState([1, 2, 3], 1, 1, [1, 2, 3])
        part, mgr, registry, clock, zk = setup(tmp_path, ps, [1, 2, 3])
        assert registry.lease is not None
        mgr.apply(KEY, part, ps, Assignment())  # no confirmation yet
        assert part.role is Role.FOLLOWER and zk.sets == 0
        registry.lease.confirm(5, 1_000)
        mgr.apply(KEY, part, ps, Assignment())
        assert part.role is Role.LEADER
        clock.now = 3_000
        mgr.check_lease()
        assert part.role is Role.FOLLOWER
        # ZooKeeper back, same session; it still names server 1 at epoch 1. Server 1 does
        # not simply resume: a compare-and-set hands epoch 2 to a live in-sync replica.
        registry.lease.confirm(5, 3_000)
        mgr.apply(KEY, part, zk.state, Assignment())
        await settle()
        assert part.role is Role.FOLLOWER
        assert zk.sets == 1 and zk.state.leader == 2 and zk.state.leader_epoch == 2
        assert 1 not in zk.state.isr
        part.close()

    asyncio.run(go())


def test_a_new_session_ends_the_leaderships_of_the_old_one(tmp_path: Path) -> None:
    async def go() -> None:
        ps = PartitionState([1, 2, 3], 1, 1, [1, 2, 3])
        part, mgr, registry, _clock, _ = setup(tmp_path, ps, [1])
        assert registry.lease is not None
        registry.lease.confirm(5, 1_000)
        mgr.apply(KEY, part, ps, Assignment())
        assert part.role is Role.LEADER
        # The session expired and kazoo made a new one, confirmed before the timer ran:
        # the new lease is valid, but not for a leadership taken in session 5.
        registry.lease.confirm(6, 1_100)
        mgr.check_lease()
        assert part.role is Role.FOLLOWER and mgr.step_downs_total == 1
        part.close()

    asyncio.run(go())
