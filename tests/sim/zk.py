"""A fake ZooKeeper with the kazoo client surface the partition server uses (registry.py,
leadership.py, kafka/pids.py): znodes with versions, ephemeral znodes owned by sessions,
one-shot data and child watches delivered later on the watching node, failed writes
(ConnectionLoss, as when the ensemble is unreachable) and session expiry (ephemerals
deleted, LOST then CONNECTED to the listener).

An ensemble of 3 ZooKeeper servers (``FakeZk(servers=3)``, ``--zk3``): each session is
attached to one of them. ``isolate(z)`` cuts server ``z`` off from the quorum, as a
network partition does: it keeps serving the sessions attached to it for up to
``sync_limit_s`` (syncLimit x tickTime, when a follower notices it lost its leader),
reads from its copy of the tree as it was when cut off (stale: it sees no election, no
expiry), while writes and ``sync`` fail (ConnectionLoss: they need the leader) and watch
events wait. The quorum hears nothing from those sessions: ``session_timeout_s`` later it
expires them (their ephemerals go, the rest of the cluster elects new leaders), and the
clients learn it only when their server drops them at the end of the window and they
reconnect to another (LOST, then CONNECTED with a new session); a session still alive
then resumes, and its pending watch events are delivered.

This is the project's one fake ZooKeeper (issue 28): the simulation's, and the unit tests'
(``partition_zk`` for one partition's state znode; the async calls and
``before_request`` gate for the coordinator's write batcher; ``fail_writes`` /
``land_failed`` for a lost connection around a write)."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (  # type: ignore[import-untyped]
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import KazooState, WatchedEvent  # type: ignore[import-untyped]

from pidlease.wire.cluster import PartitionState, partition_path, server_path
from tests.sim.loop import NODE


@dataclass
class Stat:
    version: int
    ephemeralOwner: int  # noqa: N815 - kazoo's name


@dataclass
class _Znode:
    data: bytes
    version: int
    owner: int


@dataclass
class ZkServer:
    """One server of the ensemble; ``stale`` is its copy of the tree while cut off."""

    zid: int
    stale: dict[str, _Znode] | None = None
    cut_at: float = 0.0


class FakeZk:
    def __init__(
        self,
        rng: random.Random | None = None,
        trace: Callable[[str, str], None] | None = None,
        servers: int = 1,
    ) -> None:
        self.rng = rng if rng is not None else random.Random(0)
        self.trace = trace if trace is not None else (lambda kind, msg: None)
        self.nodes: dict[str, _Znode] = {"/": _Znode(b"", 0, 0)}
        self.ensemble = [ZkServer(z) for z in range(servers)]
        self.clients: list[FakeZkClient] = []
        self.session_timeout_s = 1.2
        self.sync_limit_s = 4.0
        # Called with (session, client) when the quorum expires a session attached to a
        # server cut off from it (the lease check of world.py).
        self.on_quorum_expiry: Callable[[int, FakeZkClient], None] | None = None
        self.ctx = contextvars.copy_context()  # the world's (no node): the ensemble's timers
        self._data_watches: dict[str, list[tuple[FakeZkClient, Callable[..., Any]]]] = {}
        self._child_watches: dict[str, list[tuple[FakeZkClient, Callable[..., Any]]]] = {}
        self.write_fail_p = 0.0
        self.read_fail_p = 0.0
        self._sessions = 0
        self.ops = 0
        self.on_owner_read: Callable[[FakeZkClient], None] | None = None
        # Unit tests: ``sets`` counts set requests and transaction commits (failed ones
        # too); the next ``fail_writes`` of them raise ConnectionLoss, after being applied
        # when ``land_failed`` (a lost connection leaves the outcome unknown to the writer).
        self.sets = 0
        self.fail_writes = 0
        self.land_failed = False
        # The async calls (the coordinator's): each first calls ``before_request`` (a test
        # holds a request "in ZooKeeper" with it), then runs under ``lock`` (threads).
        self.before_request: Callable[[], None] | None = None
        self.lock = threading.RLock()
        self.multi_sizes: list[int] = []

    def client(self, name: str) -> FakeZkClient:
        """A new session for the node ``name``, on a server in touch with the quorum."""
        c = FakeZkClient(self, name)
        c.server = self.pick_server()
        self.clients.append(c)
        return c

    def pick_server(self) -> int:
        ok = [z.zid for z in self.ensemble if z.stale is None]
        return self.rng.choice(ok) if ok else 0

    # -- an ensemble member cut off from the quorum ------------------------------------------
    def isolate(self, zid: int, until_s: float) -> None:
        """Cut server ``zid`` off from the quorum now; it notices after ``until_s`` (at most
        ``sync_limit_s``) and drops its sessions."""
        z = self.ensemble[zid]
        if z.stale is not None or len(self.ensemble) < 2:
            return
        loop = asyncio.get_running_loop()
        z.stale = {p: _Znode(n.data, n.version, n.owner) for p, n in self.nodes.items()}
        z.cut_at = loop.time()
        attached = [c for c in self.clients if c.server == zid and c.alive()]
        self.trace(
            "zk",
            f"zookeeper server {zid} cut off from the quorum for {until_s * 1000:.0f} ms; "
            f"sessions on it: {', '.join(c.name for c in attached) or 'none'}",
        )
        for c in attached:
            loop.call_later(
                self.session_timeout_s, self._quorum_expires, c, c.session, context=self.ctx
            )
        loop.call_later(min(until_s, self.sync_limit_s), self.heal, zid, context=self.ctx)

    def _quorum_expires(self, c: FakeZkClient, session: int) -> None:
        """The quorum heard nothing from ``session`` for the session timeout."""
        if c.session != session or c.server_cut() is None or not c.alive():
            return  # it moved to a server in touch with the quorum in time
        c.expired_on_quorum = True
        self.trace("zk", f"the quorum expires the session 0x{session:x} of {c.name}")
        self.expire(session)
        if self.on_quorum_expiry is not None:
            self.on_quorum_expiry(session, c)

    def heal(self, zid: int) -> None:
        """Server ``zid`` noticed it lost the quorum: it drops its sessions (they reconnect
        elsewhere at once) and rejoins, its stale copy gone."""
        z = self.ensemble[zid]
        if z.stale is None:
            return
        z.stale = None
        self.trace("zk", f"zookeeper server {zid} drops its sessions and rejoins the quorum")
        for c in [c for c in self.clients if c.server == zid]:
            c.server = self.pick_server()
            if c.alive():
                c.reconnected()

    def heal_all(self) -> None:
        for z in self.ensemble:
            self.heal(z.zid)

    def new_session(self) -> int:
        self._sessions += 1
        return 0x5000 + self._sessions

    # -- the tree --------------------------------------------------------------------------
    @staticmethod
    def _parent(path: str) -> str:
        return path.rsplit("/", 1)[0] or "/"

    def children(self, path: str) -> list[str]:
        return _children(self.nodes, path)

    def create(self, path: str, data: bytes, owner: int = 0, makepath: bool = False) -> None:
        if path in self.nodes:
            raise NodeExistsError
        parent = self._parent(path)
        if parent not in self.nodes:
            if not makepath:
                raise NoNodeError
            self.create(parent, b"", 0, True)
        self.nodes[path] = _Znode(data, 0, owner)
        self._fire(self._data_watches, path, "CREATED")
        self._fire(self._child_watches, parent, "CHILD")

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        z = self.nodes.get(path)
        if z is None:
            raise NoNodeError
        if version not in (-1, z.version):
            raise BadVersionError
        z.data = data
        z.version += 1
        self._fire(self._data_watches, path, "CHANGED")
        return Stat(z.version, z.owner)

    def delete(self, path: str, version: int = -1) -> None:
        z = self.nodes.get(path)
        if z is None:
            raise NoNodeError
        if version not in (-1, z.version):
            raise BadVersionError
        del self.nodes[path]
        self._fire(self._data_watches, path, "DELETED")
        self._fire(self._child_watches, self._parent(path), "CHILD")

    def expire(self, session: int) -> None:
        for p in [p for p, z in self.nodes.items() if z.owner == session]:
            self.trace("zk", f"session 0x{session:x} expired: {p} deleted")
            self.delete(p)

    def _fire(self, table: dict[str, list[Any]], path: str, kind: str) -> None:
        for client, cb in table.pop(path, []):
            client.deliver(cb, WatchedEvent(kind, None, path))


class FakeZkClient:
    """One node's session (kazoo.KazooClient's surface as the server uses it)."""

    def __init__(self, zk: FakeZk, name: str) -> None:
        self.zk = zk
        self.name = name
        self.session = zk.new_session()
        self.client_id = (self.session, b"")
        self.connected = True
        self.listeners: list[Callable[[str], Any]] = []
        self.ctx = contextvars.copy_context()  # the node's: watches run there
        self.failed_writes = 0
        self.server = 0  # the ensemble member this session talks to
        self.expired_on_quorum = False  # while cut off: the client does not know yet
        self.held: list[tuple[Callable[..., Any], Any]] = []  # watch events while cut off

    # -- session -----------------------------------------------------------------------------
    def add_listener(self, fn: Callable[[str], Any]) -> None:
        self.listeners.append(fn)

    def deliver(self, cb: Callable[..., Any], event: Any) -> None:
        if self.server_cut() is not None:
            self.held.append((cb, event))  # its server hears of no change
            return
        loop = asyncio.get_running_loop()
        loop.call_later(self.zk.rng.random() * 0.003, cb, event, context=self.ctx)

    def alive(self) -> bool:
        """Its process is alive and has not closed it."""
        node = self.ctx.get(NODE)
        return self.connected and (node is None or node.alive)

    def server_cut(self) -> dict[str, _Znode] | None:
        """The stale tree of this session's server when it is cut off, else None."""
        return self.zk.ensemble[self.server].stale if self.zk.ensemble else None

    def reconnected(self) -> None:
        """Moved to a server in touch with the quorum: LOST and a new session if the quorum
        expired this one meanwhile, else the events it missed."""
        held, self.held = self.held, []
        if self.expired_on_quorum:
            self.expired_on_quorum = False
            self.zk.trace("zk", f"{self.name} reconnects: its session expired")
            self._lost_then_connected()
            return
        for cb, event in held:
            self.deliver(cb, event)
        # Watches set on the stale copy fire if the quorum's tree differs (kazoo sends
        # them again with the last zxid it saw): fire them all, a re-read costs nothing.
        for table in (self.zk._data_watches, self.zk._child_watches):
            for path in list(table):
                mine = [(c, cb) for c, cb in table[path] if c is self]
                if mine:
                    table[path] = [(c, cb) for c, cb in table[path] if c is not self]
                    for _, cb in mine:
                        self.deliver(cb, WatchedEvent("CHANGED", None, path))

    def expire_session(self) -> None:
        """Session expiry: ephemerals go, the client sees LOST, then reconnects (new id).
        A client whose server is cut off from the quorum learns it only when it reconnects
        elsewhere."""
        self.zk.expire(self.session)
        if self.server_cut() is not None:
            self.expired_on_quorum = True
            return
        self._lost_then_connected()

    def _lost_then_connected(self) -> None:
        self.session = self.zk.new_session()
        self.client_id = (self.session, b"")
        loop = asyncio.get_running_loop()
        for fn in list(self.listeners):
            self.ctx.run(fn, KazooState.LOST)
            loop.call_later(
                0.005 + self.zk.rng.random() * 0.02, fn, KazooState.CONNECTED, context=self.ctx
            )

    def _maybe_fail(self, write: bool) -> None:
        if write and self.server_cut() is not None:
            self.failed_writes += 1
            self.zk.trace("zk", f"{self.name}: a write fails (its server is cut off)")
            raise ConnectionLoss
        p = self.zk.write_fail_p if write else self.zk.read_fail_p
        if p and self.zk.rng.random() < p:
            if write:
                self.failed_writes += 1
            self.zk.trace(
                "zk", f"{self.name}: a {'write' if write else 'read'} fails (ConnectionLoss)"
            )
            raise ConnectionLoss

    # -- kazoo calls -------------------------------------------------------------------------
    def get(self, path: str, watch: Callable[..., Any] | None = None) -> tuple[bytes, Stat]:
        self.zk.ops += 1
        self._maybe_fail(False)
        z = self._tree().get(path)
        if z is None:
            raise NoNodeError
        if watch is not None:
            self.zk._data_watches.setdefault(path, []).append((self, watch))
        if path.startswith("/kafka_pids/") and self.zk.on_owner_read is not None:
            self.zk.on_owner_read(self)
        return z.data, Stat(z.version, z.owner)

    def exists(self, path: str, watch: Callable[..., Any] | None = None) -> Stat | None:
        self.zk.ops += 1
        self._maybe_fail(False)
        if watch is not None:
            self.zk._data_watches.setdefault(path, []).append((self, watch))
        z = self._tree().get(path)
        return None if z is None else Stat(z.version, z.owner)

    def sync(self, path: str) -> str:
        """Through the quorum's leader (the lease heartbeat's sync before its exists): it
        fails as a write does (a server cut off from the quorum cannot answer it)."""
        self.zk.ops += 1
        self._maybe_fail(True)
        return path

    def get_children(self, path: str, watch: Callable[..., Any] | None = None) -> list[str]:
        self.zk.ops += 1
        self._maybe_fail(False)
        tree = self._tree()
        if path not in tree:
            raise NoNodeError
        if watch is not None:
            self.zk._child_watches.setdefault(path, []).append((self, watch))
        return _children(tree, path)

    def create(
        self, path: str, data: bytes = b"", ephemeral: bool = False, makepath: bool = False
    ) -> str:
        self.zk.ops += 1
        self._maybe_fail(True)
        self.zk.create(path, data, self.session if ephemeral else 0, makepath)
        return path

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        self.zk.ops += 1
        self.zk.sets += 1
        self._maybe_fail(True)
        if self.zk.fail_writes:
            z = self.zk.nodes.get(path)
            if z is not None and version in (-1, z.version):
                self._injected_failure(lambda: self.zk.set(path, data, version))
        return self.zk.set(path, data, version)

    def _injected_failure(self, apply: Callable[[], Any]) -> None:
        """One of the ``fail_writes``: ConnectionLoss, after ``apply`` when ``land_failed``."""
        self.zk.fail_writes -= 1
        if self.zk.land_failed:
            apply()
        raise ConnectionLoss

    # -- the async calls (kazoo's ``*_async``, as the coordinator's store makes them) --------
    def _async(self, fn: Callable[[], Any]) -> FakeAsyncResult:
        if self.zk.before_request is not None:
            self.zk.before_request()
        with self.zk.lock:
            try:
                return FakeAsyncResult(fn())
            except Exception as exc:  # noqa: BLE001 - kazoo hands it to the result
                return FakeAsyncResult(exc)

    def create_async(self, path: str, value: bytes = b"", makepath: bool = False) -> Any:
        return self._async(lambda: self.create(path, value, makepath=makepath))

    def set_async(self, path: str, value: bytes, version: int = -1) -> Any:
        return self._async(lambda: self.set(path, value, version))

    def delete(self, path: str, version: int = -1) -> None:
        self.zk.ops += 1
        self._maybe_fail(True)
        self.zk.delete(path, version)

    def transaction(self) -> FakeTransaction:
        return FakeTransaction(self)

    def _tree(self) -> dict[str, _Znode]:
        stale = self.server_cut()
        return self.zk.nodes if stale is None else stale

    def ensure_path(self, path: str) -> bool:
        self.zk.ops += 1
        self._maybe_fail(True)
        if path not in self.zk.nodes:
            self.zk.create(path, b"", 0, True)
        return True

    def stop(self) -> None:
        self.connected = False

    def close(self) -> None:
        pass


class FakeTransaction:
    """kazoo's ``TransactionRequest`` (ZooKeeper ``multi``), the versioned writes the
    partition servers' bulk leadership changes make (``leadership.write_many``): ``commit``
    is one write request (it fails as one: ConnectionLoss, raised), and applies every write
    or none. A stale version or a missing znode fails the whole transaction: kazoo's answer
    is a list with the error at the failing write and RolledBackError (before it) or
    RuntimeInconsistency (after it) at the others; nothing changes, no watch fires."""

    def __init__(self, client: FakeZkClient) -> None:
        self.client = client
        # (path, value, version); version None: a create
        self.writes: list[tuple[str, bytes, int | None]] = []

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self.writes.append((path, value, version))

    def create(self, path: str, value: bytes = b"") -> None:
        self.writes.append((path, value, None))

    def commit_async(self) -> FakeAsyncResult:
        self.client.zk.multi_sizes.append(len(self.writes))
        return self.client._async(self.commit)

    def commit(self) -> list[Any]:
        c = self.client
        c.zk.ops += 1
        c.zk.sets += 1
        c._maybe_fail(True)  # one request, as the real multi is
        nodes = c.zk.nodes
        exists = {p: nodes[p].version if p in nodes else None for p, _, _ in self.writes}
        for i, (path, _value, version) in enumerate(self.writes):
            have = exists[path]
            err: Exception | None = None
            if version is None:
                if have is not None:
                    err = NodeExistsError()
                elif FakeZk._parent(path) not in nodes and FakeZk._parent(path) not in exists:
                    err = NoNodeError()
                else:
                    exists[path] = 0
            elif have is None:
                err = NoNodeError()
            elif version not in (-1, have):
                err = BadVersionError()
            else:
                exists[path] = have + 1
            if err is not None:
                return [
                    RolledBackError() if j < i else err if j == i else RuntimeInconsistency()
                    for j in range(len(self.writes))
                ]
        if c.zk.fail_writes:
            c._injected_failure(self._apply)
        return self._apply()

    def _apply(self) -> list[Any]:
        c = self.client
        c.zk.trace("zk", f"{c.name}: a transaction of {len(self.writes)} writes")
        return [
            c.zk.create(path, value) or path if version is None else c.zk.set(path, value, version)
            for path, value, version in self.writes
        ]


class FakeAsyncResult:
    """kazoo's ``IAsyncResult``, already settled: ``get`` returns the value or raises."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class PartitionZk(FakeZkClient):
    """A session on a :class:`FakeZk` holding one partition's state znode (and
    ``/servers/<id>`` of the ``live`` servers): what a replicated partition run without
    servers reads and writes. ``state`` is the znode now."""

    def __init__(self, zk: FakeZk, path: str) -> None:
        super().__init__(zk, "test")
        self.path = path

    @property
    def state(self) -> PartitionState:
        return PartitionState.from_bytes(self.zk.nodes[self.path].data)

    @property
    def sets(self) -> int:
        return self.zk.sets


def partition_zk(
    ps: PartitionState,
    *,
    topic: str = "t",
    partition: int = 0,
    live: list[int] | None = None,
    fail_sets: int = 0,
    land_failed: bool = False,
) -> PartitionZk:
    """A :class:`PartitionZk` whose partition ``topic``/``partition`` holds ``ps``; the next
    ``fail_sets`` writes raise ConnectionLoss (applied anyway when ``land_failed``)."""
    zk = FakeZk()
    path = partition_path(topic, partition)
    zk.create(path, ps.to_bytes(), makepath=True)
    for sid in live or []:
        zk.create(server_path(sid), b"", makepath=True)
    zk.fail_writes, zk.land_failed = fail_sets, land_failed
    c = PartitionZk(zk, path)
    zk.clients.append(c)
    return c


def _children(tree: dict[str, _Znode], path: str) -> list[str]:
    pre = path.rstrip("/") + "/"
    return sorted(p[len(pre) :] for p in tree if p.startswith(pre) and "/" not in p[len(pre) :])


def node_name() -> str:
    n = NODE.get()
    return n.name if n is not None else "world"
