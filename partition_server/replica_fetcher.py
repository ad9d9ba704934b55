"""A follower's fetch loop for one partition: connect to the leader, find where this log
diverges from the leader's and cut it there (EPOCH_END rounds, ``epochs.truncation_step``),
then fetch forever: append what the leader sends, fsync it, and only then fetch again, so
the offset each fetch carries is what this replica holds durably (the leader counts it
towards the high watermark).

One connection per followed partition: the protocol answers in request order per
connection, so a fetch parked at the leader would hold back every other partition's.
Any error (connection lost or refused, a timeout, NOT_LEADER, a malformed answer) ends
the session: the fetcher backs off, asks the registry to re-read ZooKeeper (the leader
may have changed) and starts over with the reconciliation, so a session never resumes on
assumptions made against another leader.

A server with TLS on (``tls_certfile``) fetches over TLS, trusting ``tls_ca_file`` (the
system store when empty) and checking that the leader's certificate names the host it is
reached at (``pidlease/wire/tls.py``: a TLS cluster is TLS everywhere).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from partition_server.epochs import truncation_step
from partition_server.partition import Partition
from partition_server.snapshot import CorruptSnapshot, PartitionImage
from partition_server.snapshot import decode as decode_snapshot
from pidlease import errors
from pidlease.wire import protocol as P
from pidlease.wire.framing import FrameTooLarge, read_frame
from pidlease.wire.tls import HANDSHAKE_TIMEOUT_S, peer_ssl_context

log = logging.getLogger("partition_server.replica_fetcher")


@lru_cache(maxsize=4)
def _peer_context(certfile: str, ca_file: str) -> ssl.SSLContext | None:
    return peer_ssl_context(certfile, ca_file)  # one per process: contexts are reusable


# A leader that ZooKeeper names but that answers NOT_LEADER before it has answered this
# fetcher once is most likely still taking the role it just won: asked again every
# NOT_YET_LEADER_RETRY_S (at most the fetch backoff), at most NOT_YET_LEADER_RETRIES times
# (100 ms in all), before the usual backoff (20 ms, doubling to 200 ms), which cost up to
# a few hundred ms per failover when the new leader was slow to take its role.
NOT_YET_LEADER_RETRIES = 20
NOT_YET_LEADER_RETRY_S = 0.005


class FetchSessionError(Exception):
    """The session with the leader is over; start again."""


class _Wire:
    """One request at a time over an asyncio stream."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame_bytes_max: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.frame_bytes_max = frame_bytes_max
        self.corr = 0

    async def call(self, api: int, build: Callable[[int], bytes], timeout_s: float) -> P.Response:
        self.corr = (self.corr + 1) & 0xFFFFFFFF
        corr = self.corr
        self.writer.write(build(corr))

        async def read() -> bytes:
            await self.writer.drain()
            try:
                return await read_frame(self.reader, self.frame_bytes_max)
            except FrameTooLarge as exc:
                raise FetchSessionError(
                    f"answer of {exc.size} bytes is over the frame limit"
                ) from exc

        body = await asyncio.wait_for(read(), timeout_s)
        resp = P.decode_response(api, body)
        if resp.correlation_id != corr:
            raise FetchSessionError(f"answer for request {resp.correlation_id}, expected {corr}")
        return resp

    def close(self) -> None:
        self.writer.close()


def _leader_rows(part: Partition, data: memoryview | bytes | None) -> PartitionImage | None:
    """The image a leader sends with a start-over (``Partition.rows_below_log_start``: its
    rows and what it dropped); None from a leader that sends none. A damaged image ends
    the session (fetch again)."""
    if not data:
        return None
    try:
        image = decode_snapshot(bytes(data)).partitions.get((part.topic, part.partition))
    except CorruptSnapshot as exc:
        raise FetchSessionError(f"the leader's producer state is unreadable: {exc}") from exc
    return image


class ReplicaFetcher:
    """Follows ``leader`` at ``epoch`` for ``part`` until cancelled."""

    def __init__(
        self,
        part: Partition,
        *,
        me: int,
        leader: int,
        epoch: int,
        address: str,
        settings: Any,
        on_trouble: Callable[[], Any],
        on_append: Callable[[int], Any] = lambda n: None,
    ) -> None:
        self.part = part
        self.me = me
        self.leader = leader
        self.epoch = epoch
        self.address = address
        self.s = settings
        self.on_trouble = on_trouble  # asks for a ZooKeeper re-read
        self.on_append = on_append  # batches appended (counts towards snapshots)
        self.task: asyncio.Task[None] | None = None
        self.sessions = 0
        self.fetches_answered = 0  # 0: the leader never answered a fetch at this epoch
        self.last_error = ""

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> None:
        base_s = self.s.replica_fetch_backoff_ms / 1000
        backoff_s = base_s
        name = f"{self.part.topic}-{self.part.partition}"
        quick_left = NOT_YET_LEADER_RETRIES
        while True:
            wire: _Wire | None = None
            not_yet_leader = False
            try:
                wire = await self._connect()
                self.sessions += 1
                await self._reconcile(wire)
                await self._fetch_forever(wire)
            except asyncio.CancelledError:
                raise
            except (
                OSError,
                TimeoutError,
                asyncio.IncompleteReadError,
                FetchSessionError,
                errors.PidleaseError,
            ) as exc:
                not_yet_leader = isinstance(exc, errors.NotLeader) and self.fetches_answered == 0
                msg = (
                    "no answer from the leader in time (TimeoutError)"
                    if isinstance(exc, TimeoutError) and not str(exc)
                    else errors.describe(exc)
                )
                if msg != self.last_error and not (not_yet_leader and quick_left > 0):
                    log.warning(
                        "%s: fetching from leader %d (%s) epoch %d failed: %s",
                        name,
                        self.leader,
                        self.address,
                        self.epoch,
                        msg,
                    )
                self.last_error = msg
            except Exception:
                log.exception("%s: replica fetcher failed", name)
            finally:
                if wire is not None:
                    wire.close()
            if not_yet_leader and quick_left > 0:
                # ZooKeeper names this server leader at this epoch, but it has not taken the
                # role yet (it is applying the election it just won): ask again soon, a
                # bounded number of times, without the backoff or a ZooKeeper re-read (a
                # newer state replaces this fetcher anyway, on the registry's watch).
                quick_left -= 1
                await asyncio.sleep(min(NOT_YET_LEADER_RETRY_S, base_s))
                continue
            self.on_trouble()
            # A session that got going starts the backoff over; repeated failures (the
            # leader is gone, the link is cut) back off up to 10x, not hammering anyone.
            backoff_s = base_s if not self.last_error else min(backoff_s * 2, base_s * 10)
            await asyncio.sleep(backoff_s)

    async def _connect(self) -> _Wire:
        host, _, port = self.address.rpartition(":")
        timeout_s = self.s.replica_fetch_timeout_ms / 1000
        ctx = _peer_context(getattr(self.s, "tls_certfile", ""), getattr(self.s, "tls_ca_file", ""))
        tls = (
            {}
            if ctx is None
            else {
                "ssl": ctx,
                "server_hostname": host,
                "ssl_handshake_timeout": min(timeout_s, HANDSHAKE_TIMEOUT_S),
            }
        )
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port), **tls), timeout_s
        )
        return _Wire(reader, writer, self.s.frame_bytes_max)

    async def _reconcile(self, wire: _Wire) -> None:
        """Cut off whatever this log holds that the leader's does not (bounded rounds)."""
        part = self.part
        # Everything here fsynced before the cut: what remains of it is then durable, so
        # the first fetch can report the new end (truncate_to is safe without this).
        await part.wait_flushed(part.log.next_offset)
        timeout_s = self.s.replica_fetch_timeout_ms / 1000
        for _ in range(len(part.epochs.entries) + 2):
            asked = part.epochs.latest_epoch
            if asked is None:
                return
            t, p = part.topic, part.partition
            resp = await wire.call(
                P.EPOCH_END,
                partial(
                    P.epoch_end_request,
                    topic=t,
                    partition=p,
                    replica_id=self.me,
                    leader_epoch=self.epoch,
                    epoch=asked,
                ),
                timeout_s,
            )
            if resp.error_code != errors.NONE:
                raise errors.error_for_code(resp.error_code, resp.detail)
            cut, final = truncation_step(
                part.epochs, part.log.next_offset, asked, resp.epoch, resp.end_offset
            )
            if cut < part.log.next_offset:
                before = part.log.next_offset
                end = part.truncate_to(cut)
                log.warning(
                    "%s-%d: log diverged from leader %d after offset %d: cut %d..%d "
                    "(leader's epoch %d ends at %d)",
                    t,
                    p,
                    self.leader,
                    end,
                    end,
                    before,
                    resp.epoch,
                    resp.end_offset,
                )
            if final:
                return
        raise FetchSessionError("epoch reconciliation did not settle")

    async def _fetch_forever(self, wire: _Wire) -> None:
        part, s = self.part, self.s
        t, p = part.topic, part.partition
        timeout_s = (s.replica_fetch_wait_max_ms + s.replica_fetch_timeout_ms) / 1000
        # The whole answer is read as one frame: leave room for its head.
        max_bytes = max(min(s.fetch_bytes_max, s.frame_bytes_max - 65536), 1)
        while True:
            offset = part.log.next_offset
            # The leader counts this offset as held durably here (towards its high
            # watermark): never send one not fsynced, whatever path led here (a no-op
            # when the previous round or the reconciliation already waited).
            await part.wait_flushed(offset)
            resp = await wire.call(
                P.REPLICA_FETCH,
                partial(
                    P.replica_fetch_request,
                    topic=t,
                    partition=p,
                    replica_id=self.me,
                    leader_epoch=self.epoch,
                    offset=offset,
                    max_bytes=max_bytes,
                    max_wait_ms=s.replica_fetch_wait_max_ms,
                ),
                timeout_s,
            )
            if resp.error_code == errors.OffsetOutOfRange.code and resp.high_watermark > offset:
                # The leader's log start (replication.py), and the producer state of the
                # PIDs that wrote only below it.
                part.restart_at(resp.high_watermark, _leader_rows(part, resp.data))
                continue
            if resp.error_code != errors.NONE:
                raise errors.error_for_code(resp.error_code, resp.detail)
            if resp.leader_epoch != self.epoch:
                raise FetchSessionError(f"leader answered for epoch {resp.leader_epoch}")
            assert resp.data is not None
            if len(resp.data):
                n = part.append_replicated(resp.data, resp.epochs or [])
                self.on_append(n)
                # Fsynced before the next fetch reports this end to the leader.
                await part.wait_flushed(part.log.next_offset)
            part.set_high_watermark(min(resp.high_watermark, part.flushed_end))
            self.last_error = ""
            self.fetches_answered += 1

    def describe(self) -> dict[str, Any]:
        return {
            "leader": self.leader,
            "epoch": self.epoch,
            "address": self.address,
            "sessions": self.sessions,
            "last_error": self.last_error,
        }
