"""A failed read of the cluster state is read again by itself: the one-shot watches may
not be armed after it, and a follower gets no request that would make it look (found by
the deterministic simulation, seed 1510: a topic created while reads failed stayed
unknown)."""

from __future__ import annotations

import asyncio

import pytest

from partition_server import registry as registry_mod
from partition_server.registry import Assignment, Registry
from pidlease.wire.cluster import TopicSpec


def test_a_failed_read_is_read_again_and_learns_what_was_created_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry_mod, "READ_RETRY_S", 0.05, raising=False)

    async def go() -> None:
        reg = Registry("unused:2181", 1)
        reads = 0

        def read_all() -> Assignment:
            nonlocal reads
            reads += 1
            if reads == 1:
                raise ConnectionError("ZooKeeper read failed")
            a = Assignment()
            a.topics["t"] = TopicSpec(name="t", partitions=1)
            return a

        seen: list[Assignment] = []
        reg.on_change = seen.append
        reg._read_all = read_all  # type: ignore[method-assign]
        first = await asyncio.wait_for(reg.refresh(), 5)
        assert "t" not in first.topics and not seen  # the old view, kept
        for _ in range(100):  # bounded: 100 x 20 ms
            if seen:
                break
            await asyncio.sleep(0.02)
        assert reads == 2 and seen and "t" in seen[-1].topics
        await asyncio.sleep(0.2)
        assert reads == 2  # one retry after one failure, not a loop

    asyncio.run(go())


def test_partitions_created_between_get_children_and_exists_are_read() -> None:
    """A topic written node by node (not in one transaction): the read finds the topic,
    ``get_children`` of its partitions says no node, and the partitions (with partition 0)
    are created before the ``exists`` that was to watch their creation. ``exists`` then
    sets only a data watch, so no event would ever bring partition 0: the read must take
    the children again (a follower of tests/integration/test_retention_cluster.py never
    hosted its partition when this happened)."""
    from kazoo.exceptions import NoNodeError

    from pidlease.wire.cluster import PartitionState, partition_path, topic_path

    class RacyZk:
        def __init__(self) -> None:
            self.created = False

        def get_children(self, path: str, watch: object = None) -> list[str]:
            if path == "/topics":
                return ["t"]
            if path == "/servers":
                return []
            if not self.created:
                self.created = True  # created right after this answer
                raise NoNodeError
            return ["0"]

        def exists(self, path: str, watch: object = None) -> object:
            return object() if self.created else None

        def get(self, path: str, watch: object = None) -> tuple[bytes, None]:
            if path == topic_path("t"):
                return TopicSpec(name="t", partitions=1).to_bytes(), None
            assert path == partition_path("t", 0)
            return PartitionState([1], 1, 0, [1]).to_bytes(), None

    reg = Registry("unused:2181", 1)
    reg.zk = RacyZk()
    a = reg._read_all()
    assert ("t", 0) in a.partitions


def test_a_server_coming_or_going_reads_the_servers_not_every_partition() -> None:
    """Issue 24: a children event of /servers (a server's session ended, or one registered)
    reads the servers again, not every topic and partition state; the partitions are kept
    from the last read, and applied again with the new servers (``changed`` None)."""
    import random

    from pidlease.wire.cluster import PartitionState, ServerInfo, partition_path, server_path
    from pidlease.wire.cluster import topic_path as tpath
    from tests.sim.zk import FakeZk

    async def go() -> None:
        zk = FakeZk(random.Random(0), lambda *_: None)
        c = zk.client("server-1")
        for sid in (1, 2, 3):
            zk.create(server_path(sid), ServerInfo(sid, "h", 9000 + sid).to_bytes(), makepath=True)
        zk.create(tpath("t"), TopicSpec("t", 40).to_bytes(), makepath=True)
        for p in range(40):
            zk.create(
                partition_path("t", p), PartitionState([1, 2, 3], 2).to_bytes(), makepath=True
            )
        reg = Registry("unused:2181", 1)
        reg.zk = c  # type: ignore[assignment]  # the simulation's ZooKeeper client
        seen: list[Assignment] = []
        reg.on_change = seen.append
        full = await asyncio.wait_for(reg.refresh(), 5)
        assert set(full.servers) == {1, 2, 3} and len(full.partitions) == 40
        ops = zk.ops
        zk.delete(server_path(2))  # server 2's session ended
        for _ in range(100):  # bounded: 100 x 10 ms
            if len(seen) > 1:
                break
            await asyncio.sleep(0.01)
        latest = seen[-1]
        assert set(latest.servers) == {1, 3}
        assert latest.partitions == full.partitions and latest.changed is None
        # one get_children of /servers and a get per live server: no partition read
        assert zk.ops - ops <= 1 + 1 + 2, zk.ops - ops
        assert reg.partial_reads == 1
        # and the watch is armed again: a server registering is seen the same way
        zk.create(server_path(4), ServerInfo(4, "h", 9004).to_bytes())
        for _ in range(100):
            if 4 in seen[-1].servers:
                break
            await asyncio.sleep(0.01)
        assert set(seen[-1].servers) == {1, 3, 4} and reg.partial_reads == 2

    asyncio.run(go())
