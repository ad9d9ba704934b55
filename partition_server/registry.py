"""This server's view of ZooKeeper: its ephemeral ``/servers/<id>`` znode, and the topics,
partition states and live servers it needs to know which partitions it hosts, which it
leads, and where to send a client that asked the wrong server.

kazoo runs its own threads; watch callbacks only schedule a refresh on the event loop, and
a refresh reads everything in an executor (coalesced: one read answers every refresh asked
for before it started), re-arming the one-shot watches as it goes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from partition_server.leadership import ZkLease
from pidlease.errors import describe
from pidlease.wire.cluster import (
    SERVERS,
    TOPICS,
    PartitionState,
    ServerInfo,
    TopicSpec,
    connect_zk,
    partition_path,
    server_path,
    topic_path,
)

log = logging.getLogger("partition_server.registry")

READ_RETRY_S = 1.0  # after a failed read of the cluster state
READ_WINDOW = 32  # partition state reads in flight at once (``_get_many``)


def monotonic_ms() -> float:
    return time.monotonic() * 1000


@dataclass
class Assignment:
    topics: dict[str, TopicSpec] = field(default_factory=dict)
    partitions: dict[tuple[str, int], PartitionState] = field(default_factory=dict)
    servers: dict[int, ServerInfo] = field(default_factory=dict)
    # Every topic name listed in ZooKeeper, readable or not (a topic being created has an
    # empty spec): a topic not in it was deleted. None when not a full read of ZooKeeper.
    listed: set[str] | None = None
    # The partitions a partial read (``Registry._read_changed``) read again; the rest are
    # the previous assignment's, unchanged. None: anything may have changed (a full read).
    changed: frozenset[tuple[str, int]] | None = None
    # Each partition state's znode version, from the same read as its state: a leadership
    # write can be planned against it without reading the znode again (its compare-and-set
    # fails when the znode moved since; ``leadership.read_and_plan``'s ``known``).
    versions: dict[tuple[str, int], int] = field(default_factory=dict)

    def known(self, key: tuple[str, int]) -> tuple[PartitionState, int] | None:
        """The state of ``key`` as read and the version it was read at, when both are."""
        ps, version = self.partitions.get(key), self.versions.get(key)
        return None if ps is None or version is None else (ps, version)


class Registry:
    def __init__(self, hosts: str, server_id: int, *, timeout_s: float = 10.0) -> None:
        self.hosts = hosts
        self.server_id = server_id
        self.timeout_s = timeout_s
        self.zk: Any = None
        self.info: ServerInfo | None = None
        self.assignment = Assignment()
        self.on_change: Any = None  # callable(Assignment), set by the log manager
        self._loop: asyncio.AbstractEventLoop | None = None
        self._want = False
        self._waiters: list[asyncio.Future[Assignment]] = []
        self._task: asyncio.Task[None] | None = None
        self._session_lost = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None  # a re-read after a failed one
        # Partitions whose state znode changed since the last read (``_watch``): read alone
        # when no full read is wanted (``_read_changed``); counted for METADATA and tests.
        self._dirty: set[tuple[str, int]] = set()
        self._servers_dirty = False  # /servers changed since the last read (``_watch``)
        self.partial_reads = 0
        # The leader's lease on its session (``ZkLease``; docs/replication.md, Step-down).
        # None until connect(): a registry that never talks to ZooKeeper (unit tests
        # driving roles by hand) enforces nothing.
        self.lease: ZkLease | None = None
        self.step_down_margin_ms = 0.0
        self.heartbeat_ms = 0.0
        self.on_lease: Any = None  # callable(), on the loop: the lease began or was lost
        self._lease_lock = threading.Lock()
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        # The simulation (tests/sim) has no threads: it heartbeats from the event loop,
        # each sync() and exists() through run_in_executor, and sets its own lease at boot.
        self.heartbeat_on_loop = False
        self._hb_task: asyncio.Task[None] | None = None
        # (session, send time) of the last heartbeat the quorum confirmed: the next one
        # confirmed in the same session extends the lease from it (``_heartbeat_answered``).
        self._hb_prev: tuple[int, float] | None = None
        # A standalone ZooKeeper is its own session tracker: it touches the session when a
        # heartbeat arrives, so an answer proves the session alive from that heartbeat's
        # send time on (``_standalone_zk``); an ensemble member proves it only from the
        # previous one's.
        self.standalone_zk = False

    def configure_lease(self, *, margin_ms: float, heartbeat_ms: float) -> None:
        """Before connect(): step down ``margin_ms`` before the session could have expired,
        confirming the session every ``heartbeat_ms``."""
        self.step_down_margin_ms = margin_ms
        self.heartbeat_ms = heartbeat_ms

    # -- lifecycle -------------------------------------------------------------------------
    def connect(self) -> None:
        """Blocking: connect (startup runs it before serving)."""
        from kazoo.client import KazooClient

        # connect_zk creates the chroot and the roots; our own client is built here so the
        # session timeout the server grants can be seen (the lease depends on it).
        boot = connect_zk(self.hosts, timeout_s=self.timeout_s)
        boot.stop()
        boot.close()  # stop() alone leaves kazoo's wake-up socket pair open
        requested_ms = self.timeout_s * 1000
        margin = self.step_down_margin_ms or requested_ms / 5
        self.lease = ZkLease(requested_ms, min(margin, requested_ms / 2))
        zk = KazooClient(hosts=self.hosts, timeout=self.timeout_s)
        self._watch_negotiation(zk)
        zk.start(timeout=self.timeout_s)
        self.zk = zk
        self.standalone_zk = _standalone_zk(zk)
        self.zk.add_listener(self._on_state)

    def _watch_negotiation(self, zk: Any) -> None:
        """kazoo keeps the negotiated session timeout to itself: its connection's
        ``_connect`` returns the read timeout it derives from it (2/3 of it, in ms). The
        server may grant less than asked (its maxSessionTimeout) and the lease must not
        outlast the real session, or more (minSessionTimeout, 2 ticks by default): then the
        failover is that much slower, which the log says."""
        conn = zk._connection  # noqa: SLF001 - kazoo exposes no negotiated timeout
        original = conn._connect  # noqa: SLF001
        requested_ms = self.timeout_s * 1000

        def connect(*args: Any) -> Any:
            read_timeout_ms, connect_timeout_ms = original(*args)
            granted_ms = read_timeout_ms * 3 / 2
            with self._lease_lock:
                assert self.lease is not None
                if abs(granted_ms - self.lease.session_timeout_ms) > 1:
                    self.lease.set_session_timeout(granted_ms)
                    if abs(granted_ms - requested_ms) > 1:
                        log.warning(
                            "ZooKeeper granted a session timeout of %.0f ms (asked %.0f ms: "
                            "see its tickTime and min/maxSessionTimeout); leaders step down "
                            "%.0f ms after their last confirmed contact",
                            granted_ms,
                            requested_ms,
                            granted_ms - self.lease.margin_ms,
                        )
            return read_timeout_ms, connect_timeout_ms

        conn._connect = connect  # noqa: SLF001

    def read_now(self) -> Assignment:
        """Blocking read of everything (at startup, before the loop serves)."""
        self.assignment = self._read_all()
        return self.assignment

    async def register(self, host: str, port: int, kafka_port: int = 0) -> None:
        """Create ``/servers/<id>`` with the address clients use: the server passes its
        advertised host and port (``advertised_host``/``advertised_port``, default where it
        listens), and its Kafka listener's port (0: none)."""
        self._loop = asyncio.get_running_loop()
        self.info = ServerInfo(
            self.server_id, host, port, started_ms=int(time.time() * 1000), kafka_port=kafka_port
        )
        await self._loop.run_in_executor(None, self._create_znode)
        log.info("registered %s as %s", server_path(self.server_id), self.info.address)
        if self.lease is not None and self.heartbeat_on_loop:
            if self._hb_task is None or self._hb_task.done():
                self._hb_task = self._loop.create_task(self._heartbeat_on_loop())
        elif self.lease is not None and self._hb_thread is None:
            self._hb_thread = threading.Thread(
                target=self._heartbeat_loop, name="zk-lease", daemon=True
            )
            self._hb_thread.start()

    def _create_znode(self) -> None:
        assert self.info is not None
        path, data = server_path(self.server_id), self.info.to_bytes()
        for _ in range(10):
            try:
                self.zk.create(path, data, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                try:
                    _, stat = self.zk.get(path)
                    if stat.ephemeralOwner == self.zk.client_id[0]:
                        self.zk.set(path, data)
                        return
                    # Left by a previous run of this id that was killed before its session
                    # expired: it is us, replace it rather than wait out the session.
                    log.warning(
                        "replacing stale %s (owner session 0x%x)", path, stat.ephemeralOwner
                    )
                    self.zk.delete(path, version=stat.version)
                except NoNodeError:
                    pass
        raise RuntimeError(f"could not create {path}")

    def close(self) -> None:
        self._closed = True
        self._hb_stop.set()
        if self._hb_task is not None:
            self._hb_task.cancel()
        if self.zk is not None:
            try:
                if self.zk.connected:
                    self.zk.delete(server_path(self.server_id))
            except Exception as exc:  # noqa: BLE001 - best effort; the session end removes it too
                log.info("could not delete our znode at shutdown: %s", describe(exc))
            self.zk.stop()
            self.zk.close()
            self.zk = None

    def _on_state(self, state: str) -> None:
        # kazoo thread: no blocking calls here.
        if state == KazooState.LOST and self._closed:
            # Our own close() ended the session (a clean stop): nothing was lost.
            log.info("ZooKeeper session closed")
        elif state == KazooState.LOST:
            self._session_lost = True
            log.warning("ZooKeeper session lost; will re-register when reconnected")
            self._lease_lost()
        elif state == KazooState.CONNECTED and self._session_lost and not self._closed:
            self._session_lost = False
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._reregister)

    def _reregister(self) -> None:
        assert self._loop is not None
        fut = self._loop.run_in_executor(None, self._create_znode)

        def done(f: asyncio.Future[None]) -> None:
            exc = f.exception()
            if exc is not None:
                # Retried until it lands: a server whose znode is gone is never elected nor
                # followed (seed 1205: one failed write left its producers stuck for good).
                log.error("re-registration failed: %s; retrying in 1 s", describe(exc))
                if not self._closed and self._loop is not None:
                    self._loop.call_later(1.0, self._reregister)

        fut.add_done_callback(done)
        self.refresh()

    # -- the lease on our session -----------------------------------------------------------
    def lease_session(self, now_ms: float) -> int | None:
        """The session our lease is valid in now, or None (or 0 when nothing is enforced)."""
        if self.lease is None:
            return 0
        with self._lease_lock:
            return self.lease.session if self.lease.valid(now_ms) else None

    def lease_held(self, session: int | None, now_ms: float) -> bool:
        """Still sure of the session a leadership was taken in (always, when not enforced)."""
        if self.lease is None:
            return True
        with self._lease_lock:
            return self.lease.held_by(session, now_ms)

    def lease_remaining_ms(self, now_ms: float) -> float:
        if self.lease is None:
            return float("inf")
        with self._lease_lock:
            return self.lease.remaining_ms(now_ms)

    def _lease_lost(self) -> None:
        # kazoo thread.
        if self.lease is None:
            return
        with self._lease_lock:
            self.lease.lost()
        self._notify_lease()

    def _notify_lease(self) -> None:
        if self._loop is not None and not self._closed and self.on_lease is not None:
            self._loop.call_soon_threadsafe(self.on_lease)

    def _heartbeat_loop(self) -> None:
        """Confirm the session every ``heartbeat_ms``: a ``sync`` then an ``exists`` of our
        own znode, timed from before they are sent. ``exists`` alone is answered by
        whichever ZooKeeper server we are connected to from its own copy, also by a
        follower cut off from the quorum (for up to syncLimit x tickTime); ``sync`` goes
        through the quorum's leader, so a cut-off server cannot answer it, and ZooKeeper
        answers one session's requests in order, so the ``exists`` answer comes after it.
        One outstanding at a time; a request queued while kazoo reconnects is answered
        late, with its old send time, so it extends nothing it should not."""
        interval_s = (self.heartbeat_ms or self.timeout_s * 1000 / 6) / 1000
        pending: Any = None
        while not self._hb_stop.is_set():
            try:
                pending = self._heartbeat_once(pending, interval_s)
            except Exception as exc:  # noqa: BLE001 - the lease simply runs out
                log.info("ZooKeeper heartbeat failed: %s", describe(exc))
                pending = None
            self._hb_stop.wait(interval_s)

    async def _heartbeat_on_loop(self) -> None:
        interval_s = (self.heartbeat_ms or self.timeout_s * 1000 / 6) / 1000
        loop = asyncio.get_running_loop()
        path = server_path(self.server_id)
        while not self._closed:
            zk = self.zk
            cid = zk.client_id if zk is not None else None
            if zk is not None and zk.connected and cid and self.lease is not None:
                session = int(cid[0])
                sent_ms = monotonic_ms()
                try:
                    await loop.run_in_executor(None, zk.sync, path)
                    stat = await loop.run_in_executor(None, zk.exists, path)
                except Exception as exc:  # noqa: BLE001 - the lease simply runs out
                    log.info("ZooKeeper heartbeat failed: %s", describe(exc))
                else:
                    self._heartbeat_answered(session, sent_ms, stat)
            await asyncio.sleep(interval_s)

    def _heartbeat_answered(self, session: int, sent_ms: float, stat: Any) -> None:
        zk = self.zk
        cid = zk.client_id if zk is not None else None
        if self.lease is None or stat is None or not cid:
            return
        if int(cid[0]) != session or stat.ephemeralOwner != session:
            return  # not (or no longer) registered in this session
        # The quorum's leader keeps the session alive on what the server we talk to
        # reports of it in its ping replies (every tickTime / 2), so this answer proves
        # the session alive at the quorum from the *previous* confirmed heartbeat's send
        # time on, not this one's (docs/replication.md, Step-down); the first heartbeat
        # of a session only sets that anchor.
        prev, self._hb_prev = self._hb_prev, (session, sent_ms)
        if self.standalone_zk:
            prev = (session, sent_ms)
        if prev is None or prev[0] != session:
            return
        with self._lease_lock:
            was_valid = self.lease.valid(monotonic_ms())
            began = self.lease.confirm(session, prev[1])
        if began or not was_valid:
            self._notify_lease()  # leaderships may be taken (again) now

    def _heartbeat_once(self, pending: Any, interval_s: float) -> Any:
        zk = self.zk
        if zk is None or self.lease is None:
            return None
        if pending is not None and not pending.ready():
            return pending  # still waiting for the previous answer
        cid = zk.client_id
        if not zk.connected or not cid:
            return None
        session = int(cid[0])
        sent_ms = monotonic_ms()
        path = server_path(self.server_id)
        synced = zk.sync_async(path)
        result = zk.exists_async(path)
        # Both answers are waited for: kazoo may set the sync's result after the exists'
        # (seen: one heartbeat in two found the sync not ready yet, so a leader on a busy
        # cluster confirmed nothing for a lease's length and stepped down).
        for answer in (result, synced):
            if not answer.wait(interval_s * 4):
                return answer
        if not result.successful() or not synced.successful():
            return None
        self._heartbeat_answered(session, sent_ms, result.value)
        return None

    # -- reading the cluster state ---------------------------------------------------------
    def _watch(self, event: object) -> None:
        if self._loop is None or self._closed:
            return
        key = _changed_partition(event)
        if key is not None:
            # One partition's state changed (an election, an in-sync change): read that
            # one again, not the whole cluster. The changes that come together (a dead
            # server's partitions moved in a few transactions) are read together.
            self._loop.call_soon_threadsafe(self._changed, key)
        elif _servers_changed(event):
            # A server came or went: read the servers again, not every partition state
            # (a dead server's elections waited for a read of all of them, 1000-10,000
            # reads on each survivor, on the session the lease's heartbeat shares).
            self._loop.call_soon_threadsafe(self._servers_changed)
        else:
            self._loop.call_soon_threadsafe(self.refresh)

    def _servers_changed(self) -> None:
        self._servers_dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def _changed(self, key: tuple[str, int]) -> None:
        self._dirty.add(key)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def reread(self, key: tuple[str, int], *, servers: bool) -> None:
        """A follower's trouble with the leader of ``key`` (a refused connection, a
        NOT_LEADER answer): read that partition's state again, and the live servers when
        ``servers``, not the whole cluster. Watches already bring every change of either;
        this is the fallback that does not depend on them. The whole cluster read for each
        failed fetch was 1000-10,000 partition reads and applies, repeated at every backoff
        of the fetchers of a dead leader until its session ended, on the ZooKeeper session
        the lease's heartbeat shares (and a survivor saw the leader go 0.6 s late, behind
        them)."""
        self._dirty.add(key)
        self._servers_dirty = self._servers_dirty or servers
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def refresh(self) -> asyncio.Future[Assignment]:
        """Re-read ZooKeeper; the future resolves with an Assignment read after this call."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut: asyncio.Future[Assignment] = loop.create_future()
        self._waiters.append(fut)
        self._want = True
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        return fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while (self._want or self._dirty or self._servers_dirty) and not self._closed:
            if not self._want:
                if self._servers_dirty:
                    await self._read_servers(loop)
                else:
                    await self._read_changed(loop)
                continue
            self._want = False
            self._dirty.clear()  # the full read covers them
            self._servers_dirty = False
            waiters, self._waiters = self._waiters, []
            try:
                a = await loop.run_in_executor(None, self._read_all)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper down: keep the old view
                log.warning(
                    "reading ZooKeeper failed (%s); keeping the last view, reading again in %.1f s",
                    describe(exc),
                    READ_RETRY_S,
                )
                a = self.assignment
                # A failed read may have left the one-shot watches unarmed: nothing would
                # tell us of a topic created meanwhile (followers get no request that
                # would make them look). Read again later; one retry pending at most.
                if self._retry is None:
                    self._retry = loop.call_later(READ_RETRY_S, self._read_again)
            else:
                self.assignment = a
                if self.on_change is not None:
                    try:
                        self.on_change(a)
                    except Exception:
                        # Raising here would leave the waiters below unanswered and the
                        # refreshes asked for meanwhile unread.
                        log.exception("applying the assignment read from ZooKeeper failed")
            for w in waiters:
                if not w.done():
                    w.set_result(a)

    async def _read_changed(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read again only the partitions whose state znode fired (re-arming their watches),
        into a copy of the last assignment (``listed`` None: not a full read, no topic is
        taken for deleted). A partition gone, or a failed read, asks for a full read."""
        keys = sorted(self._dirty)
        self._dirty.clear()
        versions: dict[tuple[str, int], int] = {}
        try:
            got = await loop.run_in_executor(None, self._read_partitions, keys, versions)
        except Exception as exc:  # noqa: BLE001 - ZooKeeper down: the full read retries
            log.warning("reading %d changed partition(s) failed (%s)", len(keys), describe(exc))
            self._want = True
            return
        if got is None:
            self._want = True
            return
        old = self.assignment
        a = Assignment(
            topics=old.topics,
            partitions={**old.partitions, **got},
            servers=old.servers,
            changed=frozenset(got),
            versions={**old.versions, **versions},
        )
        self.assignment = a
        self.partial_reads += 1
        if self.on_change is not None:
            try:
                self.on_change(a)
            except Exception:
                log.exception("applying the partition states read from ZooKeeper failed")

    async def _read_servers(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read again only the live servers (re-arming the children watch), into a copy of
        the last assignment (``changed`` None: every partition is applied again, any of
        them may have lost or found its leader). A failed read asks for a full read."""
        self._servers_dirty = False
        try:
            servers = await loop.run_in_executor(None, self._read_server_list, self._watch)
        except Exception as exc:  # noqa: BLE001 - ZooKeeper down: the full read retries
            log.warning("reading the servers failed (%s)", describe(exc))
            self._want = True
            return
        old = self.assignment
        a = Assignment(
            topics=old.topics, partitions=old.partitions, servers=servers, versions=old.versions
        )
        self.assignment = a
        self.partial_reads += 1
        if self.on_change is not None:
            try:
                self.on_change(a)
            except Exception:
                log.exception("applying the servers read from ZooKeeper failed")

    def _read_server_list(self, watch: Any) -> dict[int, ServerInfo]:
        zk = self.zk
        out: dict[int, ServerInfo] = {}
        for sid in zk.get_children(SERVERS, watch=watch):
            try:
                raw, _ = zk.get(server_path(int(sid)))
                out[int(sid)] = ServerInfo.from_bytes(raw)
            except (NoNodeError, ValueError, TypeError):
                continue
        return out

    def _read_partitions(
        self, keys: list[tuple[str, int]], versions: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], PartitionState] | None:
        reads = self._get_many([partition_path(t, p) for t, p in keys], self._watch)
        out: dict[tuple[str, int], PartitionState] = {}
        for key, read in zip(keys, reads, strict=True):
            try:
                raw, stat = read()
                out[key] = PartitionState.from_bytes(raw)
                _keep_version(versions, key, stat)
            except NoNodeError:
                return None  # its topic is being deleted: read everything
            except (ValueError, TypeError) as exc:
                log.warning("partition %s/%d has an unreadable state: %s", *key, describe(exc))
        return out

    def _read_again(self) -> None:
        self._retry = None
        if not self._closed:
            self.refresh()

    def _read_all(self) -> Assignment:
        zk, w = self.zk, self._watch
        listed: set[str] = set()
        a = Assignment(listed=listed)
        for name in zk.get_children(TOPICS, watch=w):
            listed.add(name)
            try:
                raw, _ = zk.get(topic_path(name), watch=w)
                spec = TopicSpec.from_bytes(raw)
            except NoNodeError:
                continue
            except (ValueError, TypeError) as exc:
                log.warning("topic %s has an unreadable spec: %s", name, describe(exc))
                continue
            a.topics[name] = spec
            plist = _children_or_watch_creation(zk, topic_path(name) + "/partitions", w)
            reads = self._get_many([partition_path(name, int(p)) for p in plist if p.isdigit()], w)
            for p, read in zip([p for p in plist if p.isdigit()], reads, strict=True):
                try:
                    raw, stat = read()
                    a.partitions[(name, int(p))] = PartitionState.from_bytes(raw)
                    _keep_version(a.versions, (name, int(p)), stat)
                except NoNodeError:
                    continue
                except (ValueError, TypeError) as exc:
                    log.warning(
                        "partition %s/%s has an unreadable state: %s", name, p, describe(exc)
                    )
        a.servers = self._read_server_list(w)
        return a

    def _get_many(self, paths: list[str], watch: Any) -> list[Any]:
        """One read per path, sent READ_WINDOW at a time when the client can (kazoo's
        ``get_async``: a few round trips for a topic's partitions, not one each; issue 24),
        each returned as a call that gives ``get``'s result or raises its error. Windowed:
        ZooKeeper answers a session's requests in order, and the lease's heartbeat
        (``_heartbeat_once``) shares the session; a thousand reads sent at once put it
        behind all of them, seconds on a loaded machine, and ended leases."""
        zk = self.zk
        get_async = getattr(zk, "get_async", None)
        if get_async is None:  # (the simulation's ZooKeeper: one at a time)
            return [lambda path=path: zk.get(path, watch=watch) for path in paths]
        out: list[Any] = []
        for i in range(0, len(paths), READ_WINDOW):
            pending = [get_async(path, watch=watch) for path in paths[i : i + READ_WINDOW]]
            for r in pending:
                r.wait(self.timeout_s)
            out.extend(lambda r=r: r.get(timeout=self.timeout_s) for r in pending)
        return out


def _keep_version(versions: dict[tuple[str, int], int], key: tuple[str, int], stat: Any) -> None:
    version = getattr(stat, "version", None)  # (some test doubles answer no stat)
    if isinstance(version, int):
        versions[key] = version


def _changed_partition(event: object) -> tuple[str, int] | None:
    """The partition whose state znode a data watch says CHANGED, else None (a creation,
    a deletion, children, a topic's spec, the servers: a full read)."""
    if getattr(event, "type", None) != "CHANGED":
        return None
    parts = str(getattr(event, "path", "")).split("/")
    # /topics/<name>/partitions/<p>
    if len(parts) != 5 or "/" + parts[1] != TOPICS or parts[3] != "partitions":
        return None
    if not parts[4].isdigit() or not parts[2]:
        return None
    return parts[2], int(parts[4])


def _servers_changed(event: object) -> bool:
    """A children watch of ``/servers`` fired: a server registered or its session ended."""
    return getattr(event, "type", None) == "CHILD" and getattr(event, "path", None) == SERVERS


def _children_or_watch_creation(zk: Any, path: str, watch: Any) -> list[str]:
    """Children of ``path`` with a child watch, or [] with a watch on its creation. The
    node may be created between the two calls (a topic written node by node, not in one
    transaction): ``exists`` then finds it, sets only a data watch, and no event would
    ever say its children came, so read them again."""
    for _ in range(3):
        try:
            return list(zk.get_children(path, watch=watch))
        except NoNodeError:
            if zk.exists(path, watch=watch) is None:
                return []  # its creation fires the watch
    return []  # created and deleted three times over: the data watch fires on the next


def _standalone_zk(zk: Any) -> bool:
    """Whether the ZooKeeper we talk to is one standalone server: its ``/zookeeper/config``
    is empty (an ensemble's lists its members). Anything else, or a failed read, counts as
    an ensemble (the cautious lease)."""
    try:
        data, _ = zk.get("/zookeeper/config")
    except Exception:  # noqa: BLE001 - an unknown answer means the cautious lease
        return False
    return bool(data == b"")
