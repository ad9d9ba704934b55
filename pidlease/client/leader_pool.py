"""Where each partition's leader is, and one pipelined connection per leader address.

Leaders come from the coordinator's ``GET /v1/topics/{name}``; they are looked up again
when a sender reports a lost connection or NOT_LEADER (one lookup at a time, at most one
per ``refresh_min_ms``). Partitions led by the same server share its connection; a dead
connection is replaced by the next ``connection_for`` (one connect at a time per address).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from pidlease import errors
from pidlease.client.connection import Connection
from pidlease.client.lease_client import AsyncLeaseClient, TopicInfo


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

    def apply(self, info: TopicInfo) -> None:
        self.leaders = {p.partition: p.leader_address for p in info.partition_states}

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
        except BaseException:
            self._refreshing.cancel()
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
        except BaseException:
            pending.cancel()
            raise
        finally:
            del self._connecting[addr]

    def drop_all(self) -> None:
        """Abort every connection at once, as a network cut would."""
        for conn in list(self.conns.values()):
            conn.abort("dropped by drop_connections()")
        self.conns.clear()

    async def close(self) -> None:
        for conn in list(self.conns.values()):
            await conn.close()
        self.conns.clear()
