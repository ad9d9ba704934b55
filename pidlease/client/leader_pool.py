"""Where each partition's leader is, and one pipelined connection per leader address.

Leaders come from the coordinator's ``GET /v1/topics/{name}?offsets=false`` (ZooKeeper's
view: no partition server is asked, so an unreachable one blocks no lookup); they are
looked up again when a sender reports a lost connection or NOT_LEADER (one lookup at a
time, at most one per ``refresh_min_ms``). Partitions led by the same server share its
connection; a dead connection is replaced by the next ``connection_for`` (one connect at a
time per address).

A leader can also vanish silently (isolated by the network: no reset, no answer). A watch
looks the leaders up whenever a connection has had requests waiting for
``SILENT_CHECK_MS`` without any answer, and aborts a connection to a server that no longer
leads any partition: its requests fail as a lost connection would, and the senders resend
them to the new leader at once instead of waiting out ``request_timeout_ms``. A silent
server that still leads is left alone (acks may legitimately wait, e.g. for the in-sync
minimum).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable

from pidlease import errors
from pidlease.client.connection import Connection
from pidlease.client.lease_client import AsyncLeaseClient, TopicInfo

log = logging.getLogger("pidlease.client.producer")

# A connection with requests waiting this long and no answer at all gets its leader looked
# up (every SILENT_CHECK_MS at most): about the time a failover takes with the servers'
# default ZooKeeper session (1.2 s), so a lookup rarely comes before the election.
SILENT_CHECK_MS = 1_000.0


class LeaderPool:
    def __init__(
        self,
        client: AsyncLeaseClient,
        topic: str,
        *,
        connect_timeout_ms: int,
        refresh_min_ms: float,
        clock_ms: Callable[[], float],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.client = client
        self.ssl_context = ssl_context  # TLS to the partition servers when set
        self.topic = topic
        self.connect_timeout_ms = connect_timeout_ms
        self.refresh_min_ms = refresh_min_ms
        self.clock_ms = clock_ms
        self.leaders: dict[int, str | None] = {}
        self.conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._refreshed_at = -1e18
        self._watch: asyncio.Task[None] | None = None
        self.moved_aborts = 0  # connections aborted because their server no longer leads

    def apply(self, info: TopicInfo) -> None:
        leaders = {p.partition: p.leader_address for p in info.partition_states}
        if leaders != self.leaders:
            log.debug("leaders of %s: %s", self.topic, leaders)  # the failover timeline
        self.leaders = leaders

    async def refresh(self) -> None:
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        if self.clock_ms() - self._refreshed_at < self.refresh_min_ms:
            return
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            self.apply(await self.client.topic(self.topic, offsets=False))
            self._refreshed_at = self.clock_ms()
            self._refreshing.set_result(None)
        except errors.PidleaseError as exc:
            self._refreshing.set_exception(exc)
            self._refreshing.exception()  # retrieved: waiters re-raise it themselves
            raise
        except BaseException as exc:
            # Not cancel(): the senders waiting on it would get CancelledError, which ends
            # their tasks silently (their records never resolve: flush() waits for ever).
            # They get a retriable error instead, and retry.
            self._refreshing.set_exception(
                errors.CoordinatorUnavailable(f"leader lookup of {self.topic} ended: {exc!r}")
            )
            self._refreshing.exception()
            raise
        finally:
            self._refreshing = None

    async def connection_for(self, partition: int) -> Connection:
        addr = self.leaders.get(partition)
        if not addr:
            raise errors.ServerUnavailable(f"no live leader known for partition {partition}")
        conn = self.conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(addr)
        if pending is not None:
            return await asyncio.shield(pending)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_silent())
        pending = asyncio.get_running_loop().create_future()
        self._connecting[addr] = pending
        try:
            conn = await Connection.open(
                addr, connect_timeout_ms=self.connect_timeout_ms, ssl_context=self.ssl_context
            )
            self.conns[addr] = conn
            pending.set_result(conn)
            return conn
        except errors.PidleaseError as exc:
            pending.set_exception(exc)
            pending.exception()
            raise
        except BaseException as exc:  # not cancel(): see refresh
            pending.set_exception(errors.ServerUnavailable(f"connect to {addr} ended: {exc!r}"))
            pending.exception()
            raise
        finally:
            del self._connecting[addr]

    async def _watch_silent(self) -> None:
        while True:
            await asyncio.sleep(SILENT_CHECK_MS / 2000)
            silent = [c for c in self.conns.values() if c.silent_ms() >= SILENT_CHECK_MS]
            if not silent:
                continue
            with contextlib.suppress(errors.PidleaseError):  # the senders retry lookups too
                await self.refresh()
            self.abort_moved()
            await asyncio.sleep(SILENT_CHECK_MS / 1000)  # one lookup a second at most

    def abort_moved(self) -> int:
        """Abort every connection to a server that leads none of this topic's partitions
        now (after a lookup): requests waiting on it would only time out."""
        leading = set(self.leaders.values())
        n = 0
        for addr, conn in list(self.conns.items()):
            if addr not in leading and conn.outstanding and not conn.closed:
                log.info(
                    "%s no longer leads any partition of %s; resending elsewhere", addr, self.topic
                )
                conn.abort(f"{addr} no longer leads (the leader moved)")
                del self.conns[addr]
                n += 1
        self.moved_aborts += n
        return n

    def drop_all(self) -> None:
        """Abort every connection at once, as a network cut would."""
        for conn in list(self.conns.values()):
            conn.abort("dropped by drop_connections()")
        self.conns.clear()

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for conn in list(self.conns.values()):
            await conn.close()
        self.conns.clear()
