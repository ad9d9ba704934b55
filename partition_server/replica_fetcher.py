"""A follower's fetching: per followed partition, find where this log diverges from the
leader's and cut it there (EPOCH_END rounds, ``epochs.truncation_step``), then fetch
forever: append what the leader sends, fsync it, and only then fetch again, so the offset
each fetch carries is what this replica holds durably (the leader counts it towards the
high watermark).

One fetch session per leader server (``FetchSession``, after Kafka's KIP-227): one
connection and one REPLICA_FETCH_MANY per round for every partition this server follows
there, answered only for the partitions with something new, and held by the leader while
none has; an idle pair of servers costs one small round trip per
``replica_fetch_wait_max_ms`` whatever the partition count. Each partition
(``ReplicaFetcher``, a member of the session) keeps its own rules: its reconciliation
(EPOCH_END, pipelined for the members that need one), its fsync before its offset is
reported, its start-over, its errors. A partition's error (NOT_LEADER, an epoch
mismatch...) ends that partition's part only: it backs off, asks the registry to re-read
ZooKeeper and reconciles again; the others go on. A connection's error (lost or refused,
a timeout, a malformed answer) ends the session for all of them, each starting over with
its reconciliation, so a partition never resumes on assumptions made against another
leader. A partition that joins while a fetch is parked at the leader does not wait for
it: the connection is dropped and a new one opened at once (the members already
reconciled at their epoch keep that).

A server with TLS on (``tls_certfile``) fetches over TLS, trusting ``tls_ca_file`` (the
system store when empty) and checking that the leader's certificate names the host it is
reached at (``pidlease/wire/tls.py``: a TLS cluster is TLS everywhere).
"""

from __future__ import annotations

import asyncio
import contextlib
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

    async def pipeline(
        self, api: int, builds: list[Callable[[int], bytes]], timeout_s: float
    ) -> list[P.Response]:
        """Several requests written at once, their answers read in order (the server
        answers a connection's requests in the order they came)."""
        corrs = []
        for build in builds:
            self.corr = (self.corr + 1) & 0xFFFFFFFF
            corrs.append(self.corr)
            self.writer.write(build(self.corr))

        async def read_all() -> list[P.Response]:
            await self.writer.drain()
            out = []
            for corr in corrs:
                try:
                    body = await read_frame(self.reader, self.frame_bytes_max)
                except FrameTooLarge as exc:
                    raise FetchSessionError(
                        f"answer of {exc.size} bytes is over the frame limit"
                    ) from exc
                resp = P.decode_response(api, body)
                if resp.correlation_id != corr:
                    raise FetchSessionError(
                        f"answer for request {resp.correlation_id}, expected {corr}"
                    )
                out.append(resp)
            return out

        return await asyncio.wait_for(read_all(), timeout_s)

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


Key = tuple[str, int]
# EPOCH_END requests in flight at once on a session's connection (reconciliations).
RECONCILE_WINDOW = 32


class ReplicaFetcher:
    """Follows ``leader`` at ``epoch`` for ``part`` until stopped: a member of the fetch
    session this server has with ``leader`` (``pool``: this server's sessions; a private
    one when none is given)."""

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
        pool: FetchSessions | None = None,
    ) -> None:
        self.part = part
        self.key: Key = (part.topic, part.partition)
        self.me = me
        self.leader = leader
        self.epoch = epoch
        self.address = address
        self.s = settings
        self.on_trouble = on_trouble  # asks for a ZooKeeper re-read
        self.on_append = on_append  # batches appended (counts towards snapshots)
        self.pool = pool if pool is not None else FetchSessions()
        self.session: FetchSession | None = None
        self.sessions = 0
        self.fetches_answered = 0  # 0: the leader never answered a fetch at this epoch
        self.last_error = ""
        # The member's own state inside its session.
        self.reconciled = False  # the log was cut where it diverges from the leader's
        self.rounds = 0  # EPOCH_END rounds of the current reconciliation
        self.retry_at = 0.0  # loop time before which it is left out (its backoff)
        self.backoff_s = settings.replica_fetch_backoff_ms / 1000
        self.quick_left = NOT_YET_LEADER_RETRIES

    def start(self) -> None:
        self.session = self.pool.join(self)

    def stop(self) -> None:
        if self.session is not None:
            self.session.leave(self)
            self.session = None

    @property
    def name(self) -> str:
        return f"{self.part.topic}-{self.part.partition}"

    def fail(self, exc: BaseException, *, log_it: bool = True) -> None:
        """This partition's part of the session is over: reconcile again after a pause
        (a few quick retries for a leader that has not taken the role yet)."""
        now = asyncio.get_running_loop().time()
        base_s = self.s.replica_fetch_backoff_ms / 1000
        not_yet_leader = isinstance(exc, errors.NotLeader) and self.fetches_answered == 0
        msg = (
            "no answer from the leader in time (TimeoutError)"
            if isinstance(exc, TimeoutError) and not str(exc)
            else errors.describe(exc)
        )
        quick = not_yet_leader and self.quick_left > 0
        if log_it and msg != self.last_error and not quick:
            log.warning(
                "%s: fetching from leader %d (%s) epoch %d failed: %s",
                self.name,
                self.leader,
                self.address,
                self.epoch,
                msg,
            )
        self.last_error = msg
        self.reconciled = False
        if quick:
            # ZooKeeper names this server leader at this epoch, but it has not taken the
            # role yet (it is applying the election it just won): ask again soon, a
            # bounded number of times, without the backoff or a ZooKeeper re-read (a
            # newer state replaces this fetcher anyway, on the registry's watch).
            self.quick_left -= 1
            self.retry_at = now + min(NOT_YET_LEADER_RETRY_S, base_s)
            return
        self.on_trouble()
        # A partition that got going starts the backoff over; repeated failures (the
        # leader is gone, the link is cut) back off up to 10x, not hammering anyone.
        self.backoff_s = min(self.backoff_s * 2, base_s * 10)
        self.retry_at = now + self.backoff_s

    def answered(self) -> None:
        self.last_error = ""
        self.fetches_answered += 1
        self.backoff_s = self.s.replica_fetch_backoff_ms / 1000

    def describe(self) -> dict[str, Any]:
        return {
            "leader": self.leader,
            "epoch": self.epoch,
            "address": self.address,
            "sessions": self.sessions,
            "last_error": self.last_error,
        }


class FetchSessions:
    """A server's fetch sessions, one per (leader server, address)."""

    def __init__(self) -> None:
        self.sessions: dict[tuple[int, str], FetchSession] = {}

    def join(self, f: ReplicaFetcher) -> FetchSession:
        k = (f.leader, f.address)
        s = self.sessions.get(k)
        if s is None or s.closed:
            s = self.sessions[k] = FetchSession(self, f.leader, f.address, f.me, f.s)
        s.add(f)
        return s

    def drop(self, s: FetchSession) -> None:
        if self.sessions.get((s.leader, s.address)) is s:
            del self.sessions[(s.leader, s.address)]

    def describe(self) -> dict[str, Any]:
        return {
            f"{leader}@{address}": {"partitions": len(s.members), "connections": s.connections}
            for (leader, address), s in sorted(self.sessions.items())
        }


class _Rejoin(Exception):
    """A partition joined while a fetch was parked: open a new connection now."""


class FetchSession:
    """This server's fetching from one leader server, for every partition it follows
    there (see the module docstring)."""

    def __init__(self, pool: FetchSessions, leader: int, address: str, me: int, s: Any) -> None:
        self.pool = pool
        self.leader = leader
        self.address = address
        self.me = me
        self.s = s
        self.members: dict[Key, ReplicaFetcher] = {}
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.connections = 0
        self.rotate = 0
        self._woken = asyncio.Event()  # a member joined (or left): look again

    def add(self, f: ReplicaFetcher) -> None:
        old = self.members.get(f.key)
        if old is not None and old is not f:
            old.session = None
        f.reconciled = False
        self.members[f.key] = f
        self._woken.set()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    def leave(self, f: ReplicaFetcher) -> None:
        if self.members.get(f.key) is f:
            del self.members[f.key]
        if not self.members and not self.closed:
            self.closed = True
            self.pool.drop(self)
            if self.task is not None:
                self.task.cancel()

    def _live(self, f: ReplicaFetcher) -> bool:
        """Still this session's member for its partition (checked after every await: a
        stopped fetcher's partition may lead or follow someone else by then)."""
        return self.members.get(f.key) is f

    async def _run(self) -> None:
        base_s = self.s.replica_fetch_backoff_ms / 1000
        backoff_s = base_s
        last_error = ""
        while self.members:
            wire: _Wire | None = None
            rejoin = False
            try:
                wire = await self._connect()
                self.connections += 1
                for f in self.members.values():
                    f.sessions += 1
                while self.members:
                    await self._reconcile(wire)
                    await self._fetch_round(wire)
                    backoff_s = base_s
                    last_error = ""
            except asyncio.CancelledError:
                raise
            except _Rejoin:
                rejoin = True
            except (
                OSError,
                TimeoutError,
                asyncio.IncompleteReadError,
                FetchSessionError,
                errors.PidleaseError,
            ) as exc:
                msg = (
                    "no answer from the leader in time (TimeoutError)"
                    if isinstance(exc, TimeoutError) and not str(exc)
                    else errors.describe(exc)
                )
                if msg != last_error:
                    log.warning(
                        "fetching %d partition(s) from leader %d (%s) failed: %s",
                        len(self.members),
                        self.leader,
                        self.address,
                        msg,
                    )
                last_error = msg
                for f in list(self.members.values()):
                    f.reconciled = False
                    f.last_error = msg
            except Exception:
                log.exception("fetching from leader %d (%s) failed", self.leader, self.address)
                last_error = "internal error"
                for f in list(self.members.values()):
                    f.reconciled = False
            finally:
                if wire is not None:
                    wire.close()
            if rejoin:
                continue
            for f in list(self.members.values()):
                f.on_trouble()
                break  # one ZooKeeper re-read for the session (the callback is the server's)
            backoff_s = min(backoff_s * 2, base_s * 10)
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

    def _due(self, now: float, reconciled: bool) -> list[ReplicaFetcher]:
        return [
            f for f in self.members.values() if f.reconciled is reconciled and f.retry_at <= now
        ]

    async def _reconcile(self, wire: _Wire) -> None:
        """Cut off whatever the logs of the members that need it hold that the leader's
        does not: EPOCH_END rounds, pipelined, bounded per partition."""
        loop = asyncio.get_running_loop()
        todo = self._due(loop.time(), False)
        if not todo:
            return
        for f in todo:
            f.rounds = 0
        # Everything here fsynced before the cut: what remains of it is then durable, so
        # the first fetch can report the new end (truncate_to is safe without this).
        await asyncio.gather(*(f.part.wait_flushed(f.part.log.next_offset) for f in todo))
        timeout_s = self.s.replica_fetch_timeout_ms / 1000
        while todo:
            todo = [f for f in todo if self._live(f)]
            asks: list[tuple[ReplicaFetcher, int]] = []
            for f in todo:
                asked = f.part.epochs.latest_epoch
                if asked is None:
                    f.reconciled = True
                else:
                    asks.append((f, asked))
            todo = []
            for i in range(0, len(asks), RECONCILE_WINDOW):
                chunk = asks[i : i + RECONCILE_WINDOW]
                answers = await wire.pipeline(
                    P.EPOCH_END,
                    [
                        partial(
                            P.epoch_end_request,
                            topic=f.part.topic,
                            partition=f.part.partition,
                            replica_id=self.me,
                            leader_epoch=f.epoch,
                            epoch=asked,
                        )
                        for f, asked in chunk
                    ],
                    timeout_s,
                )
                for (f, asked), resp in zip(chunk, answers, strict=True):
                    if not self._live(f):
                        continue
                    if resp.error_code != errors.NONE:
                        f.fail(errors.error_for_code(resp.error_code, resp.detail))
                        continue
                    if self._cut(f, asked, resp):
                        f.reconciled = True
                    elif f.rounds > len(f.part.epochs.entries) + 2:
                        f.fail(FetchSessionError("epoch reconciliation did not settle"))
                    else:
                        todo.append(f)

    def _cut(self, f: ReplicaFetcher, asked: int, resp: P.Response) -> bool:
        part = f.part
        f.rounds += 1
        cut, final = truncation_step(
            part.epochs, part.log.next_offset, asked, resp.epoch, resp.end_offset
        )
        if cut < part.log.next_offset:
            before = part.log.next_offset
            end = part.truncate_to(cut)
            log.warning(
                "%s-%d: log diverged from leader %d after offset %d: cut %d..%d "
                "(leader's epoch %d ends at %d)",
                part.topic,
                part.partition,
                self.leader,
                end,
                end,
                before,
                resp.epoch,
                resp.end_offset,
            )
        return final

    async def _fetch_round(self, wire: _Wire) -> None:
        s = self.s
        loop = asyncio.get_running_loop()
        self._woken.clear()
        now = loop.time()
        fetching = self._due(now, True)
        waiting = [f.retry_at for f in self.members.values() if f.retry_at > now]
        if not fetching:
            # Nothing to fetch now: wait for a member to join or its backoff to end.
            if self._due(now, False):
                return
            delay = min(waiting) - now if waiting else s.replica_fetch_wait_max_ms / 1000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), max(delay, 0.0))
            return
        # The leader counts each offset as held durably here (towards its high
        # watermark): never send one not fsynced (a no-op when the previous round or the
        # reconciliation already waited; only the members with an unflushed tail are
        # waited for, not a future per followed partition each round).
        unflushed = [f for f in fetching if f.part.flushed_end < f.part.log.next_offset]
        if unflushed:
            await asyncio.gather(*(f.part.wait_flushed(f.part.log.next_offset) for f in unflushed))
        fetching = [f for f in fetching if self._live(f) and f.reconciled]
        if not fetching or self._due(loop.time(), False):
            return  # reconcile those that joined meanwhile first
        # Rotated each round: when the answer's room runs out, others go first next time.
        self.rotate = (self.rotate + 1) % len(fetching)
        fetching = fetching[self.rotate :] + fetching[: self.rotate]
        fetching = fetching[: P.REPLICA_FETCH_PARTITIONS_MAX]
        sent = {
            f.key: (
                f,
                P.ReplicaFetchEntry(
                    f.part.topic,
                    f.part.partition,
                    f.epoch,
                    f.part.log.next_offset,
                    f.part.high_watermark,
                ),
            )
            for f in fetching
        }
        wait_ms = s.replica_fetch_wait_max_ms
        if waiting:
            wait_ms = max(0, min(wait_ms, int((min(waiting) - now) * 1000)))
        # The whole answer is read as one frame: leave room for its heads.
        room = s.frame_bytes_max - 65536 - 64 * len(sent)
        max_bytes = max(room, 1)
        part_max = max(min(s.fetch_bytes_max, max_bytes), 1)
        asked = loop.create_task(  # noqa: RUF006 - awaited below
            wire.call(
                P.REPLICA_FETCH_MANY,
                partial(
                    P.replica_fetch_many_request,
                    entries=[e for _, e in sent.values()],
                    replica_id=self.me,
                    max_wait_ms=wait_ms,
                    max_bytes=max_bytes,
                    partition_max_bytes=part_max,
                ),
                (wait_ms + s.replica_fetch_timeout_ms) / 1000,
            )
        )
        woken = loop.create_task(self._woken.wait())
        try:
            await asyncio.wait({asked, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not loop.is_closed():  # (a simulation ends with its loop closed)
                woken.cancel()
                if not asked.done():
                    asked.cancel()
        if not asked.done() or asked.cancelled():
            # A partition joined while the fetch was parked: a new connection now (the
            # answer is owed on this one) rather than after the leader's wait.
            raise _Rejoin
        resp = asked.result()
        if resp.error_code != errors.NONE:
            raise errors.error_for_code(resp.error_code, resp.detail)
        flushing: list[tuple[ReplicaFetcher, int]] = []
        named: set[Any] = set()
        prewritten = await self._prewrite_epochs(sent, resp)
        try:
            self._apply_fetched(sent, resp, named, flushing)
        finally:
            for part, data, ok in prewritten:
                if not ok or part.epochs.on_disk is not data or part.epochs.encode() != data:
                    # The file may hold the prewrite and not what the history says now.
                    part.epochs.on_disk = None
                    try:
                        part.epochs.save()
                    except OSError as exc:
                        log.error("saving the leader epochs of %s failed: %s", part, exc)
        members = self.members
        for k, (f, _) in sent.items():
            # (``_live`` inlined: this visits every followed partition each round)
            if k not in named and members.get(k) is f and f.reconciled:
                f.answered()  # left out of the answer: the leader took it, nothing new
        if flushing:
            # Fsynced before the next fetch reports these ends to the leader.
            await asyncio.gather(
                *(f.part.wait_flushed(f.part.log.next_offset) for f, _ in flushing)
            )
            for f, hw in flushing:
                if self._live(f) and f.reconciled:
                    f.part.set_high_watermark(min(hw, f.part.flushed_end))
                    f.answered()

    async def _prewrite_epochs(
        self, sent: dict[Any, tuple[ReplicaFetcher, P.ReplicaFetchEntry]], resp: P.Response
    ) -> list[tuple[Partition, bytes, bool]]:
        """After a leader change every partition's first fetched batches bring a new epoch
        entry, saved (two fsyncs) before they are appended: one after the other on the loop
        that was about 20 ms a partition on a loaded disk, seconds for a dead server's
        hundreds of partitions. When more than one answer brings one, their files are
        written at once, off the loop, first; each append then finds its bytes there
        (``on_disk``). Returns (partition, bytes, written and nothing moved meanwhile)."""
        jobs: list[tuple[Partition, bytes, Any]] = []
        for got in resp.fetched or []:
            f, _e = sent.get((got.topic, got.partition), (None, None))
            if f is None or got.error_code != errors.NONE or not len(got.data):
                continue
            if not self._live(f) or not f.reconciled or got.leader_epoch != f.epoch:
                continue
            data = f.part.prepare_replicated_epochs(memoryview(got.data), got.epochs or [])
            if data is not None and f.part.epochs.path is not None:
                jobs.append((f.part, data, f.part.epochs.token()))
        if len(jobs) < 2:
            return []
        loop = asyncio.get_running_loop()
        done = await asyncio.gather(
            *(loop.run_in_executor(None, part.epochs.prewrite, data) for part, data, _ in jobs),
            return_exceptions=True,
        )
        out = []
        for (part, data, token), res in zip(jobs, done, strict=True):
            ok = not isinstance(res, BaseException) and part.epochs.token() == token
            if ok:
                part.epochs.on_disk = data
            out.append((part, data, ok))
        return out

    def _apply_fetched(
        self,
        sent: dict[Any, tuple[ReplicaFetcher, P.ReplicaFetchEntry]],
        resp: P.Response,
        named: set[Any],
        flushing: list[tuple[ReplicaFetcher, int]],
    ) -> None:
        for got in resp.fetched or []:
            named.add((got.topic, got.partition))
            f, e = sent.get((got.topic, got.partition), (None, None))
            if f is None or e is None or not self._live(f) or not f.reconciled:
                continue
            part = f.part
            if got.error_code == errors.OffsetOutOfRange.code and got.high_watermark > e.offset:
                # The leader's log start (replication.py), and the producer state of the
                # PIDs that wrote only below it.
                try:
                    part.restart_at(got.high_watermark, _leader_rows(part, got.data))
                except FetchSessionError as exc:
                    f.fail(exc)
                continue
            if got.error_code != errors.NONE:
                f.fail(errors.error_for_code(got.error_code, got.detail))
                continue
            if got.leader_epoch != f.epoch:
                f.fail(FetchSessionError(f"leader answered for epoch {got.leader_epoch}"))
                continue
            if len(got.data):
                n = part.append_replicated(memoryview(got.data), got.epochs or [])
                f.on_append(n)
                flushing.append((f, got.high_watermark))
            else:
                part.set_high_watermark(min(got.high_watermark, part.flushed_end))
                f.answered()
