"""A partition state's change is read alone (issue 24 items 3-4): the registry reads again
only the partitions whose state znode fired, not every topic, partition and server; a
deleted partition or a topic's spec still bring a full read; a server coming or going reads
the servers alone. Against the
simulation's fake ZooKeeper (one-shot watches delivered on the loop)."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol.states import KazooState

from partition_server.registry import Assignment, Registry
from pidlease.wire.cluster import (
    PartitionState,
    ServerInfo,
    TopicSpec,
    partition_path,
    server_path,
    topic_path,
)
from tests.sim.zk import FakeZk


async def settle(reg: Registry, pred: Any) -> None:
    """Until ``pred()`` holds and no read is under way (the fake delivers each watch event
    0-3 ms later, so changes made together may take more than one read)."""
    for _ in range(400):  # bounded: 400 x 5 ms
        if pred() and (reg._task is None or reg._task.done()):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not seen")


def test_changed_partitions_are_read_alone_and_a_deletion_reads_everything() -> None:
    async def go() -> None:
        zk = FakeZk(random.Random(1), lambda *_: None)
        admin = zk.client("admin")
        admin.create(topic_path("t"), TopicSpec(name="t", partitions=50).to_bytes(), makepath=True)
        for p in range(50):
            admin.create(
                partition_path("t", p),
                PartitionState([1, 2], 1, 0, [1, 2]).to_bytes(),
                makepath=True,
            )
        admin.create(server_path(1), ServerInfo(1, "127.0.0.1", 9001).to_bytes(), makepath=True)
        reg = Registry("unused:2181", 2)
        reg.zk = zk.client("server-2")
        seen: list[Assignment] = []
        reg.on_change = seen.append
        await reg.refresh()
        assert len(reg.assignment.partitions) == 50 and len(seen) == 1
        for p in (3, 7, 11):  # a few leader changes at once (one transaction elsewhere)
            admin.set(partition_path("t", p), PartitionState([1, 2], 2, 1, [2]).to_bytes())
        ops = zk.ops
        await settle(
            reg, lambda: all(seen[-1].partitions[("t", p)].leader == 2 for p in (3, 7, 11))
        )
        assert 1 <= reg.partial_reads <= 3
        assert zk.ops - ops <= 3  # those three, not the 50 + topics + servers again
        a = seen[-1]
        assert a.listed is None  # not a full read: no topic may be taken for deleted
        assert all(a.partitions[("t", p)].leader == 2 for p in (3, 7, 11))
        assert a.partitions[("t", 4)].leader == 1 and a.servers.keys() == {1}
        # The watches were armed again: a second change is seen too.
        admin.set(partition_path("t", 7), PartitionState([1, 2], 1, 2, [1, 2]).to_bytes())
        await settle(reg, lambda: seen[-1].partitions[("t", 7)].leader_epoch == 2)
        assert seen[-1].partitions[("t", 7)].leader_epoch == 2
        # A server leaving (its child watch) reads the servers alone: the partitions are
        # kept, and applied again with the new servers (``changed`` None).
        ops = zk.ops
        admin.delete(server_path(1))
        await settle(reg, lambda: not seen[-1].servers)
        assert seen[-1].listed is None and seen[-1].servers == {} and seen[-1].changed is None
        assert seen[-1].partitions == a.partitions | {("t", 7): seen[-1].partitions[("t", 7)]}
        assert zk.ops - ops == 2  # the deletion, then one get_children of /servers

    asyncio.run(go())


# -- logged errors carry their text, a clean stop is logged as one (issue 16)
def test_a_failed_zookeeper_read_logs_what_failed(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 16 (logged errors said nothing: ``set_isr failed: `` and ``reading ZooKeeper
    failed ()``): a failed ZooKeeper read logs what failed."""

    async def go() -> None:
        reg = Registry("unused:2181", 1)

        def read_all() -> None:
            raise ConnectionLoss  # no text: str() of it is empty

        reg._read_all = read_all  # type: ignore[method-assign,assignment] - a stand-in read
        await asyncio.wait_for(reg.refresh(), 5)
        reg._closed = True  # no retry after the test

    with caplog.at_level(logging.WARNING, logger="partition_server.registry"):
        asyncio.run(go())
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("reading ZooKeeper failed (ConnectionLoss()); keeping the last view")


def test_a_clean_stop_is_not_logged_as_a_lost_session(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 16 (log lines): a clean stop is logged as a clean stop, not a lost session."""

    reg = Registry("unused:2181", 1)
    with caplog.at_level(logging.INFO, logger="partition_server.registry"):
        reg.close()  # no client yet: only the flag a SIGTERM's shutdown sets
        reg._on_state(KazooState.LOST)  # what kazoo says when our own stop ends the session
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "ZooKeeper session closed")
    ]
    assert not reg._session_lost
    caplog.clear()
    live = Registry("unused:2181", 1)
    with caplog.at_level(logging.INFO, logger="partition_server.registry"):
        live._on_state(KazooState.LOST)  # a real loss still warns and re-registers later
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "session lost" in caplog.records[0].getMessage() and live._session_lost
