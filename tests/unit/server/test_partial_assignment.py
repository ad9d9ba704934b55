"""A partial read of ZooKeeper (the partitions whose state znode fired) is applied to those
partitions only: the others keep what the last read gave them (issue 24: every partial read
visited every partition, O(partitions) of event-loop time per change)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from partition_server.log_manager import LogManager
from partition_server.partition import Role
from partition_server.registry import Assignment
from partition_server.retention import LogPolicy
from partition_server.settings import ServerSettings
from pidlease.wire.cluster import PartitionState, TopicSpec
from tests.helpers import ManualClock

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
