"""Replication of this server's replicated partitions (replication factor > 1): which role
each replica takes, the leader's answers to its followers, the in-sync set, and the high
watermark checkpoint. Partitions with one replica never come here; they work as before.

Roles follow ZooKeeper (``PartitionState`` at ``/topics/<t>/partitions/<p>``), re-read on
every watch and once a second (``reconcile_all``), so a step that failed is retried:

- ZooKeeper names this server leader at an epoch it may lead: lead it. It may not lead an
  epoch it was named for before this process started (``inherited``): then it steps in
  (``leadership.step_in``: hand over to a live in-sync replica, or take a new epoch).
- Another server leads and is live: follow it (``ReplicaFetcher``).
- The leader's ``/servers/<id>`` is gone: stop fetching and, when in sync, try to win the
  election (``leadership.elect``); every in-sync survivor tries, the znode version picks one.

As leader it answers REPLICA_FETCH (a fetch that has everything waits up to
``replica_fetch_wait_max_ms`` for an append or a new high watermark) and EPOCH_END, moves a
follower out of the in-sync set after ``replica_lag_time_max_ms`` without catching up and
back in once a fetch since its removal reaches the high watermark and the leader's log end
at the start of its epoch (``isr.py``, Joining), at most one addition
per ``isr_change_min_interval_ms`` (``isr.py`` decides, ``leadership`` writes). A follower
whose ``/servers/<id>`` is gone leaves the set at once (``liveness.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from partition_server import leadership
from partition_server.checkpoint import HighWatermarkCheckpoint
from partition_server.handoff import PreferredLeader
from partition_server.liveness import LiveServers
from partition_server.move_throttle import MoveThrottle, is_moving
from partition_server.partition import Partition, Role
from partition_server.registry import Assignment, Registry
from partition_server.replica_fetcher import FetchSessions, ReplicaFetcher
from pidlease import errors
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState

log = logging.getLogger("partition_server.replication")

Key = tuple[str, int]


def is_replicated(ps: PartitionState | None) -> bool:
    return ps is not None and len(ps.replicas) > 1


_BULK_FAILURES_LOGGED = 10  # a failed bulk write names its first writes
# A fetcher's trouble re-reads the live servers at most this often (``_fetch_trouble``).
_SERVERS_REREAD_MS = 1000.0


class ReplicaManager:
    def __init__(
        self,
        settings: Any,
        registry: Registry,
        partitions: dict[Key, Partition],
        data_dir: Path,
        *,
        clock_ms: Callable[[], int],
        note_append: Callable[[int], Any] = lambda n: None,
        zk_executor: Executor | None = None,
        mono_ms: Callable[[], float] | None = None,
    ) -> None:
        self.s = settings
        self.me = settings.server_id
        self.registry = registry
        self.partitions = partitions
        self.clock_ms = clock_ms
        self.note_append = note_append
        self.zk_executor = zk_executor  # runs the blocking ZooKeeper writes (None: the loop's)
        self.checkpoint = HighWatermarkCheckpoint(data_dir)
        self.routes = settings.routes
        self.inherited: dict[Key, int] = {}
        self.fetchers: dict[Key, ReplicaFetcher] = {}
        self.fetch_sessions = FetchSessions()  # one per leader server (replica_fetcher.py)
        self._busy: set[Key] = set()
        self._servers_reread_ms = float("-inf")  # ``_fetch_trouble``
        # Leadership writes queued this turn of the loop (``_zk_bulk``), and whether their
        # flush is scheduled.
        self._bulk: dict[Key, tuple[leadership.Change, Any]] = {}
        self._bulk_due = False
        self.epoch_executor: Executor | None = None  # ``_epoch_pool``
        self._hw_sent: dict[tuple[Key, int], int] = {}
        self._fetched_at: dict[tuple[Key, int], int] = {}  # the epoch of the last first fetch
        # (shrinks, expands) of each partition's in-sync set that ZooKeeper confirmed, kept
        # across leaderships (the metrics' counters; docs/replication.md, The in-sync set).
        self.isr_changes: dict[Key, tuple[int, int]] = {}
        self.liveness = LiveServers(self.me)  # whose session ended: out of sync at once
        self._task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self.started = False
        # Step-down (docs/replication.md, Step-down): the ZooKeeper session each leadership
        # was taken in; a leadership ends when the registry's lease on that session does.
        self.mono_ms = mono_ms or (lambda: time.monotonic() * 1000)
        self._led_in: dict[Key, int | None] = {}
        self.step_downs: list[dict[str, Any]] = []  # the last few, for METADATA
        self.step_downs_total = 0
        # Handing leadership over (handoff.py): a controlled shutdown began (lead nothing,
        # win no election), and the preferred-leader election run on each maintenance tick.
        self.leaving = False
        self.preferred = PreferredLeader(self)
        # The catch-up fetches of moving replicas share one bytes/s budget (move_throttle.py).
        self.move_throttle = MoveThrottle(
            int(getattr(settings, "move_fetch_bytes_per_s", 0)), clock=time.monotonic
        )
        if hasattr(registry, "configure_lease"):  # test doubles may have no lease at all
            registry.configure_lease(
                margin_ms=getattr(settings, "zk_step_down_margin_ms", 0),
                heartbeat_ms=getattr(settings, "zk_heartbeat_interval_ms", 0),
            )
            registry.on_lease = self.check_lease

    # -- startup -----------------------------------------------------------------------------
    def note_startup(self, a: Assignment) -> None:
        """Before serving: the epochs ZooKeeper names this server leader of were won by an
        earlier process; this one must not simply carry on with them."""
        for key, ps in a.partitions.items():
            if is_replicated(ps) and ps.leader == self.me:
                self.inherited[key] = ps.leader_epoch

    def start(self) -> None:
        self.started = True
        self.reconcile_all()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._maintain())
        if getattr(self.registry, "lease", None) is not None:  # None: nothing enforced
            self._lease_task = loop.create_task(self._watch_lease())

    async def close(self) -> None:
        self.started = False
        if self._task is not None:
            self._task.cancel()
        if self._lease_task is not None:
            self._lease_task.cancel()
        for f in self.fetchers.values():
            f.stop()
        self.fetchers.clear()
        if isinstance(self.epoch_executor, ThreadPoolExecutor):
            self.epoch_executor.shutdown(wait=False)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._write_checkpoint)
        except OSError as exc:
            log.warning("final high watermark checkpoint failed: %s", errors.describe(exc))

    # -- roles -------------------------------------------------------------------------------
    def reconcile_all(self) -> None:
        a = self.registry.assignment
        for key, ps in a.partitions.items():
            part = self.partitions.get(key)
            if part is not None and part.hosted and is_replicated(ps) and self.me in ps.replicas:
                self.apply_guarded(key, part, ps, a)
        for key in [
            k for k in self.fetchers if k not in a.partitions or not self.partitions[k].hosted
        ]:
            self.fetchers.pop(key).stop()

    def apply_guarded(self, key: Key, part: Partition, ps: PartitionState, a: Assignment) -> None:
        """:meth:`apply`, with its failure kept to this partition: it runs inside the
        registry's change handler and the once-a-second reconcile, which must go on to the
        other partitions (and to later assignments). The reconcile retries this one."""
        try:
            self.apply(key, part, ps, a)
        except Exception as exc:  # noqa: BLE001 - e.g. the epoch file on a full disk
            log.error(
                "%s-%d: applying its state at epoch %d failed (%s); retrying at the next reconcile",
                key[0],
                key[1],
                ps.leader_epoch,
                errors.describe(exc),
            )

    def apply(self, key: Key, part: Partition, ps: PartitionState, a: Assignment) -> None:
        """Take the role ZooKeeper's state calls for (see the module docstring)."""
        if not self.started or ps.leader_epoch < part.leader_epoch:
            return  # not serving yet, or a read older than what this replica already saw
        me = self.me
        leading = part.role is Role.LEADER and part.leader_epoch == ps.leader_epoch
        if self.leaving and (ps.leader == me or ps.leader not in a.servers) and not leading:
            # A controlled shutdown (handoff.py): take no leadership and win no election;
            # one that nobody could take over is kept until the server stops.
            return
        if ps.leader == me:
            if part.role is Role.LEADER and part.leader_epoch == ps.leader_epoch:
                # Nobody else writes the znode during our epoch, so our own writes keep the
                # in-sync view exact; a read that raced one of them must not undo it.
                self._drop_departed(key, part, a)
                return
            self._stop_fetcher(key)
            session = self._lease_session(self.mono_ms())
            if session is None:
                # Not sure our session is alive: someone may be elected any moment. Lead
                # nothing; the lease's return re-reads and decides again.
                if part.role is Role.LEADER:
                    self.step_down(key, part, "no valid ZooKeeper lease")
                return
            if self.inherited.get(key) == ps.leader_epoch or me not in ps.isr:
                part.become_follower(-1, ps.leader_epoch, "")
                self._zk_bulk(
                    leadership.Change(key[0], key[1], "step_in", ps.leader_epoch),
                    after=self._take_written(key),
                )
                return
            log.info(
                "%s-%d: leading epoch %d (in-sync %s, log end %d, high watermark %d)",
                key[0],
                key[1],
                ps.leader_epoch,
                ps.isr,
                part.log.next_offset,
                part.high_watermark,
            )
            part.become_leader(me, ps.leader_epoch, ps.replicas, ps.isr, self.isr_clock_ms)
            self._led_in[key] = session
            self._drop_departed(key, part, a)
            return
        leader = a.servers.get(ps.leader)
        if leader is None:
            self._stop_fetcher(key)
            if part.role is Role.LEADER or part.leader_epoch != ps.leader_epoch:
                part.become_follower(ps.leader, ps.leader_epoch, "")
            if me in ps.isr:
                self._zk_bulk(
                    leadership.Change(key[0], key[1], "elect"), after=self._take_written(key)
                )
            return
        address = self.routes.get(ps.leader, leader.address)
        f = self.fetchers.get(key)
        if f is not None and (f.leader, f.epoch, f.address) == (
            ps.leader,
            ps.leader_epoch,
            address,
        ):
            return
        self._stop_fetcher(key)
        if part.role is Role.LEADER:
            log.warning(
                "%s-%d: deposed at epoch %d; server %d leads epoch %d",
                key[0],
                key[1],
                part.leader_epoch,
                ps.leader,
                ps.leader_epoch,
            )
        part.become_follower(ps.leader, ps.leader_epoch, leader.address)
        f = ReplicaFetcher(
            part,
            me=me,
            leader=ps.leader,
            epoch=ps.leader_epoch,
            address=address,
            settings=self.s,
            on_trouble=partial(self._fetch_trouble, key),
            on_append=self.note_append,
            pool=self.fetch_sessions,
        )
        self.fetchers[key] = f
        f.start()

    def _take_written(self, key: Key) -> Callable[[PartitionState | None], None]:
        """After a compare-and-set this server won (an election, a step-in): take the role
        the state it wrote calls for at once, rather than after the re-read of the whole
        cluster state that follows every write (one ZooKeeper round trip per topic, per
        partition and per server, on a loaded executor). The write's own state is exact:
        until this server writes again only a newer epoch can replace it, and the re-read
        (and apply's epoch check) still follow it. The survivors of a failover otherwise
        found the new leader not yet leading and waited out their fetch backoff."""

        def after(state: PartitionState | None) -> None:
            part = self.partitions.get(key)
            if state is None or part is None or not part.hosted:
                return
            self.apply_guarded(key, part, state, self.registry.assignment)

        return after

    def _fetch_trouble(self, key: Key) -> None:
        """A fetcher of ``key`` (or its whole fetch session) failed: read that partition's
        state again, and the live servers at most once a second (``Registry.reread``), not
        the whole cluster at every backoff."""
        reread = getattr(self.registry, "reread", None)
        if reread is None:  # test doubles
            self.registry.refresh()
            return
        now = self.mono_ms()
        servers = now - self._servers_reread_ms >= _SERVERS_REREAD_MS
        if servers:
            self._servers_reread_ms = now
        reread(key, servers=servers)

    def forget(self, key: Key) -> None:
        """The partition is dropped (its topic was deleted): stop fetching it."""
        self._stop_fetcher(key)

    def _stop_fetcher(self, key: Key) -> None:
        f = self.fetchers.pop(key, None)
        if f is not None:
            f.stop()

    def _zk(
        self,
        key: Key,
        op: Callable[..., PartitionState | None],
        *args: Any,
        after: Callable[[PartitionState | None], None] | None = None,
    ) -> None:
        """Run one leadership write for ``key`` (at most one at a time), then re-read.
        ``after`` gets the state written, or None when it was not, or may not have been
        (it raised: a lost connection can land a write after all)."""
        if key in self._busy or self.registry.zk is None:
            return
        self._busy.add(key)
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(
            self.zk_executor, op, self.registry.zk, key[0], key[1], self.me, *args
        )

        def done(f: asyncio.Future[PartitionState | None]) -> None:
            self._busy.discard(key)
            exc = None if f.cancelled() else f.exception()
            failed = f.cancelled() or exc is not None
            if exc is not None:
                log.warning(
                    "%s-%d: %s failed: %s", key[0], key[1], op.__name__, errors.describe(exc)
                )
            if after is not None:
                after(None if failed else f.result())
            if not f.cancelled():
                self.registry.refresh()

        fut.add_done_callback(done)

    def _zk_bulk(
        self,
        change: leadership.Change,
        after: Callable[[PartitionState | None], None] | None = None,
    ) -> None:
        """Queue one leadership write (at most one at a time per partition); every write
        queued in this turn of the loop (a reconcile, or one read of ZooKeeper, visits every
        partition) goes out together in ``leadership.write_many``: a few transactions for
        the partitions of a dead server, not one compare-and-set each (issue 24 item 3).
        ``after`` as for :meth:`_zk`; then one re-read."""
        key = change.key
        if key in self._busy or self.registry.zk is None:
            return
        self._busy.add(key)
        self._bulk[key] = (change, after)
        if not self._bulk_due:
            self._bulk_due = True
            asyncio.get_running_loop().call_soon(self._flush_bulk)

    def _flush_bulk(self) -> None:
        self._bulk_due = False
        batch, self._bulk = self._bulk, {}
        if not batch:
            return
        zk = self.registry.zk
        if zk is None:
            for key, (_change, after) in batch.items():
                self._busy.discard(key)
                if after is not None:
                    after(None)
            return
        changes = [change for change, _after in batch.values()]
        task = asyncio.get_running_loop().create_task(self._write_many(zk, changes))

        def done(f: asyncio.Future[dict[Key, PartitionState | None]]) -> None:
            exc = None if f.cancelled() else f.exception()
            written: dict[Key, PartitionState | None] = {}
            if exc is not None:
                # Each write by name (as a single write's failure is logged), the first
                # few; a lost connection may have landed them all the same.
                why = errors.describe(exc)
                for c in changes[:_BULK_FAILURES_LOGGED]:
                    log.warning("%s-%d: %s failed: %s", c.topic, c.partition, c.kind, why)
                if len(changes) > _BULK_FAILURES_LOGGED:
                    log.warning(
                        "and %d more leadership write(s) failed (maybe written): %s",
                        len(changes) - _BULK_FAILURES_LOGGED,
                        why,
                    )
            elif not f.cancelled():
                written = f.result()
            won: list[tuple[Key, PartitionState, Any]] = []
            for key, (change, after) in batch.items():
                self._busy.discard(key)
                state = written.get(key)
                if change.kind != "set_isr" and state is not None and state.leader == self.me:
                    won.append((key, state, after))
                elif after is not None:
                    after(state)
            self._lead_won(won)
            unwritten = [key for key in batch if written.get(key) is None]
            if f.cancelled() or not unwritten:
                return
            reread = getattr(self.registry, "reread", None)
            if exc is not None or reread is None:
                # A write may have landed unseen (a lost connection): read everything.
                self.registry.refresh()
                return
            # Not written: its rule said no or it lost its race (another server moved
            # first). Those partitions' states are read again, not the whole cluster: a
            # full re-read after every bulk write was 1000-10,000 partition reads and an
            # apply of them all, on each survivor, several times per failover, on the
            # ZooKeeper session the lease's heartbeat shares; the survivor that lost the
            # election race then followed the winner 0.7 s late, behind it. (The data
            # watch that the last read armed on each znode brings a written or moved one
            # back as a partial read too; both land in the same read.) An election or
            # step-in refused may have been asked on a stale view of the live servers
            # (the leader came back): those read the servers too, as the full read did,
            # or the same refusal would be asked again at once.
            servers = any(batch[key][0].kind != "set_isr" for key in unwritten)
            for key in unwritten:
                reread(key, servers=servers)

        task.add_done_callback(done)

    async def _write_many(
        self, zk: Any, changes: list[leadership.Change]
    ) -> dict[Key, PartitionState | None]:
        """``leadership.write_many``, each round's read and commit a call of their own in
        the executor (the same steps; in the simulation other servers move in between)."""
        loop = asyncio.get_running_loop()
        result: dict[Key, PartitionState | None] = {}
        pending = {c.key: c for c in changes}
        # The first round plans against the states and versions the registry last read
        # (no re-read of hundreds of znodes before a failover's elections); a znode that
        # moved since fails its transaction, and later rounds read.
        known: Any = getattr(self.registry.assignment, "known", None)
        for _ in range(leadership.BULK_ROUNDS):
            if not pending:
                break
            planned = await loop.run_in_executor(
                self.zk_executor,
                leadership.read_and_plan,
                zk,
                self.me,
                list(pending.values()),
                result,
                known,
            )
            known = None
            pending = await loop.run_in_executor(
                self.zk_executor, leadership.commit_planned, zk, planned, result
            )
        for key in pending:
            result[key] = None
        return result

    def _lead_won(self, won: list[tuple[Key, PartitionState, Any]]) -> None:
        """Leaderships this server just won (an election, a step-in): each needs its epoch's
        entry in its leader-epoch file, durably, before it takes a write, two fsyncs each.
        Taken one after the other on the loop that was 20 ms a partition on a loaded disk
        (6.4 s for the 334 partitions of a dead server); so the files are written first, in
        parallel off the loop (``EpochHistory.prepare`` / ``prewrite``), then the roles are
        taken at once, each ``become_leader`` finding its bytes already there. A history
        that changed meanwhile, or a role not taken after all, is saved again from memory:
        the file never keeps an entry the history does not have."""
        if not won:
            return
        loop = asyncio.get_running_loop()
        jobs: list[tuple[Key, PartitionState, Any, Partition, bytes, Any, Any]] = []
        for key, state, after in won:
            part = self.partitions.get(key)
            data = None
            if part is not None and part.hosted and part.epochs.path is not None:
                data = part.epochs.prepare(state.leader_epoch, part.log.next_offset)
            if part is None or data is None or len(won) == 1:
                if after is not None:
                    after(state)
                continue
            token = part.epochs.token()
            fut = loop.run_in_executor(self._epoch_pool(), part.epochs.prewrite, data)
            jobs.append((key, state, after, part, data, token, fut))
        if not jobs:
            return

        def finish(_: Any) -> None:
            for key, state, after, part, data, token, fut in jobs:
                exc = fut.exception()
                if exc is None and part.epochs.token() == token:
                    part.epochs.on_disk = data
                if after is not None:
                    after(state)
                if (
                    exc is None
                    and part.epochs.on_disk is data
                    and part.role is Role.LEADER
                    and part.leader_epoch == state.leader_epoch
                ):
                    continue
                part.epochs.on_disk = None  # the file may hold the prewrite: rewrite it
                try:
                    part.epochs.save()
                except OSError as err:
                    log.error(
                        "%s-%d: saving its leader epochs failed (%s)",
                        key[0],
                        key[1],
                        errors.describe(err),
                    )

        asyncio.gather(*(job[-1] for job in jobs), return_exceptions=True).add_done_callback(finish)

    def _epoch_pool(self) -> Executor | None:
        """Threads for the leader-epoch files written together (``_lead_won``): fsyncs of
        different files overlap (the file system commits them together)."""
        if self.epoch_executor is None:
            self.epoch_executor = ThreadPoolExecutor(16, thread_name_prefix="epochs")
        return self.epoch_executor

    def _change_isr(
        self,
        key: Key,
        part: Partition,
        add: list[int],
        remove: list[int],
        gone: frozenset[int] = frozenset(),
    ) -> None:
        isr = part.isr
        if isr is None or key in self._busy or self.registry.zk is None:
            return
        if add:
            log.info(
                "%s-%d: follower(s) %s caught up to %d; back in sync",
                key[0],
                key[1],
                add,
                max(part.high_watermark, isr.epoch_start),
            )
        if [r for r in remove if r not in gone]:
            log.warning(
                "%s-%d: follower(s) %s not caught up for %d ms; out of sync",
                key[0],
                key[1],
                [r for r in remove if r not in gone],
                self.s.replica_lag_time_max_ms,
            )
        if [r for r in remove if r in gone]:
            log.warning(
                "%s-%d: follower(s) %s left the cluster (ZooKeeper session ended); out of sync",
                key[0],
                key[1],
                [r for r in remove if r in gone],
            )
        # Additions count towards the HW from now on; removals need a new fetch to return.
        new = isr.begin_change(add, remove, part.isr_clock_ms())

        def after(state: PartitionState | None) -> None:
            if part.isr is not isr:
                return  # another leadership since; it keeps its own view
            if state is not None:
                self._count_isr_change(key, isr.isr, set(state.isr) | {isr.leader})
                isr.set_isr(state.isr)
                part.in_sync_changed()  # the HW may move, or waiting acks fail below min
            else:
                # Not written, or maybe written: the next check retries, and nobody
                # ZooKeeper may now name in sync stops counting meanwhile.
                isr.change_failed()

        self._zk_bulk(
            leadership.Change(key[0], key[1], "set_isr", part.leader_epoch, tuple(new)),
            after=after,
        )

    def _count_isr_change(self, key: Key, before: set[int], after: set[int]) -> None:
        """One confirmed write: a shrink when it left someone out, an expand when it let
        someone in (both, for a write that did both)."""
        shrinks, expands = self.isr_changes.get(key, (0, 0))
        self.isr_changes[key] = (shrinks + bool(before - after), expands + bool(after - before))

    # -- the leader's side of the protocol ---------------------------------------------------
    async def replica_fetch(self, req: P.Request, part: Partition) -> bytes:
        corr, rid = req.correlation_id, req.replica_id
        key = (part.topic, part.partition)
        bad = self._check_follower(req, part)
        if bad is not None:
            return P.replica_fetch_response(corr, bad[0], bad[1])
        if not 0 <= req.offset <= part.log.next_offset:
            return P.replica_fetch_response(
                corr,
                errors.InvalidRequest.code,
                (
                    f"offset {req.offset} is outside this leader's log "
                    f"(ends {part.log.next_offset}); reconcile with EPOCH_END first"
                ),
            )
        if req.offset < part.log.log_start_offset:
            # The follower lacks what retention deleted here: it starts over at the log
            # start, which this answer carries in its high watermark field, with the
            # producer state of the PIDs that wrote only below it (snapshot format).
            return P.replica_fetch_response(
                corr,
                errors.OffsetOutOfRange.code,
                f"offset {req.offset} is below this leader's log start {part.log.log_start_offset}",
                high_watermark=part.log.log_start_offset,
                data=part.rows_below_log_start(),  # the state no batch left here carries
            )
        assert part.isr is not None
        if self._fetched_at.get((key, rid)) != part.leader_epoch:
            # One line per follower and leadership: the failover timeline (elected, role
            # taken, first fetch, first ack) can be read off the logs.
            self._fetched_at[(key, rid)] = part.leader_epoch
            log.info(
                "%s-%d: first fetch from follower %d at epoch %d (offset %d, log end %d)",
                key[0],
                key[1],
                rid,
                part.leader_epoch,
                req.offset,
                part.log.next_offset,
            )
        part.record_replica_fetch(rid, req.offset)
        joiners = part.isr.joiners(
            part.high_watermark, part.isr_clock_ms(), self.s.isr_change_min_interval_ms
        )
        if joiners:
            self._change_isr(key, part, joiners, [])
        if req.offset >= part.log.next_offset and part.high_watermark <= self._hw_sent.get(
            (key, rid), -1
        ):
            wait_s = min(req.max_wait_ms, self.s.replica_fetch_wait_max_ms) / 1000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(part.wait_for_data()), wait_s)
            bad = self._check_follower(req, part)
            if bad is not None:
                return P.replica_fetch_response(corr, bad[0], bad[1])
        max_bytes = min(max(req.max_bytes, 1), self.s.fetch_bytes_max)
        moving = self._moving(key, rid, part)
        if moving:
            max_bytes = await self._move_allowance(max_bytes, req.max_wait_ms)
            bad = self._check_follower(req, part)  # it may have waited: still leading?
            if bad is not None:
                return P.replica_fetch_response(corr, bad[0], bad[1])
        data = part.replica_read(req.offset, max_bytes)
        if moving:
            self.move_throttle.spent(sum(len(b) for b in data))
        hw = part.high_watermark
        self._hw_sent[(key, rid)] = hw
        return P.replica_fetch_response(
            corr,
            0,
            high_watermark=hw,
            leader_epoch=part.leader_epoch,
            epochs=part.epochs.entries_from(req.offset),
            data=data,
        )

    async def replica_fetch_many(self, req: P.Request) -> bytes:
        """REPLICA_FETCH for every partition a follower follows here, in one request (its
        fetch session with this server). Each partition keeps REPLICA_FETCH's rules: the
        follower checked (epoch, replica), the offset inside the log or a start-over
        below the log start, its position recorded for the in-sync set and the high
        watermark. Only partitions with something new are answered (data, a high
        watermark above the follower's, an error); while none has, the request waits up
        to its ``max_wait_ms`` for an append or a high watermark change in any of them."""
        corr, rid = req.correlation_id, req.replica_id
        entries = req.fetches or []
        answered: dict[int, P.ReplicaFetched] = {}
        live: list[tuple[int, P.ReplicaFetchEntry, Partition]] = []
        for i, e in enumerate(entries):
            part = self.partitions.get((e.topic, e.partition))
            bad = self._fetch_step(e, rid, part)
            if isinstance(bad, P.ReplicaFetched):
                answered[i] = bad
            else:
                assert part is not None
                live.append((i, e, part))
        if not answered and not any(self._news(e, p) for _, e, p in live) and live:
            wait_s = min(req.max_wait_ms, self.s.replica_fetch_wait_max_ms) / 1000
            if wait_s > 0:
                # The first append or high watermark change in any of them ends the wait
                # (waiting for all of them held each acks=all write for the whole wait).
                waits = {p.wait_for_data() for _, _, p in live}
                await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            for i, e, part in live:
                bad2 = self._check(rid, e.leader_epoch, part)
                if bad2 is not None:
                    answered[i] = P.ReplicaFetched(e.topic, e.partition, bad2[0], bad2[1])
        budget = max(min(req.max_bytes, self.s.frame_bytes_max - 65536), 1)
        part_max = min(max(req.flags, 1), self.s.fetch_bytes_max)
        sent = 0
        moving, news = await self._moving_many(live, answered, rid, req.max_wait_ms)
        for i, e, part in news:
            data: list[bytes] = []
            if e.offset < part.log.next_offset and budget - sent > 0:
                room = min(part_max, budget - sent)
                if i in moving:
                    room = self.move_throttle.allowance(room)
                    if room == 0:
                        continue  # the move throttle's budget is spent: its turn comes
                data = part.replica_read(e.offset, room)
                size = sum(len(b) for b in data)
                if sent and sent + size > budget:
                    continue  # over the frame's room: its turn comes (the follower rotates)
                sent += size
                if i in moving:
                    self.move_throttle.spent(size)
            elif e.offset < part.log.next_offset and not part.high_watermark > e.high_watermark:
                continue  # no room left for its data this round
            answered[i] = P.ReplicaFetched(
                e.topic,
                e.partition,
                0,
                "",
                part.high_watermark,
                part.leader_epoch,
                part.epochs.entries_from(e.offset) if data else [],
                data,  # type: ignore[arg-type]
            )
        return P.replica_fetch_many_response(corr, 0, "", [answered[i] for i in sorted(answered)])

    # -- the move throttle (issue 27; move_throttle.py) ----------------------------------------
    def _moving(self, key: Key, rid: int, part: Partition) -> bool:
        """Follower ``rid`` of ``part`` (led here) catches up for a move: throttled."""
        if not self.move_throttle.enabled or part.isr is None:
            return False
        spec = self.registry.assignment.topics.get(key[0])
        if spec is None:
            return False
        isr = part.isr
        return is_moving(isr.replicas, sorted(isr.counted()), spec.replication_factor, rid)

    async def _move_allowance(self, want: int, max_wait_ms: int) -> int:
        """Bytes a moving replica's fetch may read, after waiting (up to its wait) for the
        budget to refill; at least 1 (a read returns one whole batch) once the wait is up."""
        wait_s = self.move_throttle.wait_s()
        if wait_s > 0:
            limit = min(max_wait_ms, self.s.replica_fetch_wait_max_ms) / 1000
            await asyncio.sleep(min(wait_s, limit))
        return max(1, self.move_throttle.allowance(want))

    async def _moving_many(
        self,
        live: list[tuple[int, P.ReplicaFetchEntry, Partition]],
        answered: dict[int, P.ReplicaFetched],
        rid: int,
        max_wait_ms: int,
    ) -> tuple[set[int], list[tuple[int, P.ReplicaFetchEntry, Partition]]]:
        """The entries of a session fetch with news to answer (not answered yet), and
        which of those are moving replicas' catch-up. When those are all it has news for
        and the budget is spent, wait (up to its wait) for the budget to refill, so the
        follower does not come back at once for nothing; then check each entry again, as
        after the fetch's own wait (an error in ``answered``), and look for news again.
        Only an entry with news reads data, the only thing the throttle limits: an idle
        entry costs one look, not a question to the throttle each round (issue 24)."""
        news = [(i, e, p) for i, e, p in live if i not in answered and self._news(e, p)]
        moving = {i for i, e, p in news if self._moving((e.topic, e.partition), rid, p)}
        if not moving or len(moving) != len(news):
            return moving, news
        wait_s = self.move_throttle.wait_s()
        if wait_s <= 0:
            return moving, news
        limit = min(max_wait_ms, self.s.replica_fetch_wait_max_ms) / 1000
        await asyncio.sleep(min(wait_s, limit))
        for i, e, part in live:
            bad = None if i in answered else self._check(rid, e.leader_epoch, part)
            if bad is not None:
                answered[i] = P.ReplicaFetched(e.topic, e.partition, bad[0], bad[1])
        news = [(i, e, p) for i, e, p in live if i not in answered and self._news(e, p)]
        # Appends during the wait: those entries' reads are throttled too.
        moving |= {
            i
            for i, e, p in news
            if i not in moving and self._moving((e.topic, e.partition), rid, p)
        }
        return moving, news

    @staticmethod
    def _news(e: P.ReplicaFetchEntry, part: Partition) -> bool:
        """Something to send this follower for ``part``: batches past its log end, or a
        high watermark above its own that it can take (never above its log end)."""
        return e.offset < part.log.next_offset or (
            min(part.high_watermark, e.offset) > e.high_watermark
        )

    def _fetch_step(
        self, e: P.ReplicaFetchEntry, rid: int, part: Partition | None
    ) -> P.ReplicaFetched | None:
        """The first step of one partition's fetch (REPLICA_FETCH's, before any wait):
        its error answer, or None once its position is recorded."""
        key = (e.topic, e.partition)
        if part is None or not part.hosted:
            return P.ReplicaFetched(
                e.topic,
                e.partition,
                errors.NotLeader.code,
                f"server {self.me} does not host {e.topic}-{e.partition}",
            )
        bad = self._check(rid, e.leader_epoch, part)
        if bad is not None:
            return P.ReplicaFetched(e.topic, e.partition, bad[0], bad[1])
        if not 0 <= e.offset <= part.log.next_offset:
            return P.ReplicaFetched(
                e.topic,
                e.partition,
                errors.InvalidRequest.code,
                (
                    f"offset {e.offset} is outside this leader's log "
                    f"(ends {part.log.next_offset}); reconcile with EPOCH_END first"
                ),
            )
        if e.offset < part.log.log_start_offset:
            return P.ReplicaFetched(
                e.topic,
                e.partition,
                errors.OffsetOutOfRange.code,
                f"offset {e.offset} is below this leader's log start {part.log.log_start_offset}",
                part.log.log_start_offset,
                part.leader_epoch,
                [],
                part.rows_below_log_start(),
            )
        assert part.isr is not None
        if self._fetched_at.get((key, rid)) != part.leader_epoch:
            self._fetched_at[(key, rid)] = part.leader_epoch
            log.info(
                "%s-%d: first fetch from follower %d at epoch %d (offset %d, log end %d)",
                key[0],
                key[1],
                rid,
                part.leader_epoch,
                e.offset,
                part.log.next_offset,
            )
        part.record_replica_fetch(rid, e.offset)
        joiners = part.isr.joiners(
            part.high_watermark, part.isr_clock_ms(), self.s.isr_change_min_interval_ms
        )
        if joiners:
            self._change_isr(key, part, joiners, [])
        return None

    def epoch_end(self, req: P.Request, part: Partition) -> bytes:
        bad = self._check_follower(req, part)
        if bad is not None:
            return P.epoch_end_response(req.correlation_id, bad[0], bad[1])
        epoch, end = part.epochs.end_offset_for(req.epoch, part.log.next_offset)
        return P.epoch_end_response(req.correlation_id, 0, epoch=epoch, end_offset=end)

    def _check_follower(self, req: P.Request, part: Partition) -> tuple[int, str] | None:
        return self._check(req.replica_id, req.leader_epoch, part)

    def _check(self, replica_id: int, leader_epoch: int, part: Partition) -> tuple[int, str] | None:
        if part.role is Role.LEADER:
            # Checked on every fetch, the only thing that moves a replicated high watermark
            # while followers are in the set: no ack after the lease ends, even when the
            # timer that steps down is late (a busy loop).
            self._check_lease_of(part)
        if part.role is not Role.LEADER or part.isr is None:
            return errors.NotLeader.code, f"server {self.me} does not lead this partition now"
        if leader_epoch != part.leader_epoch:
            if leader_epoch > part.leader_epoch:
                self.registry.refresh()  # the follower knows of a newer epoch: are we deposed?
            return errors.NotLeader.code, (
                f"this leader is at epoch {part.leader_epoch}, the follower at {leader_epoch}"
            )
        if replica_id not in part.isr.followers:
            return errors.InvalidRequest.code, f"server {replica_id} is not a replica here"
        return None

    # -- step-down ---------------------------------------------------------------------------
    def _lease_session(self, now_ms: float) -> int | None:
        f = getattr(self.registry, "lease_session", None)
        return 0 if f is None else f(now_ms)

    def _lease_held(self, session: int | None, now_ms: float) -> bool:
        f = getattr(self.registry, "lease_held", None)
        return True if f is None else bool(f(session, now_ms))

    def _lease_remaining_ms(self, now_ms: float) -> float:
        f = getattr(self.registry, "lease_remaining_ms", None)
        return float("inf") if f is None else float(f(now_ms))

    def check_lease(self) -> None:
        """Step down from every leadership whose ZooKeeper lease ended; when the lease is
        back, re-read ZooKeeper so the roles are decided again (by compare-and-set)."""
        self._check_leases()
        if self._lease_session(self.mono_ms()):
            with contextlib.suppress(RuntimeError):  # no loop: a test driving it by hand
                self.registry.refresh()

    def _check_leases(self) -> None:
        """Step down from every leadership whose lease ended. One lease check per ZooKeeper
        session the leaderships were taken in (all of them in one, mostly), not one per
        partition: the watch runs every 50 ms while leading, and its passes over every
        partition were a quarter of an idle server's loop at 3000 partitions (issue 24).
        Only the leaderships of a lapsed session are visited."""
        led = self._led_in
        if not led:
            return
        now = self.mono_ms()
        lapsed = {s for s in set(led.values()) if not self._lease_held(s, now)}
        if not lapsed:
            return
        for key, session in list(led.items()):
            part = self.partitions.get(key)
            if session in lapsed and part is not None and part.role is Role.LEADER:
                self.step_down(key, part, "its ZooKeeper session may have expired")

    def _check_lease_of(self, part: Partition) -> None:
        key = (part.topic, part.partition)
        if key not in self._led_in:
            return  # an unreplicated or hand-made leadership: no lease to keep
        if not self._lease_held(self._led_in[key], self.mono_ms()):
            self.step_down(key, part, "its ZooKeeper session may have expired")

    def step_down(self, key: Key, part: Partition, why: str) -> None:
        """Stop leading ``key`` before anyone else can be elected: waiting acks are answered
        NOT_LEADER (retriable), new produces and replica fetches are refused (the role).
        This epoch is then treated as inherited: the server leads again only through
        ``step_in``, a compare-and-set to a new epoch or to another in-sync replica."""
        epoch = part.leader_epoch
        now = self.mono_ms()
        self.resign(key, part)
        self.step_downs_total += 1
        event = {
            "topic": key[0],
            "partition": key[1],
            "epoch": epoch,
            "wall_ms": int(time.time() * 1000),
            "why": why,
        }
        self.step_downs = [*self.step_downs[-19:], event]
        log.warning(
            "%s-%d: stepping down from epoch %d: %s (lease remaining %.0f ms); waiting acks "
            "answered NOT_LEADER",
            key[0],
            key[1],
            epoch,
            why,
            self._lease_remaining_ms(now),
        )

    def resign(self, key: Key, part: Partition) -> None:
        """Stop leading ``key`` at once (see ``step_down``); the epoch is inherited."""
        self._stop_fetcher(key)
        part.become_follower(-1, part.leader_epoch, "")
        self.inherited[key] = part.leader_epoch
        self._led_in.pop(key, None)

    async def _watch_lease(self) -> None:
        """Steps down when a lease ends, waking at the end of the lease (at most every
        50 ms while leading, so a confirmation that moved the end is seen)."""
        while True:
            wait_ms = 200.0
            if self._led_in:  # (may name a partition deposed since: a 50 ms wake, no more)
                wait_ms = min(50.0, max(1.0, self._lease_remaining_ms(self.mono_ms())))
            await asyncio.sleep(wait_ms / 1000)
            try:
                self._check_leases()
            except Exception:  # keep watching; the next pass retries
                log.exception("checking the ZooKeeper lease failed")

    # -- background --------------------------------------------------------------------------
    async def _maintain(self) -> None:
        tick_s = min(self.s.replica_lag_time_max_ms / 4, 1000) / 1000
        last_checkpoint = time.monotonic()
        last_reconcile = time.monotonic()
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick_s)
            try:
                self.check_isr()
                self.preferred.tick()
                if time.monotonic() - last_reconcile >= 1.0:
                    last_reconcile = time.monotonic()
                    self.reconcile_all()
                if time.monotonic() - last_checkpoint >= self.s.hw_checkpoint_interval_ms / 1000:
                    last_checkpoint = time.monotonic()
                    await loop.run_in_executor(None, self._write_checkpoint)
            except Exception:  # keep maintaining; the next tick retries
                log.exception("replication maintenance failed")

    def isr_clock_ms(self) -> int:
        """The clock of the in-sync bookkeeping: monotonic (``mono_ms``), never the wall
        clock, which an NTP step moves by seconds: a step forward would make every
        follower look ``replica_lag_time_max_ms`` behind and shrink every in-sync set at
        once (issue 23 item 7)."""
        return int(self.mono_ms())

    def check_isr(self, now_ms: int | None = None) -> None:
        """One maintenance pass (each tick): in-sync followers not caught up for
        ``replica_lag_time_max_ms``, or whose session ended, leave the set. The departed
        are also removed as soon as a read shows them gone (``_drop_departed``); this
        retries a write that failed or was skipped while another was in flight. Lag is
        measured on each partition's in-sync clock (``isr_clock_ms``); ``now_ms`` (tests
        with a hand-moved clock) overrides it."""
        self._observe_servers(self.registry.assignment)
        gone = frozenset(self.liveness.gone())
        lag_ms = self.s.replica_lag_time_max_ms
        for key, part in list(self.partitions.items()):
            isr = part.isr
            if isr is None or part.role is not Role.LEADER:
                continue
            now = part.isr_clock_ms() if now_ms is None else now_ms
            out = isr.laggards(now, lag_ms)  # mostly a comparison (isr.py)
            if gone:
                out = sorted(set(out) | set(isr.departed(gone)))
            if out:
                self._change_isr(key, part, [], out, gone)

    def _observe_servers(self, a: Assignment | None) -> None:
        servers = getattr(a, "servers", None)
        if servers is not None:
            self.liveness.observe(servers)

    def _drop_departed(self, key: Key, part: Partition, a: Assignment) -> None:
        """On every read of ZooKeeper: a counted follower whose ``/servers/<id>`` is gone
        leaves the in-sync set now, not ``replica_lag_time_max_ms`` later. Removals are
        never held back by ``isr_change_min_interval_ms`` (only additions are), and the
        topic's minimum in-sync replicas is enforced on the smaller set as for any
        removal: below it, acks=all produces are refused, not acked on fewer copies."""
        if part.isr is None:
            return
        self._observe_servers(a)
        gone = frozenset(self.liveness.gone())
        out = part.isr.departed(gone) if gone else []
        if out:
            self._change_isr(key, part, [], out, gone)

    def _write_checkpoint(self) -> None:
        values = {k: p.high_watermark for k, p in list(self.partitions.items()) if p.replicated}
        if values:
            self.checkpoint.write(values)

    def describe_step_downs(self) -> dict[str, Any]:
        return {"total": self.step_downs_total, "recent": list(self.step_downs)}

    def describe(self) -> dict[str, Any]:
        return {f"{k[0]}-{k[1]}": f.describe() for k, f in sorted(self.fetchers.items())}
