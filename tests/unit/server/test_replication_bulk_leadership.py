"""A survivor elected in many partitions at once (issue 24 item 3): the elections go out
in one ZooKeeper transaction, each new leadership's epoch entry is written to its file
before the role is taken (in parallel, off the loop), and ``become_leader`` then writes
nothing more; a leadership not taken after all leaves a file that says what the history
in memory says. ``ReplicaManager`` with real partitions on disk and the simulation's fake
ZooKeeper."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from partition_server.epochs import EpochHistory
from partition_server.flusher import Flusher
from partition_server.partition import Partition, Role
from partition_server.registry import Assignment
from partition_server.replication import ReplicaManager
from partition_server.testing import InlineExecutor, open_part, settle
from pidlease.wire.cluster import PartitionState, ServerInfo, partition_path, server_path
from tests.helpers import ManualClock
from tests.sim.zk import FakeZk

N = 6


def setup(tmp_path: Path) -> tuple[FakeZk, ReplicaManager, dict[Any, Partition], Assignment]:
    zk = FakeZk(random.Random(0), lambda *_: None)
    c = zk.client("server-2")
    for sid in (2, 3):
        zk.create(server_path(sid), b"{}", owner=c.session, makepath=True)
    parts: dict[Any, Partition] = {}
    for p in range(N):
        zk.create(
            partition_path("t", p),
            PartitionState([1, 2, 3], 1, 0, [1, 2, 3]).to_bytes(),
            makepath=True,
        )
        part = open_part(
            tmp_path,
            Flusher(mode="batch", interval_ms=0, executor=InlineExecutor()),
            partition=p,
        )
        part.hosted = True
        part.become_follower(1, 0, "")
        parts[("t", p)] = part
    a = Assignment(servers={s: ServerInfo(s, "127.0.0.1", 9000 + s) for s in (2, 3)})
    registry = SimpleNamespace(zk=c, refresh=lambda: None, assignment=a)
    settings = SimpleNamespace(
        server_id=2,
        routes={},
        replica_lag_time_max_ms=10_000,
        isr_change_min_interval_ms=0,
        replica_fetch_wait_max_ms=0,
        fetch_bytes_max=1 << 20,
    )
    mgr = ReplicaManager(
        settings,
        registry,
        parts,
        tmp_path,
        clock_ms=ManualClock(1_000),
        zk_executor=InlineExecutor(),
    )
    mgr.epoch_executor = InlineExecutor()
    mgr.started = True
    return zk, mgr, parts, a


def test_a_dead_leaders_partitions_are_won_together_and_each_epoch_file_written_once(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        zk, mgr, parts, a = setup(tmp_path)
        writes = zk.ops
        for key, part in parts.items():  # one read of ZooKeeper: leader 1 is gone
            mgr.apply(key, part, PartitionState([1, 2, 3], 1, 0, [1, 2, 3]), a)
        await settle(30)
        for key, part in parts.items():
            assert part.role is Role.LEADER and part.leader_epoch == 1, key
            assert PartitionState.from_bytes(zk.nodes[partition_path(*key)].data).leader == 2
            on_disk = EpochHistory.load(part.epochs.path.parent)  # type: ignore[union-attr]
            assert on_disk.entries == part.epochs.entries == [(1, 0)]
            assert part.epochs.saves == 0  # the prewrite was the only write
        # N reads, one exists of /servers/1, one transaction of N writes.
        assert zk.ops - writes == N + 2
        for part in parts.values():
            part.close()

    asyncio.run(go())


def test_a_leadership_not_taken_after_its_prewrite_leaves_the_file_as_the_history(
    tmp_path: Path,
) -> None:
    """The epoch files are written, then the lease on the ZooKeeper session is found gone
    before the roles are taken: no role is taken, and every file is saved again from
    memory, not left with the prewritten epoch 1 entry (a restart would read an epoch this
    replica never led)."""

    async def go() -> None:
        _zk, mgr, parts, a = setup(tmp_path)
        first = parts[("t", 0)]
        real = first.epochs.prewrite

        def prewrite_then_lose_the_lease(data: bytes) -> None:
            real(data)
            mgr.registry.lease_session = lambda now_ms: None  # type: ignore[attr-defined]

        first.epochs.prewrite = prewrite_then_lose_the_lease  # type: ignore[method-assign]
        for key, part in parts.items():
            mgr.apply(key, part, PartitionState([1, 2, 3], 1, 0, [1, 2, 3]), a)
        await settle(30)
        for key, part in parts.items():
            assert part.role is not Role.LEADER, key
            on_disk = EpochHistory.load(part.epochs.path.parent)  # type: ignore[union-attr]
            assert on_disk.entries == part.epochs.entries == [], key
        for part in parts.values():
            part.close()

    asyncio.run(go())


def test_bulk_writes_whose_states_are_known_ask_for_no_full_reread(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Every election won: each written znode's data watch brings its state back (a partial
    read), so no full re-read of the cluster is asked for. A failed transaction (it may have
    landed unseen) asks for one."""
    from partition_server import leadership

    async def go() -> None:
        _zk, mgr, parts, a = setup(tmp_path)
        rereads: list[int] = []
        mgr.registry.refresh = lambda: rereads.append(1)  # type: ignore[attr-defined]
        for key, part in parts.items():
            mgr.apply(key, part, PartitionState([1, 2, 3], 1, 0, [1, 2, 3]), a)
        await settle(30)
        assert all(part.role is Role.LEADER for part in parts.values())
        assert rereads == []

        def lost(*_a: Any) -> Any:
            raise ConnectionError("connection lost during the commit")

        monkeypatch.setattr(leadership, "commit_planned", lost)
        key = ("t", 0)
        mgr._zk_bulk(leadership.Change("t", 0, "set_isr", 1, (2,)))
        await settle(30)
        assert rereads == [1], key
        for part in parts.values():
            part.close()

    asyncio.run(go())
