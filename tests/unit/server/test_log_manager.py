"""``LogManager`` (partition_server/log_manager.py): snapshots of every partition it holds."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

from partition_server.log_manager import LogManager
from partition_server.partition import Role
from partition_server.registry import Assignment, Registry
from partition_server.settings import ServerSettings
from partition_server.testing import b, open_part, stored
from pidlease.wire.cluster import PartitionState, TopicSpec
from tests.unit.server._disks import FullDisk, on_disk


def test_a_snapshot_leaves_out_a_partition_cut_below_what_it_waits_for(tmp_path: Path) -> None:
    """docs/reliability.md finding 4: a snapshot leaves out a partition cut below what it
    waits for.

    The snapshot waits until each captured end is fsynced. A cut below that end (the
    follower's fetcher reconciling meanwhile) may leave it unreachable: the snapshot must
    neither wait for it forever nor keep that image."""

    async def go() -> None:
        settings = ServerSettings(
            data_dir=str(tmp_path), fsync="interval", fsync_interval_ms=10_000, server_id=1
        )
        log_manager = LogManager(settings, Registry("127.0.0.1:1", 1))
        a = open_part(tmp_path, log_manager.flusher)
        c = open_part(tmp_path, log_manager.flusher, partition=1)
        log_manager.partitions[("t", 0)] = a
        log_manager.partitions[("t", 1)] = c
        for p in (a, c):
            p.become_follower(2, 1, "127.0.0.1:1")
            p.append_replicated(memoryview(stored([b(1, 0, 2), b(1, 2, 2), b(1, 4, 2)])), [(1, 0)])
        capture_c = c.capture

        async def cut_a_then_capture_c(chunk_pids: int = 20_000):  # type: ignore[no-untyped-def]
            # t-0's fetcher reconciles with a leader whose log diverges at 2, after the
            # snapshot captured t-0 up to 6 and before anything fsynced it
            a.truncate_to(2)
            return await capture_c(chunk_pids)

        c.capture = cut_a_then_capture_c  # type: ignore[method-assign]
        await asyncio.wait_for(log_manager.snapshot_now(), 10)
        loaded = log_manager.snapshots.load_newest()
        assert loaded is not None
        assert ("t", 0) not in loaded[0].partitions  # replayed from its log at recovery
        assert loaded[0].partitions[("t", 1)].covered_to == 6
        await log_manager.flusher.wait_idle()
        for p in (a, c):
            p.close()

    asyncio.run(go())


# -- one partition's failure never stops the others (sim finding 8)
def test_one_partition_whose_epochs_cannot_be_saved_does_not_stop_the_others(
    tmp_path: Path, disk: FullDisk
) -> None:
    """docs/reliability.md sim finding 8: one partition whose leader-epoch file cannot be saved
    does not stop the server applying the others' assignments.

    The registry's change handler applies every partition's assignment: one that
    raises must leave the others applied, and the handler must keep working."""

    async def go() -> None:
        s = ServerSettings(data_dir=str(tmp_path / "server"), server_id=1)
        registry = Registry("unused:2181", 1)
        log_manager = LogManager(s, registry)
        log_manager.replicas.started = True  # serving (start() would run its maintenance task)
        a = Assignment(topics={"t": TopicSpec("t", 2, replication_factor=2)})
        for p in (0, 1):
            a.partitions[("t", p)] = PartitionState(
                leader=1, leader_epoch=1, replicas=[1, 2], isr=[1, 2]
            )
        disk.full.add("t-0")
        registry.on_change = log_manager.apply_assignment
        registry._read_all = lambda: a  # type: ignore[method-assign]
        assert await asyncio.wait_for(registry.refresh(), 5) is a
        parts = log_manager.partitions
        assert parts[("t", 1)].role is Role.LEADER, "t-0's failure stopped t-1's assignment"
        assert parts[("t", 0)].role is Role.FOLLOWER
        disk.full.clear()
        log_manager.replicas.reconcile_all()  # the once-a-second retry
        assert parts[("t", 0)].role is Role.LEADER
        assert on_disk(parts[("t", 0)].log.dir) == [(1, 0)]
        for part in parts.values():
            part.close()

    asyncio.run(go())


def test_a_new_partition_that_cannot_be_opened_does_not_stop_the_others(tmp_path: Path) -> None:
    """docs/reliability.md sim finding 8: a new partition that cannot be opened does not stop
    the others."""

    async def go() -> None:
        s = ServerSettings(data_dir=str(tmp_path / "server"), server_id=1)
        log_manager = LogManager(s, Registry("unused:2181", 1))
        opened = log_manager._open

        def open_or_fail(key: tuple[str, int], *args: Any) -> Any:
            if key == ("t", 0):
                raise OSError(errno.ENOSPC, "No space left on device (test)")
            return opened(key, *args)

        log_manager._open = open_or_fail  # type: ignore[method-assign]
        a = Assignment(topics={"t": TopicSpec("t", 2)})
        for p in (0, 1):
            a.partitions[("t", p)] = PartitionState(leader=1, replicas=[1])
        log_manager.apply_assignment(a)
        assert ("t", 0) not in log_manager.partitions
        assert log_manager.partitions[("t", 1)].role is Role.LEADER
        log_manager._open = opened  # type: ignore[method-assign]
        log_manager.apply_assignment(a)  # the next re-read
        assert log_manager.partitions[("t", 0)].role is Role.LEADER
        for part in log_manager.partitions.values():
            part.close()

    asyncio.run(go())
