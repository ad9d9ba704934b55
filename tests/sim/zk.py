"""A fake ZooKeeper with the kazoo client surface the partition server uses (registry.py,
leadership.py): znodes with versions, ephemeral znodes owned by sessions, one-shot data
and child watches delivered later on the watching node, failed writes (ConnectionLoss,
as when the ensemble is unreachable) and session expiry (ephemerals deleted, LOST then
CONNECTED to the listener)."""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (  # type: ignore[import-untyped]
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import KazooState, WatchedEvent  # type: ignore[import-untyped]

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


class FakeZk:
    def __init__(self, rng: random.Random, trace: Callable[[str, str], None]) -> None:
        self.rng = rng
        self.trace = trace
        self.nodes: dict[str, _Znode] = {"/": _Znode(b"", 0, 0)}
        self._data_watches: dict[str, list[tuple[FakeZkClient, Callable[..., Any]]]] = {}
        self._child_watches: dict[str, list[tuple[FakeZkClient, Callable[..., Any]]]] = {}
        self.write_fail_p = 0.0
        self.read_fail_p = 0.0
        self._sessions = 0
        self.ops = 0

    def new_session(self) -> int:
        self._sessions += 1
        return 0x5000 + self._sessions

    # -- the tree --------------------------------------------------------------------------
    @staticmethod
    def _parent(path: str) -> str:
        return path.rsplit("/", 1)[0] or "/"

    def children(self, path: str) -> list[str]:
        pre = path.rstrip("/") + "/"
        return sorted(
            p[len(pre) :] for p in self.nodes if p.startswith(pre) and "/" not in p[len(pre) :]
        )

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

    # -- session -----------------------------------------------------------------------------
    def add_listener(self, fn: Callable[[str], Any]) -> None:
        self.listeners.append(fn)

    def deliver(self, cb: Callable[..., Any], event: Any) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(self.zk.rng.random() * 0.003, cb, event, context=self.ctx)

    def expire_session(self) -> None:
        """Session expiry: ephemerals go, the client sees LOST, then reconnects (new id)."""
        old = self.session
        self.zk.expire(old)
        self.session = self.zk.new_session()
        self.client_id = (self.session, b"")
        loop = asyncio.get_running_loop()
        for fn in list(self.listeners):
            self.ctx.run(fn, KazooState.LOST)
            loop.call_later(
                0.005 + self.zk.rng.random() * 0.02, fn, KazooState.CONNECTED, context=self.ctx
            )

    def _maybe_fail(self, write: bool) -> None:
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
        z = self.zk.nodes.get(path)
        if z is None:
            raise NoNodeError
        if watch is not None:
            self.zk._data_watches.setdefault(path, []).append((self, watch))
        return z.data, Stat(z.version, z.owner)

    def exists(self, path: str, watch: Callable[..., Any] | None = None) -> Stat | None:
        self.zk.ops += 1
        self._maybe_fail(False)
        if watch is not None:
            self.zk._data_watches.setdefault(path, []).append((self, watch))
        z = self.zk.nodes.get(path)
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
        if path not in self.zk.nodes:
            raise NoNodeError
        if watch is not None:
            self.zk._child_watches.setdefault(path, []).append((self, watch))
        return self.zk.children(path)

    def create(
        self, path: str, data: bytes = b"", ephemeral: bool = False, makepath: bool = False
    ) -> str:
        self.zk.ops += 1
        self._maybe_fail(True)
        self.zk.create(path, data, self.session if ephemeral else 0, makepath)
        return path

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        self.zk.ops += 1
        self._maybe_fail(True)
        return self.zk.set(path, data, version)

    def delete(self, path: str, version: int = -1) -> None:
        self.zk.ops += 1
        self._maybe_fail(True)
        self.zk.delete(path, version)

    def stop(self) -> None:
        self.connected = False

    def close(self) -> None:
        pass


def node_name() -> str:
    n = NODE.get()
    return n.name if n is not None else "world"
