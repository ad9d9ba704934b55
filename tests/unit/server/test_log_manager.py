"""``LogManager`` (partition_server/log_manager.py): snapshots of every partition it holds;
applying assignments (one partition's failure never stops the others; a partial read visits
only the partitions it read); a deleted topic's partitions dropped, and a directory of an
older life of the same name never served. Real files, a real LogManager."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from partition_server import incarnation
from partition_server.log_manager import LogManager
from partition_server.partition import Partition, Role
from partition_server.producer_state import Outcome
from partition_server.registry import Assignment, Registry
from partition_server.retention import LogPolicy
from partition_server.settings import ServerSettings
from partition_server.testing import b, open_part, stored
from partition_server.testing import b as batch
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, TopicSpec
from tests.helpers import ManualClock
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


# -- a partial read is applied to the partitions it read only (issue 24)
SPEC = TopicSpec("t", 4)


MARK = LogPolicy(retention_ms=12_345)  # not the topic's: a visit puts the topic's back


def states(**over: PartitionState) -> dict[tuple[str, int], PartitionState]:
    out = {("t", p): PartitionState([1], 1) for p in range(4)}
    out.update({("t", int(k[1:])): v for k, v in over.items()})
    return out


def make_log_manager(tmp_path: Path) -> LogManager:
    settings = ServerSettings(data_dir=str(tmp_path))
    return LogManager(settings, None, clock_ms=ManualClock(10**9))  # type: ignore[arg-type]  # no registry needed here


def mark_all(b: LogManager) -> None:
    for part in b.partitions.values():
        part.log.policy = MARK


def visited(b: LogManager) -> list[int]:
    return sorted(k[1] for k, part in b.partitions.items() if part.log.policy != MARK)


def close_all(b: LogManager) -> None:
    for part in b.partitions.values():
        part.close()


def test_a_partial_read_visits_only_the_partitions_it_read(tmp_path: Path) -> None:
    """Issue 24 (every partial read visited every partition, O(partitions) of event-loop time
    per change): a partial read of ZooKeeper is applied to the partitions it read only."""

    async def go() -> None:
        b = make_log_manager(tmp_path)
        b.apply_assignment(Assignment(topics={"t": SPEC}, partitions=states(), listed={"t"}))
        assert all(p.hosted and p.role is Role.LEADER for p in b.partitions.values())
        mark_all(b)
        # t/1 moved to server 2: only t/1 is visited, and only t/1 leaves this server.
        b.apply_assignment(
            Assignment(
                topics={"t": SPEC},
                partitions=states(p1=PartitionState([2], 2)),
                changed=frozenset({("t", 1)}),
            )
        )
        assert visited(b) == []  # t/1 is no longer hosted here: nothing of it is applied
        assert not b.partitions[("t", 1)].hosted
        assert b.partitions[("t", 1)].role is Role.NONE
        for p in (0, 2, 3):
            assert b.partitions[("t", p)].hosted
            assert b.partitions[("t", p)].role is Role.LEADER
        # and back: visited alone, hosted and leading again
        b.apply_assignment(
            Assignment(topics={"t": SPEC}, partitions=states(), changed=frozenset({("t", 1)}))
        )
        assert visited(b) == [1]
        assert b.partitions[("t", 1)].hosted and b.partitions[("t", 1)].role is Role.LEADER
        # a full read (listed) visits them all again
        b.apply_assignment(Assignment(topics={"t": SPEC}, partitions=states(), listed={"t"}))
        assert visited(b) == [0, 1, 2, 3]
        close_all(b)

    asyncio.run(go())


def test_a_partition_whose_opening_failed_is_tried_again_at_the_next_partial_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 (every partial read visited every partition, O(partitions) of event-loop time
    per change): a partial read of ZooKeeper is applied to the partitions it read only."""

    async def go() -> None:
        b = make_log_manager(tmp_path)
        real_open = b._open
        broken = {("t", 2)}

        def flaky_open(key: tuple[str, int], *a: Any, **kw: Any) -> Any:
            if key in broken:
                raise OSError(28, "No space left on device")
            return real_open(key, *a, **kw)

        monkeypatch.setattr(b, "_open", flaky_open)
        b.apply_assignment(Assignment(topics={"t": SPEC}, partitions=states(), listed={"t"}))
        assert ("t", 2) not in b.partitions
        mark_all(b)
        broken.clear()
        # another partition changes: the failed one is visited too, and opens now
        b.apply_assignment(
            Assignment(
                topics={"t": SPEC},
                partitions=states(p0=PartitionState([1], 1, 1)),
                changed=frozenset({("t", 0)}),
            )
        )
        assert b.partitions[("t", 2)].hosted and b.partitions[("t", 2)].role is Role.LEADER
        assert visited(b) == [0, 2]
        close_all(b)

    asyncio.run(go())


# -- a deleted topic's partitions (issue 25 item 3, DeleteTopics)
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
    """Issue 25 item 3 (DeleteTopics): a deleted topic's partitions are dropped by the
    LogManager, and a directory of an older life of the same name is never served or given
    an old snapshot."""

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
    """Issue 25 item 3 (DeleteTopics): a deleted topic's partitions are dropped by the
    LogManager, and a directory of an older life of the same name is never served or given
    an old snapshot.

    A server down while "t" was deleted and created again: at restart its old
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
    """Issue 25 item 3 (DeleteTopics): a deleted topic's partitions are dropped by the
    LogManager, and a directory of an older life of the same name is never served or given
    an old snapshot."""

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
    """Issue 25 item 3 (DeleteTopics): a deleted topic's partitions are dropped by the
    LogManager, and a directory of an older life of the same name is never served or given
    an old snapshot.

    Directories made before markers existed belong to the topic ZooKeeper has."""
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


# -- who may drop producer state: the leader only (docs/reliability.md finding 7)
EXPIRE_MS = 10_000


def follower(tmp_path: Path, clock: ManualClock, **limits: Any) -> Partition:
    """A replicated partition on this server, following server 2 (as recovery opens it)."""
    part = open_part(tmp_path, clock_ms=clock, expire_ms=EXPIRE_MS, **limits)
    part.become_follower(2, 1, "127.0.0.1:1")
    return part


def expiry_log_manager(tmp_path: Path, clock: ManualClock, part: Partition) -> LogManager:
    s = ServerSettings(
        data_dir=str(tmp_path / "server"), pid_expire_ms=EXPIRE_MS, allow_short_pid_expire=True
    )
    b = LogManager(s, None, clock_ms=clock)  # type: ignore[arg-type]  # no registry needed here
    b.partitions[("t", 0)] = part
    return b


# -- finding 7 ----------------------------------------------------------------------------
def test_follower_keeps_a_renewed_pid_and_the_new_leader_gives_it_a_full_period(
    tmp_path: Path,
) -> None:
    """docs/reliability.md finding 7 (review 7): renewals touch a PID's last use on the leader
    only, so followers never expire or evict and a new leader gives every PID a full expiry
    period."""

    clock = ManualClock()
    part = follower(tmp_path, clock)
    b = expiry_log_manager(tmp_path, clock, part)
    assert part.append_replicated(stored([batch(7, 0, 3)]), [(1, 0)]) == 1
    part.set_high_watermark(3)  # the leader's next fetch answer: committed, not in flight
    # The producer stays idle but renews its lease on the leader (PRODUCER_STATE touches
    # the leader's state only) for three expiry periods.
    clock.now += 3 * EXPIRE_MS
    assert b.expire_pids(clock.now) == 0
    assert 7 in part.state, "a follower expired a PID on its own clock"
    part.become_leader(1, 2, [1, 2], [1, 2])  # the old leader died
    e = part.state.get(7)
    assert e is not None and e.last_use_ms == clock.now and e.durable_highwater == 2
    # A live producer renews within the new period; a dead one expires one period on.
    clock.now += EXPIRE_MS - 1
    assert b.expire_pids(clock.now) == 0 and 7 in part.state
    clock.now += 1
    assert b.expire_pids(clock.now) == 1 and 7 not in part.state
    assert part.state.dropped_last_use_max_ms == clock.now - EXPIRE_MS
    asyncio.run(part.flusher.wait_idle())
    part.close()


def test_follower_never_evicts_for_room_and_a_new_leader_evicts_no_live_pid(tmp_path: Path) -> None:
    """docs/reliability.md finding 7 (review 7): renewals touch a PID's last use on the leader
    only, so followers never expire or evict and a new leader gives every PID a full expiry
    period."""

    clock = ManualClock()
    part = follower(tmp_path, clock, pids_max=1, evict_idle_min_ms=1_000)
    assert part.append_replicated(stored([batch(7, 0)]), [(1, 0)]) == 1
    part.set_high_watermark(1)
    clock.now += 5_000
    assert part.append_replicated(stored([batch(8, 0)], start=1), [(1, 0)]) == 1
    part.set_high_watermark(2)
    assert 7 in part.state and 8 in part.state, "a follower evicted PID 7 to make room"
    assert part.state.dropped_last_use_max_ms == 0
    part.become_leader(1, 2, [1, 2], [1, 2])
    # Right after the failover no PID has been idle for evict_idle_min_ms by this leader's
    # clock, so a new PID is refused rather than forgetting one that may be live.
    assert part.state.check_append(9, 0, 0, 1, clock.now).outcome is Outcome.TOO_MANY_PIDS
    clock.now += 1_000
    assert part.state.check_append(9, 0, 0, 1, clock.now).outcome is Outcome.APPEND
    part.state.apply_append(9, 0, 0, 1, 2, clock.now)
    assert len(part.state) == 1 and 9 in part.state
    assert part.state.dropped_last_use_max_ms == clock.now - 1_000
    asyncio.run(part.flusher.wait_idle())
    part.close()


def test_non_replicated_partition_still_expires(tmp_path: Path) -> None:
    """docs/reliability.md finding 7 (review 7): renewals touch a PID's last use on the leader
    only, so followers never expire or evict and a new leader gives every PID a full expiry
    period."""

    clock = ManualClock()
    part = open_part(tmp_path, hw=None, clock_ms=clock, expire_ms=EXPIRE_MS)
    b = expiry_log_manager(tmp_path, clock, part)
    part.state.apply_append(7, 0, 0, 1, 0, clock.now, durable=True)
    clock.now += EXPIRE_MS
    assert b.expire_pids(clock.now) == 1
    part.close()
