"""The coordinator's ZooKeeper records: PID counter, PID records, name bindings, topics,
servers and its own registration, through one kazoo client.

Every call goes through ``_wait`` with ``zk_request_timeout_ms``: a request never blocks
forever, and kazoo's errors are translated here, at the boundary, into
``CoordinatorUnavailable`` (retriable 503) or into the plain results the callers expect
(``None`` for a missing node, ``False`` for a lost compare-and-set). While ZooKeeper is
unreachable calls fail at once instead of queueing; kazoo keeps reconnecting forever
(``connection_retry max_tries=-1``), so leasing resumes by itself when it is back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import quote

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError

from coordinator.leases import owner_of, record_from_bytes
from coordinator.zk_batch import WriteBatcher
from pidlease.errors import CoordinatorUnavailable, InvalidRequest, TopicExists, describe
from pidlease.wire import cluster
from pidlease.wire.cluster import PartitionState, PidRecord, ServerInfo, TopicSpec

log = logging.getLogger("coordinator.store")

# ZooKeeper refuses (and drops the connection on) a request over jute.maxbuffer, 1 MB by
# default; transactions are kept to half of it and single records below it.
TX_BYTES_BUDGET = 512 * 1024
ZNODE_BYTES_MAX = 1_000_000
_OP_OVERHEAD_BYTES = 64
TOPIC_CREATE_STALE_MS = 60_000

# Per-principal count of the PID records it owns (ASCII int), kept while a PID limit is
# set: changed only in the same transaction as the PID record it counts.
PRINCIPALS = "/principals"
COUNTER_CAS_ATTEMPTS = 50


def principal_path(name: str) -> str:
    return f"{PRINCIPALS}/{quote(name, safe='')}"


def _checked(data: bytes, what: str) -> bytes:
    if len(data) > ZNODE_BYTES_MAX:
        raise InvalidRequest(
            f"{what} would be {len(data)} bytes, over ZooKeeper's limit; "
            "lease a new PID for further partitions"
        )
    return data


def _creates(ops: list[tuple[str, bytes]]) -> Callable[[Any], None]:
    def build(tx: Any) -> None:
        for path, data in ops:
            tx.create(path, data)

    return build


def _deletes(ops: list[tuple[str, bytes]]) -> Callable[[Any], None]:
    def build(tx: Any) -> None:
        for path, _ in ops:
            tx.delete(path)

    return build


class Store:
    def __init__(
        self, hosts: str, *, request_timeout_ms: int = 5_000, session_timeout_ms: int = 10_000
    ) -> None:
        self.hosts = hosts
        self._timeout_s = request_timeout_ms / 1000
        self._session_timeout_s = session_timeout_ms / 1000
        self.zk = KazooClient(
            hosts=hosts,
            timeout=self._session_timeout_s,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
        )
        self._stopping = False
        self.zk.add_listener(self._on_state)
        self.state_changed = threading.Event()
        self.layout_ready = False
        self.session_losses = 0
        # Counted for /metrics and the benchmark's "ZooKeeper writes per lease".
        self._count_lock = threading.Lock()
        self.write_requests = 0
        self.read_requests = 0
        # New PID records and their compare-and-sets go out group-committed (zk_batch.py).
        self.writes = WriteBatcher(self.zk, lambda ar: self._wait(ar, write=True))
        # Partition states read for topic descriptions, each kept until its znode's data
        # watch fires (``get_partition_states(watched=True)``, issue 24): a producer's
        # leader lookup of a 1000-partition topic was 1000 ZooKeeper reads every time,
        # 0.3-1.6 s on a loaded machine, in every failover's path.
        self._states_lock = threading.Lock()
        self._states: dict[str, PartitionState] = {}
        self._fired: dict[str, int] = {}  # per path, watch events seen (a read's guard)
        self._states_epoch = 0  # raised when the session's watches may be gone

    # -- connection ------------------------------------------------------------------------
    def start(self) -> None:
        """Start connecting without waiting: the HTTP service comes up and answers 503
        until ZooKeeper is reachable."""
        self.zk.start_async()

    def stop(self) -> None:
        self._stopping = True  # the session our own stop ends is no loss
        self.writes.stop()
        try:
            self.zk.stop()
        finally:
            self.zk.close()

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: no blocking ZooKeeper calls here, only wake the housekeeper.
        if state == KazooState.LOST and not self._stopping:
            self.session_losses += 1
        if state != KazooState.CONNECTED:
            # Watches die with the session (LOST); while disconnected, a change is told on
            # reconnecting, but nothing is kept across that gap: read everything again.
            with self._states_lock:
                self._states.clear()
                self._states_epoch += 1
        self.state_changed.set()

    @property
    def connected(self) -> bool:
        return bool(self.zk.connected)

    def ensure_layout(self) -> None:
        """Create the chroot and the layout's roots (idempotent). The chroot needs a client
        without it, since a chrooted client cannot see its own root's parent."""
        server_part, slash, chroot = self.hosts.partition("/")
        if slash and chroot:
            boot = KazooClient(hosts=server_part, timeout=self._session_timeout_s)
            try:
                boot.start(timeout=self._timeout_s)
                boot.ensure_path("/" + chroot)
            except (KazooTimeoutError, KazooException) as exc:
                raise CoordinatorUnavailable(
                    f"ZooKeeper at {server_part} unreachable: {exc}"
                ) from exc
            finally:
                boot.stop()
                boot.close()
        for root in (*cluster.ALL_ROOTS, PRINCIPALS):
            self._wait(self.zk.ensure_path_async(root), write=True)
        self.layout_ready = True

    # -- the one place kazoo results are awaited -------------------------------------------
    def _wait(self, async_result: Any, *, write: bool = False) -> Any:
        with self._count_lock:
            if write:
                self.write_requests += 1
            else:
                self.read_requests += 1
        try:
            return async_result.get(timeout=self._timeout_s)
        except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError):
            raise
        except KazooTimeoutError as exc:
            raise CoordinatorUnavailable(
                f"ZooKeeper did not answer within {self._timeout_s * 1000:.0f} ms"
            ) from exc
        except KazooException as exc:
            raise CoordinatorUnavailable(f"ZooKeeper unavailable: {type(exc).__name__}") from exc

    def _check(self) -> None:
        if not self.zk.connected:
            raise CoordinatorUnavailable("ZooKeeper is not connected; retry")
        if not self.layout_ready:
            raise CoordinatorUnavailable(
                "coordinator is still starting (ZooKeeper layout not ready)"
            )

    def _get(self, path: str) -> tuple[bytes, Any] | None:
        self._check()
        try:
            return self._wait(self.zk.get_async(path))  # type: ignore[no-any-return]
        except NoNodeError:
            return None

    def _get_many(self, paths: list[str]) -> list[tuple[bytes, Any] | None]:
        """Pipelined reads: all requests go out before the first answer is awaited."""
        self._check()
        pending = [self.zk.get_async(p) for p in paths]
        out: list[tuple[bytes, Any] | None] = []
        for ar in pending:
            try:
                out.append(self._wait(ar))
            except NoNodeError:
                out.append(None)
        return out

    def _children(self, path: str) -> list[str]:
        self._check()
        try:
            return list(self._wait(self.zk.get_children_async(path)))
        except NoNodeError:
            return []

    def _commit(self, build: Callable[[Any], None]) -> list[Any]:
        self._check()
        tx = self.zk.transaction()
        build(tx)
        return list(self._wait(tx.commit_async(), write=True))

    # -- PID counter (allocator.CounterStore) ----------------------------------------------
    def read_counter(self) -> tuple[int | None, int]:
        got = self._get(cluster.PID_BLOCK)
        if got is None:
            return None, -1
        raw, stat = got
        return int(raw), stat.version

    def create_counter(self, value: int) -> bool:
        self._check()
        try:
            self._wait(self.zk.create_async(cluster.PID_BLOCK, str(value).encode()), write=True)
        except NodeExistsError:
            return False
        return True

    def cas_counter(self, value: int, version: int) -> bool:
        self._check()
        try:
            self._wait(
                self.zk.set_async(cluster.PID_BLOCK, str(value).encode(), version), write=True
            )
        except (BadVersionError, NoNodeError):
            return False
        return True

    # -- PID records and names -------------------------------------------------------------
    def get_pid(self, pid: int) -> tuple[PidRecord, int] | None:
        got = self._get(cluster.pid_path(pid))
        if got is None:
            return None
        return record_from_bytes(got[0]), got[1].version

    def get_name(self, name: str) -> tuple[int, int] | None:
        """(pid, znode version) bound to ``name``."""
        got = self._get(cluster.name_path(name))
        if got is None:
            return None
        return int(got[0]), got[1].version

    def create_pid(self, record: PidRecord) -> None:
        self._check()
        data = _checked(record.to_bytes(), f"the record of pid {record.pid}")
        self._batched(cluster.pid_path(record.pid), data, None)

    def _batched(self, path: str, data: bytes, version: int | None) -> None:
        fut = self.writes.submit(path, data, version)
        try:
            fut.result(timeout=self._timeout_s * 2)
        except FutureTimeout as exc:
            raise CoordinatorUnavailable(
                f"ZooKeeper did not answer within {self._timeout_s * 2000:.0f} ms"
            ) from exc

    def create_named_pid(self, record: PidRecord, name: str, name_version: int | None) -> bool:
        """Write a new PID record and bind ``name`` to it in one transaction: create the
        binding (``name_version`` None) or move it from an expired PID (compare-and-set on
        the binding's version). False when another coordinator bound the name first."""
        data = _checked(record.to_bytes(), f"the record of pid {record.pid}")

        def build(tx: Any) -> None:
            tx.create(cluster.pid_path(record.pid), data)
            if name_version is None:
                tx.create(cluster.name_path(name), str(record.pid).encode())
            else:
                tx.set_data(cluster.name_path(name), str(record.pid).encode(), name_version)

        results = self._commit(build)
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return True
        if any(isinstance(r, (NodeExistsError, BadVersionError, NoNodeError)) for r in failures):
            return False
        raise CoordinatorUnavailable(f"ZooKeeper transaction failed: {failures!r}")

    # -- per-principal PID counts -----------------------------------------------------------
    def get_principal_count(self, principal: str) -> tuple[int, int] | None:
        """(PIDs counted for ``principal``, znode version), None when never counted."""
        got = self._get(principal_path(principal))
        if got is None:
            return None
        return int(got[0] or b"0"), got[1].version

    def count_owned_pids(self, principal: str) -> int:
        """Scan every PID record: how many ``principal`` owns (to start its count)."""
        ids = self.list_pid_ids()
        n = 0
        for start in range(0, len(ids), 1000):
            n += sum(
                1
                for rec, _ in self.get_pids(ids[start : start + 1000])
                if owner_of(rec) == principal
            )
        return n

    def create_pid_counted(
        self,
        record: PidRecord,
        name: str | None,
        name_version: int | None,
        principal: str,
        count: int,
        count_version: int | None,
    ) -> str:
        """Create a PID record (with its name binding when ``name``) and set the owner's
        count to ``count`` by compare-and-set on ``count_version`` (None: create the
        counter), all in one transaction. Returns ``ok``, ``name`` (the name was bound by
        someone else meanwhile) or ``counter`` (the count changed meanwhile: re-read)."""
        data = _checked(record.to_bytes(), f"the record of pid {record.pid}")
        cpath = principal_path(principal)

        def build(tx: Any) -> None:
            tx.create(cluster.pid_path(record.pid), data)
            if name is not None:
                if name_version is None:
                    tx.create(cluster.name_path(name), str(record.pid).encode())
                else:
                    tx.set_data(cluster.name_path(name), str(record.pid).encode(), name_version)
            if count_version is None:
                tx.create(cpath, str(count).encode())
            else:
                tx.set_data(cpath, str(count).encode(), count_version)

        results = self._commit(build)
        if not any(isinstance(r, Exception) for r in results):
            return "ok"
        conflict = (NodeExistsError, BadVersionError, NoNodeError)
        if name is not None and isinstance(results[1], conflict):
            return "name"
        if isinstance(results[-1], conflict):
            return "counter"
        raise CoordinatorUnavailable(f"ZooKeeper transaction failed: {results!r}")

    def cas_pid(self, record: PidRecord, version: int) -> bool:
        """Replace a PID record if nobody changed it since ``version`` was read."""
        self._check()
        try:
            data = _checked(record.to_bytes(), f"the record of pid {record.pid}")
            self._batched(cluster.pid_path(record.pid), data, version)
        except (BadVersionError, NoNodeError):
            return False
        return True

    def list_pid_ids(self) -> list[int]:
        return sorted(int(c) for c in self._children(cluster.PIDS) if c.isdigit())

    def get_pids(self, pids: list[int]) -> list[tuple[PidRecord, int]]:
        got = self._get_many([cluster.pid_path(p) for p in pids])
        return [(record_from_bytes(g[0]), g[1].version) for g in got if g is not None]

    def delete_pid(self, record: PidRecord, version: int) -> bool:
        """Delete an expired PID and, if its name still points at it, the name binding,
        atomically. False when the record changed meanwhile (a late renew won)."""
        name_version: int | None = None
        if record.producer_name is not None:
            bound = self.get_name(record.producer_name)
            if bound is not None and bound[0] == record.pid:
                name_version = bound[1]
        cpath = principal_path(owner_of(record))
        for _ in range(COUNTER_CAS_ATTEMPTS):
            # The owner's count (when one is kept) goes down in the same transaction.
            counted = self.get_principal_count(owner_of(record))

            def build(tx: Any, counted: tuple[int, int] | None = counted) -> None:
                tx.delete(cluster.pid_path(record.pid), version)
                if name_version is not None:
                    tx.delete(cluster.name_path(record.producer_name or ""), name_version)
                if counted is not None:
                    tx.set_data(cpath, str(max(0, counted[0] - 1)).encode(), counted[1])

            results = self._commit(build)
            if not any(isinstance(r, Exception) for r in results):
                return True
            if counted is None or not isinstance(results[-1], (BadVersionError, NoNodeError)):
                return False
            # only the count changed meanwhile: read it again
        return False

    # -- topics, partitions, servers -------------------------------------------------------
    def get_topic(self, name: str) -> TopicSpec | None:
        """None also while the topic is still being created (its spec is empty)."""
        got = self._get(cluster.topic_path(name))
        return None if got is None or not got[0] else TopicSpec.from_bytes(got[0])

    def get_topic_versioned(self, name: str) -> tuple[TopicSpec, int] | None:
        """The spec and its znode version (the compare-and-set token of ``cas_topic``)."""
        got = self._get(cluster.topic_path(name))
        if got is None or not got[0]:
            return None
        return TopicSpec.from_bytes(got[0]), got[1].version

    def cas_topic(self, spec: TopicSpec, version: int) -> bool:
        """Replace a topic's spec if nobody changed it since ``version`` was read."""
        self._check()
        data = _checked(spec.to_bytes(), f"the spec of topic {spec.name!r}")
        try:
            self._wait(self.zk.set_async(cluster.topic_path(spec.name), data, version), write=True)
        except (BadVersionError, NoNodeError):
            return False
        return True

    def list_topic_names(self) -> list[str]:
        """Every topic znode, including ones still being created (get_topic says None)."""
        return sorted(self._children(cluster.TOPICS))

    def create_topic(self, spec: TopicSpec, states: list[PartitionState]) -> None:
        """Create a topic whole or not at all, as readers see it. Raises TopicExists.

        Small topics are one transaction. A big one would be over ZooKeeper's 1 MB packet
        limit (which makes the server drop the connection), so it is written in chunks
        under a topic znode whose spec is still empty (readers skip an unreadable spec),
        and the spec is set last: until then the topic does not exist for anyone. A
        creation left half-done by a crash is removed by the next create of that name
        once it is older than ``TOPIC_CREATE_STALE_MS``."""
        tpath = cluster.topic_path(spec.name)
        ops = [(cluster.partition_path(spec.name, p), st.to_bytes()) for p, st in enumerate(states)]
        chunks = self._chunk_ops(ops)
        if len(chunks) == 1:

            def build(tx: Any) -> None:
                tx.create(tpath, spec.to_bytes())
                tx.create(f"{tpath}/partitions", b"")
                for path, data in chunks[0]:
                    tx.create(path, data)

            self._commit_topic(spec.name, build)
            return

        def build_marker(tx: Any) -> None:
            tx.create(tpath, b"")
            tx.create(f"{tpath}/partitions", b"")

        self._commit_topic(spec.name, build_marker)
        try:
            for chunk in chunks:
                results = self._commit(_creates(chunk))
                bad = [r for r in results if isinstance(r, Exception)]
                if bad:
                    raise CoordinatorUnavailable(
                        f"creating partitions of {spec.name!r} failed: {bad[:2]!r}"
                    )
            self._wait(self.zk.set_async(tpath, spec.to_bytes(), 0), write=True)
        except (CoordinatorUnavailable, BadVersionError, NoNodeError) as exc:
            log.warning(
                "creating topic %s failed midway (%s); removing what was written",
                spec.name,
                describe(exc),
            )
            self._delete_topic_tree(spec.name)
            if isinstance(exc, CoordinatorUnavailable):
                raise
            raise CoordinatorUnavailable(
                f"creating topic {spec.name!r} was interrupted; retry"
            ) from exc

    def _commit_topic(self, name: str, build: Callable[[Any], None]) -> None:
        for attempt in (0, 1):
            results = self._commit(build)
            failures = [r for r in results if isinstance(r, Exception)]
            if not failures:
                return
            if not isinstance(results[0], NodeExistsError):
                raise CoordinatorUnavailable(f"ZooKeeper transaction failed: {failures[:3]!r}")
            got = self._get(cluster.topic_path(name))
            stale = (
                got is not None
                and got[0] == b""
                and attempt == 0
                and time.time() * 1000 - got[1].mtime > TOPIC_CREATE_STALE_MS
            )
            if not stale:
                what = "is being created" if got is not None and got[0] == b"" else "already exists"
                raise TopicExists(f"topic {name!r} {what}")
            log.warning("removing topic %s left half-created by a crashed coordinator", name)
            self._delete_topic_tree(name)

    def _delete_topic_tree(self, name: str) -> None:
        tpath = cluster.topic_path(name)
        try:
            parts = self._children(f"{tpath}/partitions")
            paths = [f"{tpath}/partitions/{p}" for p in parts] + [f"{tpath}/partitions", tpath]
            for chunk in self._chunk_ops([(path, b"") for path in paths]):
                self._commit(_deletes(chunk))
        except (CoordinatorUnavailable, NoNodeError) as exc:
            log.warning("cleaning up topic %s failed: %s", name, describe(exc))

    def _chunk_ops(self, ops: list[tuple[str, bytes]]) -> list[list[tuple[str, bytes]]]:
        """Split writes so each transaction stays well under ZooKeeper's packet limit."""
        chroot_len = len(self.hosts.partition("/")[2]) + 1
        chunks: list[list[tuple[str, bytes]]] = [[]]
        size = 0
        for path, data in ops:
            op_bytes = chroot_len + len(path.encode()) + len(data) + _OP_OVERHEAD_BYTES
            if chunks[-1] and size + op_bytes > TX_BYTES_BUDGET:
                chunks.append([])
                size = 0
            chunks[-1].append((path, data))
            size += op_bytes
        return chunks

    def get_partition_states(
        self, topic: str, partitions: list[int], *, watched: bool = False
    ) -> list[PartitionState | None]:
        """The partitions' states (None: no such znode). ``watched``: from the states this
        store keeps, each until its znode changes (a data watch), reading only those it
        does not have; as fresh as any read, but for the watch's delivery (milliseconds):
        a change is applied to ZooKeeper, then its watch is sent, then a read sees it. For
        descriptions and producers' leader lookups; the lease's own checks read ZooKeeper."""
        paths = [cluster.partition_path(topic, p) for p in partitions]
        if not watched:
            got = self._get_many(paths)
            return [None if g is None else PartitionState.from_bytes(g[0]) for g in got]
        with self._states_lock:
            out: list[PartitionState | None] = [self._states.get(path) for path in paths]
            epoch = self._states_epoch
            fired = {
                path: self._fired.get(path, 0)
                for path, st in zip(paths, out, strict=True)
                if st is None
            }
        if not fired:
            return out
        self._check()
        pending = {path: self.zk.get_async(path, watch=self._state_watch) for path in fired}
        read: dict[str, PartitionState | None] = {}
        for path, ar in pending.items():
            try:
                read[path] = PartitionState.from_bytes(self._wait(ar)[0])
            except NoNodeError:
                read[path] = None
        with self._states_lock:
            for path, st in read.items():
                # Kept only when no watch event came for it since before the read (the read
                # may be older than the change the event told of) and no session change.
                unchanged = self._fired.get(path, 0) == fired[path]
                if st is not None and epoch == self._states_epoch and unchanged:
                    self._states[path] = st
        return [read.get(path, st) for path, st in zip(paths, out, strict=True)]

    def _state_watch(self, event: Any) -> None:
        # kazoo's thread: the znode changed (or was deleted): forget what was read of it.
        path = getattr(event, "path", None)
        if not isinstance(path, str):
            return
        with self._states_lock:
            self._states.pop(path, None)
            self._fired[path] = self._fired.get(path, 0) + 1

    def get_servers(self, ids: list[int]) -> dict[int, ServerInfo]:
        got = self._get_many([cluster.server_path(i) for i in ids])
        return {
            i: ServerInfo.from_bytes(g[0]) for i, g in zip(ids, got, strict=True) if g is not None
        }

    def live_servers(self) -> list[ServerInfo]:
        ids = sorted(int(c) for c in self._children(cluster.SERVERS) if c.lstrip("-").isdigit())
        servers = self.get_servers(ids)
        return [servers[i] for i in ids if i in servers]

    # -- this coordinator ------------------------------------------------------------------
    def register(self, coordinator_id: str, info: dict[str, Any]) -> bool:
        """Make sure /coordinators/<id> is an ephemeral of *this* session; True when it had
        to be (re)created. A node left by a killed predecessor with the same id is replaced
        rather than waited out."""
        self._check()
        path = f"{cluster.COORDINATORS}/{coordinator_id}"
        session_id = self.zk.client_id[0] if self.zk.client_id else None
        try:
            _, stat = self._wait(self.zk.get_async(path))
            if stat.ephemeralOwner == session_id:
                return False
            self._wait(self.zk.delete_async(path, stat.version), write=True)
        except (NoNodeError, BadVersionError):
            pass
        try:
            self._wait(
                self.zk.create_async(path, json.dumps(info).encode(), ephemeral=True), write=True
            )
        except NodeExistsError:
            return False
        return True

    def coordinators(self) -> list[str]:
        return sorted(self._children(cluster.COORDINATORS))
