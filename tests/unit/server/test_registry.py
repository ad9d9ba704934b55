"""``Registry`` (partition_server/registry.py): a partition state's change is read alone
(issue 24 items 3-4: the registry reads again only the partitions whose state znode fired,
not every topic, partition and server; a deleted partition or a topic's spec still bring a
full read; a server coming or going reads the servers alone); a failed read is read again
by itself; the lease heartbeat confirms the session with the quorum; logged errors carry
their text. Against the simulation's fake ZooKeeper (one-shot watches delivered on the
loop) or a fake kazoo client."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol.states import KazooState

from partition_server import registry as registry_mod
from partition_server.leadership import ZkLease
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


# -- the lease heartbeat confirms the session with the quorum (issue 23 item 6)
SESSION = 77


TIMEOUT_MS, MARGIN_MS, HEARTBEAT_MS = 1_200, 300, 200


@dataclass
class Stat:
    ephemeralOwner: int  # noqa: N815 - kazoo's ZnodeStat field name


class Answered:
    """kazoo's IAsyncResult, already answered (or failed)."""

    def __init__(self, value: Any = None, exc: BaseException | None = None) -> None:
        self.value, self.exc = value, exc

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def successful(self) -> bool:
        return self.exc is None


class CutOffFollower:
    """The ZooKeeper server our session is connected to. ``cut``: it lost the quorum; reads
    are still answered from its copy, ``sync`` fails (it cannot reach the leader)."""

    client_id = (SESSION, b"pw")
    connected = True

    def __init__(self) -> None:
        self.cut = False
        self.calls: list[str] = []
        self.reads_answered = 0

    def _stat(self, path: str) -> Stat:
        assert path == server_path(1)
        self.reads_answered += 1
        return Stat(SESSION)  # stale when cut: the quorum may have expired the session

    # the blocking calls (the loop's heartbeat, as in the simulation)
    def sync(self, path: str) -> str:
        self.calls.append("sync")
        if self.cut:
            raise ConnectionLoss
        return path

    def exists(self, path: str) -> Stat:
        self.calls.append("exists")
        return self._stat(path)

    # the asynchronous calls (the heartbeat thread's)
    def sync_async(self, path: str) -> Answered:
        self.calls.append("sync")
        return Answered(exc=ConnectionLoss()) if self.cut else Answered(path)

    def exists_async(self, path: str) -> Answered:
        self.calls.append("exists")
        return Answered(self._stat(path))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(monkeypatch: pytest.MonkeyPatch) -> tuple[Registry, CutOffFollower, Clock]:
    clock = Clock(1_000.0)
    monkeypatch.setattr(registry_mod, "monotonic_ms", clock)
    reg = Registry("unused:2181", 1)
    reg.lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
    zk = reg.zk = CutOffFollower()
    return reg, zk, clock


def test_a_cut_off_follower_answering_reads_extends_no_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 23 item 6: the lease heartbeat confirms the session with the quorum (sync then
    exists), not with the one ZooKeeper server it talks to, which may be cut off from the
    quorum and still answer reads."""

    reg, zk, clock = make(monkeypatch)
    assert reg.lease is not None
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)  # sent at 1000
    clock.now = 1_200
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)
    assert reg.lease.valid(clock.now)
    before = reg.lease.valid_until_ms
    # The server we talk to loses the quorum. It keeps answering exists, with our znode.
    zk.cut = True
    answered = zk.reads_answered
    for t in range(1_400, 3_000, HEARTBEAT_MS):
        clock.now = t
        reg._heartbeat_once(None, HEARTBEAT_MS / 1000)
    assert zk.reads_answered > answered  # stale reads went on
    assert reg.lease.valid_until_ms == before, (
        "a heartbeat answered by a server cut off from the quorum extended the lease from "
        f"{before} to {reg.lease.valid_until_ms}"
    )
    # Each heartbeat is a sync then an exists; the first of a session only sets the
    # anchor, the second confirms from the first's send time: 1000 + 1200 - 300.
    assert zk.calls[:4] == ["sync", "exists", "sync", "exists"]
    assert before == 1_900
    assert reg.lease_session(1_899) == SESSION
    assert reg.lease_session(1_900) is None  # leaderships end at 1900 (step-down)
    # The quorum is back: two confirmed heartbeats, the lease again (from the first's
    # send time).
    zk.cut = False
    clock.now = 3_000
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)
    clock.now = 3_200
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)
    assert reg.lease.valid_until_ms == 3_000 + TIMEOUT_MS - MARGIN_MS


def test_the_loop_heartbeat_syncs_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23 item 6: the lease heartbeat confirms the session with the quorum (sync then
    exists), not with the one ZooKeeper server it talks to, which may be cut off from the
    quorum and still answer reads.

    The event-loop heartbeat (the simulation's): ``sync`` then ``exists``, blocking calls
    through the executor; a failed ``sync`` confirms nothing."""
    reg, zk, clock = make(monkeypatch)
    reg.heartbeat_ms = 1  # the loop sleeps 1 ms between heartbeats

    async def beats(n: int) -> None:
        task = asyncio.create_task(reg._heartbeat_on_loop())
        start = len(zk.calls)
        while len(zk.calls) < start + 2 * n:
            await asyncio.sleep(0.001)
            clock.now += 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def go() -> None:
        assert reg.lease is not None
        await beats(3)
        assert zk.calls[:4] == ["sync", "exists", "sync", "exists"]
        assert reg.lease.valid(clock.now)
        until = reg.lease.valid_until_ms
        zk.cut = True
        clock.now += 100
        await beats(3)
        assert reg.lease.valid_until_ms == until
        assert "exists" not in zk.calls[-4:]  # the read waits for the sync (in order)

    asyncio.run(go())


class Standalone(CutOffFollower):
    """One standalone ZooKeeper server: its ``/zookeeper/config`` is empty (an ensemble's
    lists its members); it is its own session tracker."""

    def __init__(self, config: bytes) -> None:
        super().__init__()
        self.config = config

    def get(self, path: str) -> tuple[bytes, None]:
        assert path == "/zookeeper/config"
        return self.config, None


def test_a_standalone_zookeeper_confirms_from_this_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 23 item 6: the lease heartbeat confirms the session with the quorum (sync then
    exists), not with the one ZooKeeper server it talks to, which may be cut off from the
    quorum and still answer reads.

    A standalone server touches the session when the heartbeat arrives: its answer
    proves the session alive from this heartbeat's send time, not the previous one's, so
    a leader on one ZooKeeper keeps a heartbeat interval more of slack (two slow
    heartbeats in a row under a busy disk made test_follower_loss_cluster's leader step
    down once in five runs with the cautious anchor)."""
    reg, _, clock = make(monkeypatch)
    assert reg.lease is not None
    zk = reg.zk = Standalone(b"")
    reg.standalone_zk = registry_mod._standalone_zk(zk)
    assert reg.standalone_zk
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)  # sent at 1000: confirms at once
    assert reg.lease.valid_until_ms == 1_000 + TIMEOUT_MS - MARGIN_MS
    clock.now = 1_200
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)
    assert reg.lease.valid_until_ms == 1_200 + TIMEOUT_MS - MARGIN_MS
    # An ensemble member (its config lists servers) and a failed read keep the cautious one.
    assert not registry_mod._standalone_zk(Standalone(b"server.1=127.0.0.1:1:2:participant"))
    assert not registry_mod._standalone_zk(CutOffFollower())


class AnsweredLater(Answered):
    """An answer kazoo sets a moment later, from its own thread: not ready until waited for."""

    def __init__(self, value: Any = None) -> None:
        super().__init__(value)
        self.set = False

    def wait(self, timeout: float | None = None) -> bool:
        self.set = True
        return True

    def ready(self) -> bool:
        return self.set


class SyncAnsweredAfterExists(CutOffFollower):
    def sync_async(self, path: str) -> Answered:
        self.calls.append("sync")
        return AnsweredLater(path)


def test_a_sync_answered_after_the_exists_still_confirms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 23 item 6: the lease heartbeat confirms the session with the quorum (sync then
    exists), not with the one ZooKeeper server it talks to, which may be cut off from the
    quorum and still answer reads.

    kazoo may set the sync's result after the exists' although ZooKeeper answered them in
    order: the heartbeat waits for both. Before, it checked ``synced.ready()`` at once, found
    it unset about one heartbeat in two on a real cluster, confirmed nothing, and the
    leader's lease ran out (test_follower_loss_cluster's leader stepped down)."""
    reg, _, clock = make(monkeypatch)
    assert reg.lease is not None
    reg.zk = SyncAnsweredAfterExists()
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)
    clock.now = 1_200
    reg._heartbeat_once(None, HEARTBEAT_MS / 1000)
    assert reg.lease.valid_until_ms == 1_000 + TIMEOUT_MS - MARGIN_MS


# -- a failed read of the cluster state is read again by itself (sim finding 11)
def test_a_failed_read_is_read_again_and_learns_what_was_created_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/reliability.md sim finding 11 (seeds 1510, 3415): after a failed ZooKeeper read
    nothing read it again, so a topic created meanwhile stayed unknown; a failed read is
    read again by itself."""

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
    """docs/reliability.md sim finding 11 (seeds 1510, 3415): after a failed ZooKeeper read
    nothing read it again, so a topic created meanwhile stayed unknown; a failed read is
    read again by itself.

    A topic written node by node (not in one transaction): the read finds the topic,
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
    """Issue 24 items 3-4 (a change is read alone): a server coming or going reads the servers,
    not every partition.

    Issue 24: a children event of /servers (a server's session ended, or one registered)
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


def test_the_registry_keeps_applying_after_a_change_handler_fails(tmp_path: Path) -> None:
    """docs/reliability.md sim finding 8: the registry's task outlives a failing change handler
    (an OSError killed it: no assignment was applied again)."""

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
