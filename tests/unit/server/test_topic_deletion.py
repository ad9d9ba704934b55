"""A deleted topic's partitions on one server (issue 25, DeleteTopics): the LogManager drops a
partition whose topic is gone from ZooKeeper (log, indexes and producer state removed, the
directory renamed away at once), and one whose directory belongs to an older topic of the
same name (deleted and created again while this server was down); a restart neither
brings a dropped partition back nor applies a snapshot or checkpoint older than the
directory to it. Real files, a real LogManager, Assignments as the registry reads them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from partition_server import incarnation
from partition_server.log_manager import LogManager
from partition_server.partition import Partition, Role
from partition_server.producer_state import Outcome
from partition_server.registry import Assignment
from partition_server.settings import ServerSettings
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, TopicSpec
from tests.helpers import ManualClock

PID = 41


def view(created_ms: int | None, *, partitions: int = 1, listed: bool = True) -> Assignment:
    """What the registry reads: topic "t" of that life (None: deleted)."""
    if created_ms is None:
        return Assignment(listed=set())
    spec = TopicSpec("t", partitions, created_ms=created_ms)
    return Assignment(
        topics={"t": spec},
        partitions={("t", p): PartitionState([1], 1) for p in range(partitions)},
        listed={"t"} if listed else None,
    )


def log_manager(tmp_path: Path, clock: ManualClock) -> LogManager:
    s = ServerSettings(data_dir=str(tmp_path), server_id=1)
    return LogManager(s, None, clock_ms=clock)  # type: ignore[arg-type]  # no registry: views given


async def write(part: Partition, seqs: range, pid: int = PID) -> None:
    for seq in seqs:
        raw = bytearray(
            P.encode_batch(
                [(None, b"v%d" % seq)], pid=pid, generation=0, base_sequence=seq, timestamp_ms=1
            )
        )
        d, _ = part.append(
            memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=part.leader_epoch
        )
        assert d.outcome is Outcome.APPEND
    await part.wait_durable(part.log.next_offset)


async def drained(b: LogManager) -> None:
    while b._drops:
        await asyncio.gather(*list(b._drops))


def test_a_deleted_topics_partition_is_dropped_and_a_new_one_starts_clean(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)

    async def go() -> None:
        b = log_manager(tmp_path, clock)
        b.apply_assignment(view(5))
        part = b.partitions[("t", 0)]
        assert part.role is Role.LEADER
        assert incarnation.read(tmp_path / "t-0") == (5, 1_000_000)
        await write(part, range(10))
        await b.snapshot_now()
        b.apply_assignment(view(5, listed=False))  # a failed or partial read: nothing happens
        assert ("t", 0) in b.partitions
        b.apply_assignment(view(None))
        assert ("t", 0) not in b.partitions
        assert part.role is Role.NONE and not part.hosted
        assert not (tmp_path / "t-0").exists()  # renamed away at once
        await drained(b)
        assert [d.name for d in os.scandir(tmp_path) if d.name.startswith("t-")] == []
        assert b.partitions_dropped == 1
        b.apply_assignment(view(9))  # created again
        fresh = b.partitions[("t", 0)]
        assert fresh is not part
        assert fresh.log.next_offset == 0
        assert len(fresh.state) == 0  # no producer state of the old topic
        d = fresh.state.check_append(PID, 0, 10, 1)
        assert d.outcome is not Outcome.DUPLICATE
        await b.close()

    asyncio.run(go())


def test_a_directory_of_an_older_life_is_dropped_and_old_snapshots_are_not_applied(
    tmp_path: Path,
) -> None:
    """A server down while "t" was deleted and created again: at restart its old
    directory is removed, and after that the new directory is not given the older
    snapshot's producer state, neither at once nor after a crash before the next
    snapshot."""
    clock = ManualClock(1_000_000)

    async def go() -> None:
        b = log_manager(tmp_path, clock)
        b.apply_assignment(view(5))
        await write(b.partitions[("t", 0)], range(10))
        await write(b.partitions[("t", 0)], range(5), pid=99)
        await b.snapshot_now()  # PID 41 at sequence 9, PID 99 at 4, up to offset 15
        await b.close()
        clock.now += 60_000
        # restart: ZooKeeper now has "t" of another life
        b = log_manager(tmp_path, clock)
        b.recover(view(7))
        await drained(b)
        fresh = b.partitions[("t", 0)]
        assert fresh.log.next_offset == 0 and len(fresh.state) == 0
        await write(fresh, range(20))  # the new topic's own producer, past offset 15
        for p in b.partitions.values():
            await p.flusher.wait_idle()
            p.close()  # a crash: no snapshot taken since the old one
        clock.now += 1_000
        b = log_manager(tmp_path, clock)
        b.recover(view(7))
        again = b.partitions[("t", 0)]
        assert again.log.next_offset == 20
        assert again.state.check_append(99, 0, 0, 1).outcome is Outcome.APPEND  # unknown here
        assert again.state.check_append(PID, 0, 20, 1).outcome is Outcome.APPEND
        assert len(again.state) == 1
        await b.close()

    asyncio.run(go())


def test_a_restart_after_the_delete_removes_the_directory_and_leftovers(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)

    async def go() -> None:
        b = log_manager(tmp_path, clock)
        b.apply_assignment(view(5, partitions=2))
        await write(b.partitions[("t", 1)], range(3))
        await b.close()
        leftover = tmp_path / f"t-0{incarnation.TRASH}123"  # a crash mid-removal
        leftover.mkdir()
        (leftover / "00000000000000000000.log").write_bytes(b"x")
        b = log_manager(tmp_path, clock)
        b.recover(view(None))
        await drained(b)
        assert not leftover.exists()
        assert [d.name for d in os.scandir(tmp_path) if d.name.startswith("t-")] == []
        assert b.partitions == {}
        await b.close()

    asyncio.run(go())


def test_a_directory_without_a_marker_is_adopted(tmp_path: Path) -> None:
    """Directories made before markers existed belong to the topic ZooKeeper has."""
    clock = ManualClock(1_000_000)

    async def go() -> None:
        b = log_manager(tmp_path, clock)
        b.apply_assignment(view(5))
        await write(b.partitions[("t", 0)], range(4))
        await b.close()
        (tmp_path / "t-0" / incarnation.MARKER).unlink()
        b = log_manager(tmp_path, clock)
        b.recover(view(5))
        part = b.partitions[("t", 0)]
        assert part.log.next_offset == 4
        assert incarnation.read(tmp_path / "t-0") == (5, 0)
        await b.close()

    asyncio.run(go())
