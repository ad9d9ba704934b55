"""A leader-epoch file that cannot be saved (docs/reliability.md, finding 8, found by the
simulation).

``become_leader``, a follower's cut and its fetched batches each change the epoch history
in memory and then save ``leader-epochs``. When the save fails (ENOSPC, any OSError), the
history in memory must stay as it was, or the retry finds "nothing new", never saves, and
after a restart the file lacks that epoch; the role is not taken, and one partition's
failure must not stop the server from applying assignments to the others. The disk is
real; only the ``os`` module seen by ``atomic_file.py`` is swapped for one whose writes
fail for the files a test names."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from partition_server import atomic_file
from partition_server.epochs import EpochHistory
from partition_server.flusher import Flusher
from partition_server.log_manager import LogManager
from partition_server.partition import Role
from partition_server.registry import Assignment, Registry
from partition_server.settings import ServerSettings
from partition_server.testing import b, open_part, stored
from pidlease.errors import ServerUnavailable
from pidlease.wire.cluster import PartitionState, TopicSpec


class FullDisk:
    """``os`` for atomic_file.py: writes to a temporary file under a directory named in
    ``full`` fail with ENOSPC, as on a full disk."""

    def __init__(self) -> None:
        self.full: set[str] = set()
        self.fd_dir: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        fd = os.open(path, flags, mode)
        self.fd_dir[fd] = Path(path).parent.name
        return fd

    def write(self, fd: int, data: Any) -> int:
        if self.fd_dir.get(fd) in self.full:
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        return os.write(fd, data)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    shim = FullDisk()
    monkeypatch.setattr(atomic_file, "os", shim)
    return shim


def on_disk(directory: Path) -> list[tuple[int, int]]:
    return EpochHistory.load(directory).entries


def test_a_failed_save_in_become_leader_changes_nothing_and_the_retry_saves(
    tmp_path: Path, disk: FullDisk
) -> None:
    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 1, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2)]), [(1, 0)])
        assert on_disk(part.log.dir) == [(1, 0)]
        disk.full.add("t-0")
        with pytest.raises(OSError, match=r"No space left on device \(test\)"):
            part.become_leader(2, 2, [1, 2], [1, 2])
        assert part.role is Role.FOLLOWER and part.leader_epoch == 1
        assert part.epochs.entries == [(1, 0)], "the epoch stayed in memory, not on disk"
        disk.full.clear()
        part.become_leader(2, 2, [1, 2], [1, 2])  # the reconcile a second later
        assert part.role is Role.LEADER and part.leader_epoch == 2
        assert on_disk(part.log.dir) == [(1, 0), (2, 2)], "the retry never saved the epoch"
        part.close()

    asyncio.run(go())


def test_a_failed_save_of_fetched_epochs_changes_nothing(tmp_path: Path, disk: FullDisk) -> None:
    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2)]), [(1, 0)])
        disk.full.add("t-0")
        with pytest.raises(OSError, match=r"No space left on device \(test\)"):
            part.append_replicated(stored([b(1, 2, 2)], 2), [(2, 2)])
        assert part.epochs.entries == [(1, 0)] and part.log.next_offset == 2
        disk.full.clear()
        assert part.append_replicated(stored([b(1, 2, 2)], 2), [(2, 2)]) == 1  # the refetch
        assert on_disk(part.log.dir) == [(1, 0), (2, 2)]
        part.close()

    asyncio.run(go())


def test_a_failed_log_write_after_the_epochs_were_saved_leaves_no_entry_past_the_end(
    tmp_path: Path,
) -> None:
    """Found by the simulation (seed 500722 --retention): a follower at log end 2 fetched
    the leader's epoch 0 batch at 2 and its epoch 3 starting at 4; the epochs were saved,
    then the log write failed (ENOSPC). Epoch 3 "starting at 4" stayed in memory past the
    log end, so when this replica was elected at its end (2) it could never take the
    role ("epoch 4 would start at 2, before epoch 3's start 4"), retrying for ever: the
    partition stuck."""

    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2)]), [(1, 0)])

        def full(*_a: object) -> int:
            raise ServerUnavailable("write failed: [Errno 28] No space left on device")

        real = part.log.append
        part.log.append = full  # type: ignore[method-assign]
        with pytest.raises(ServerUnavailable):
            part.append_replicated(stored([b(1, 2, 2), b(1, 4, 2)], 2), [(1, 0), (3, 4)])
        part.log.append = real  # type: ignore[method-assign]
        assert part.log.next_offset == 2
        assert all(start <= 2 for _, start in part.epochs.entries), part.epochs.entries
        part.become_leader(2, 4, [1, 2], [2])  # elected at its end: takes the role
        assert part.epochs.entries[-1] == (4, 2)
        part.close()

    asyncio.run(go())


def test_a_failed_save_in_a_cut_changes_nothing(tmp_path: Path, disk: FullDisk) -> None:
    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2), b(1, 2, 2)]), [(1, 0), (2, 2)])
        before = (list(part.epochs.entries), part.epochs.truncations)
        disk.full.add("t-0")
        with pytest.raises(OSError, match=r"No space left on device \(test\)"):
            part.truncate_to(2)
        assert (part.epochs.entries, part.epochs.truncations) == before
        assert part.log.next_offset == 4
        disk.full.clear()
        assert part.truncate_to(2) == 2
        assert on_disk(part.log.dir) == [(1, 0)]
        assert EpochHistory.load(part.log.dir).truncations == before[1] + 1
        part.close()

    asyncio.run(go())


def test_one_partition_whose_epochs_cannot_be_saved_does_not_stop_the_others(
    tmp_path: Path, disk: FullDisk
) -> None:
    """The registry's change handler applies every partition's assignment: one that
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


def test_the_registry_keeps_applying_after_a_change_handler_fails(tmp_path: Path) -> None:
    async def go() -> None:
        registry = Registry("unused:2181", 1)
        seen: list[Assignment] = []

        def on_change(a: Assignment) -> None:
            seen.append(a)
            if len(seen) == 1:
                raise RuntimeError("handler bug")

        registry.on_change = on_change
        registry._read_all = Assignment  # type: ignore[method-assign]
        first = await asyncio.wait_for(registry.refresh(), 5)  # answered all the same
        second = await asyncio.wait_for(registry.refresh(), 5)
        assert len(seen) == 2 and registry.assignment is second and first is not second

    asyncio.run(go())


def test_a_new_partition_that_cannot_be_opened_does_not_stop_the_others(tmp_path: Path) -> None:
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
