"""The lease heartbeat confirms the session with the quorum, not with the one ZooKeeper
server it talks to (issue 23 item 6; docs/replication.md, Step-down).

A ZooKeeper follower cut off from the quorum keeps answering reads (``exists``) from its
own copy for up to syncLimit x tickTime, while the quorum expires the session and elects
another leader. The fake here is such a follower: it answers ``exists`` with the stale
znode (owned by our session) but cannot complete a ``sync`` (it needs the quorum's leader).
The heartbeat must stop extending the lease then, so the leader steps down in time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from partition_server import registry as registry_mod
from partition_server.leadership import ZkLease
from partition_server.registry import Registry
from pidlease.wire.cluster import server_path

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
    """The event-loop heartbeat (the simulation's): ``sync`` then ``exists``, blocking calls
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
    """A standalone server touches the session when the heartbeat arrives: its answer
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
    """kazoo may set the sync's result after the exists' although ZooKeeper answered them in
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
