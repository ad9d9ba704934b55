"""The partitions of this server as a whole: recovery at startup (newest valid snapshot +
log replay), which partitions it hosts and leads (from the registry's Assignment; roles of
replicated partitions are decided by ``replication.ReplicaManager``), periodic snapshots
of durable state, PID expiry, and retention (``retention.py``: each replica applies its
topic's policy to its own log; only below the newest snapshot's ``replay_from``, so
producer state never needs a deleted segment)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from partition_server import incarnation
from partition_server.flusher import Flusher
from partition_server.partition import Partition, Role, dir_name, parse_dir_name, wall_clock_ms
from partition_server.produce import ProducePath
from partition_server.producer_state import ProducerStateTable
from partition_server.rebuild import forget_start_over
from partition_server.registry import Assignment, Registry
from partition_server.replication import ReplicaManager, is_replicated
from partition_server.retention import LogPolicy, segments_to_delete
from partition_server.settings import ServerSettings
from partition_server.snapshot import PartitionImage, Snapshot, SnapshotStore
from pidlease.errors import describe
from pidlease.wire.cluster import DEDUP_MODES, PartitionState
from pidlease.wire.protocol import producer_list_part

log = logging.getLogger("partition_server.log_manager")

Key = tuple[str, int]


def producer_list_pages(
    led: list[tuple[Key, int, ProducerStateTable]], rows_max: int, after: tuple[str, int, int]
) -> tuple[list[bytes], bool]:
    """One PRODUCER_LIST answer: the rows of the ``led`` partitions ((topic, partition),
    leader epoch, table) in (topic, partition, pid) order after the cursor ``after``, at
    most ``rows_max``; (encoded partitions, whether more rows follow). Read-only and
    synchronous (no await: one consistent pass over each table)."""
    out: list[bytes] = []
    left = rows_max
    for key, epoch, table in sorted((x for x in led if x[0] >= after[:2]), key=lambda x: x[0]):
        after_pid = after[2] if key == after[:2] else -1
        cols = table.rows_after(after_pid, left)
        out.append(producer_list_part(key[0], key[1], epoch, len(table), cols))
        left -= len(cols[0])
        if left <= 0:  # full: this partition or the next may hold more
            return out, True
    return out, False


class LogManager:
    def __init__(
        self,
        settings: ServerSettings,
        registry: Registry,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.s = settings
        self.clock_ms = clock_ms
        self.data_dir = Path(settings.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.partitions: dict[Key, Partition] = {}
        self.assignment = Assignment()
        self._open_failed: set[Key] = set()  # hosted here, opening failed: tried again
        self.flusher = Flusher(mode=settings.fsync, interval_ms=settings.fsync_interval_ms)
        self.snapshots = SnapshotStore(self.data_dir / "snapshots", settings.snapshots_kept)
        self._batches_since_snapshot = 0
        self._last_snapshot_ms = clock_ms()
        self._snapshot_task: asyncio.Task[None] | None = None
        # Retention also runs when a segment rolls and when a snapshot it waited for is
        # written (``retention_soon``), one pass at a time; ``_retention_again`` asks the
        # running pass for one more.
        self._retention_task: asyncio.Task[None] | None = None
        self._retention_again = False
        self._retention_blocked = False
        self._snapshot_lock = asyncio.Lock()
        self.recovery: dict[str, Any] = {}
        self.snapshots_taken = 0
        # The one way a client's batch is appended, for both protocols (produce.py).
        self.produce = ProducePath(self.route, self.note_append)
        self.replicas = ReplicaManager(
            settings,
            registry,
            self.partitions,
            self.data_dir,
            clock_ms=clock_ms,
            note_append=self.note_append,
        )
        self._checkpoint_hws: dict[Key, int] = {}
        # Per partition, the newest snapshot on disk: (replay_from, truncation count).
        # Retention deletes only below that replay_from, and only while the count still
        # matches (recovery does not trust a snapshot taken before a cut).
        self._snapshot_replay_from: dict[Key, tuple[int, int]] = {}
        self.segments_deleted = 0
        self.bytes_deleted = 0
        # Per partition (segments, bytes) retention deleted since this process started:
        # METADATA and /metrics report them per partition. Kept when a partition leaves
        # (bounded by the partitions ever hosted) so a counter never goes back.
        self.deleted_by_partition: dict[Key, tuple[int, int]] = {}
        # Per partition directory, the created_ms of the topic it belongs to (incarnation.py);
        # partitions dropped because their topic was deleted (or deleted and created again).
        self._incarnation: dict[Key, int] = {}
        self.partitions_dropped = 0
        self._drops: set[asyncio.Task[None]] = set()

    # -- recovery --------------------------------------------------------------------------
    def _mode(self, topic: str, a: Assignment | None = None) -> str:
        spec = (a or self.assignment).topics.get(topic)
        mode = spec.dedup if spec is not None else "strict"
        if mode not in DEDUP_MODES:
            log.warning("topic %s has unknown dedup mode %r; using strict", topic, mode)
            mode = "strict"
        return mode

    def _policy(self, topic: str, a: Assignment | None = None) -> LogPolicy:
        return LogPolicy.from_spec((a or self.assignment).topics.get(topic))

    def _min_insync(self, topic: str, a: Assignment | None = None) -> int:
        spec = (a or self.assignment).topics.get(topic)
        return spec.min_insync if spec is not None else 1

    def _open(
        self, key: Key, snapshot: PartitionImage | None, a: Assignment | None = None
    ) -> tuple[Partition, Any, int]:
        replicated = is_replicated((a or self.assignment).partitions.get(key))
        part, report, n = Partition.recover(
            self.data_dir,
            key[0],
            key[1],
            mode=self._mode(key[0], a),
            segment_bytes_max=self.s.segment_bytes_max,
            index_interval_bytes=self.s.index_interval_bytes,
            batches_kept=self.s.duplicate_batches_kept,
            pids_max=self.s.tracked_pids_max_per_partition,
            evict_idle_min_ms=self.s.pid_evict_idle_min_ms,
            expire_ms=self.s.pid_expire_ms,
            flusher=self.flusher,
            clock_ms=self.clock_ms,
            snapshot=snapshot,
            checkpoint_hw=self._checkpoint_hws.get(key, 0) if replicated else None,
            policy=self._policy(key[0], a),
        )
        part.set_min_insync(self._min_insync(key[0], a))
        if replicated:
            part.role = Role.FOLLOWER  # until the replica manager decides
        part.on_roll = self.retention_soon
        return part, report, n

    def recover(self, a: Assignment) -> dict[str, Any]:
        """Open every partition found on disk (blocking; before serving)."""
        t0 = time.perf_counter()
        gc.disable()  # building millions of long-lived objects: no GC passes meanwhile
        try:
            return self._recover(a, t0)
        finally:
            gc.enable()

    def _recover(self, a: Assignment, t0: float) -> dict[str, Any]:
        self._checkpoint_hws = self.replicas.checkpoint.read()
        self.replicas.note_startup(a)
        loaded = self.snapshots.load_newest()
        snap_parts = loaded[0].partitions if loaded else {}
        self._snapshot_replay_from = {
            k: (img.replay_from, img.truncations) for k, img in snap_parts.items()
        }
        t_snap = time.perf_counter() - t0
        trashed = incarnation.remove_leftovers(self.data_dir)
        if trashed:
            log.info("removed %d partition directories of deleted topics", trashed)
        replayed = truncations = batches = 0
        from_index = scanned = rebuilt = 0
        for d in sorted(self.data_dir.iterdir()):
            key = parse_dir_name(d.name) if d.is_dir() else None
            if key is None:
                continue
            part, report, n = self._open(key, self._trusted_snapshot(key, d, loaded), a)
            self.partitions[key] = part
            replayed += n
            batches += report.batches
            truncations += len(report.truncations)
            from_index += report.segments_from_index
            scanned += report.segments_scanned
            rebuilt += report.indexes_rebuilt
        # A killed process leaves written-but-unsynced pages; make them durable before
        # anything we now call durable is acked or snapshotted.
        for part in self.partitions.values():
            part.log.fsync_all()
        # The recovered state is long lived: keep it out of every future GC pass.
        gc.collect()
        gc.freeze()
        secs = time.perf_counter() - t0
        self.recovery = {
            "snapshot": loaded[1].name if loaded else None,
            "snapshot_load_s": round(t_snap, 3),
            "partitions": len(self.partitions),
            "batches": batches,
            "batches_replayed": replayed,
            "truncations": truncations,
            # closed segments below the tail are loaded from their index files unread
            "segments_from_index": from_index,
            "segments_scanned": scanned,
            "indexes_rebuilt": rebuilt,
            "seconds": round(secs, 3),
            "tracked_pids": sum(len(p.state) for p in self.partitions.values()),
        }
        log.info(
            "recovery: snapshot %s (loaded in %.3fs), %d partitions, %d batches in logs, "
            "%d batches replayed, %d truncations, segments: %d loaded from their index, "
            "%d scanned, %d indexes rebuilt; %d tracked pids, %.3fs",
            self.recovery["snapshot"] or "none",
            t_snap,
            len(self.partitions),
            batches,
            replayed,
            truncations,
            from_index,
            scanned,
            rebuilt,
            self.recovery["tracked_pids"],
            secs,
        )
        self.apply_assignment(a)
        return self.recovery

    def _trusted_snapshot(
        self, key: Key, d: Path, loaded: tuple[Snapshot, Any] | None
    ) -> PartitionImage | None:
        """The newest snapshot's image of a partition found on disk, unless the snapshot
        (or the high-watermark checkpoint) is older than the directory: then it describes
        an older directory of that name, of a topic since deleted (incarnation.py)."""
        inc = incarnation.read(d)
        img = loaded[0].partitions.get(key) if loaded else None
        if inc is None:
            return img
        self._incarnation[key] = inc[0]
        born = inc[1]
        if img is not None and loaded is not None and loaded[0].created_ms < born:
            log.warning("%s-%d: the snapshot predates this directory; not used", *key)
            img = None
            self._snapshot_replay_from.pop(key, None)
        path = self.replicas.checkpoint.path
        if key in self._checkpoint_hws and (
            not path.exists() or path.stat().st_mtime * 1000 < born
        ):
            log.warning("%s-%d: the checkpointed high watermark predates it; not used", *key)
            del self._checkpoint_hws[key]
        return img

    # -- deleted topics --------------------------------------------------------------------
    def _drop_deleted(self, a: Assignment) -> None:
        """Drop every partition whose topic is gone from ZooKeeper, or whose directory is of
        an older topic of that name (deleted and created again). Only on a full read
        (``a.listed``): a topic that is unreadable or being created is left alone."""
        if a.listed is None:
            return
        for key in list(self.partitions):
            spec = a.topics.get(key[0])
            if key[0] not in a.listed:
                self._drop(key, "its topic was deleted")
                continue
            if spec is None:
                continue
            have = self._incarnation.get(key)
            if have is None:  # a directory from before markers: it is this topic's
                self._mark(key, spec.created_ms, 0)
            elif have != spec.created_ms:
                self._drop(key, "its topic was deleted and created again")

    def _mark(self, key: Key, created_ms: int, born_ms: int) -> None:
        try:
            incarnation.write(self.data_dir / dir_name(*key), created_ms, born_ms)
        except OSError as exc:
            log.error("%s-%d: writing its incarnation marker failed: %s", *key, describe(exc))
            return
        self._incarnation[key] = created_ms

    def _drop(self, key: Key, why: str) -> None:
        """Stop serving a partition and remove its log, indexes and producer state: the
        directory is renamed away at once (incarnation.trash: a crash after this never
        brings it back), its files deleted once its flushes are done. Snapshots taken from
        now on leave it out; one taken meanwhile does too (``snapshot_now``)."""
        part = self.partitions.pop(key)
        log.warning("partition %s-%d: %s; removing its log and producer state", *key, why)
        part.hosted = False
        part.role = Role.NONE
        self.replicas.forget(key)
        for table in (self._incarnation, self._snapshot_replay_from, self._checkpoint_hws):
            table.pop(key, None)
        part.fail_waiters(f"partition {key[0]}-{key[1]}: {why}")
        trashed = incarnation.trash(self.data_dir / dir_name(*key), self.clock_ms())
        self.partitions_dropped += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            part.close()
            if trashed is not None:
                incarnation.remove(trashed)
            return
        task = loop.create_task(self._finish_drop(part, trashed))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _finish_drop(self, part: Partition, trashed: Path | None) -> None:
        try:
            await asyncio.wait_for(self.flusher.wait_idle(), 30)
        except TimeoutError:
            log.warning("%s-%d: flushes still pending; closing anyway", part.topic, part.partition)
        part.close()
        if trashed is not None:
            await asyncio.get_running_loop().run_in_executor(None, incarnation.remove, trashed)

    # -- assignment ------------------------------------------------------------------------
    def apply_assignment(self, a: Assignment) -> None:
        """Take the assignment: open new partitions, apply each one's settings and role.
        A partial read (``a.changed``: the partitions whose state znode fired, with the
        topics and servers of the previous read) visits only those, and the ones whose
        opening failed: every other partition's inputs are the ones it was last applied
        with. Visiting all of them on each partial read cost O(partitions) of event-loop
        time per change (a failover of 334 partitions is several partial reads on each
        survivor, 1000-10,000 partitions each: issue 24)."""
        self.assignment = a
        self._drop_deleted(a)
        me = self.s.server_id
        hosted: set[Key] = set()
        visit: list[tuple[Key, PartitionState]]
        if a.changed is None or a.listed is not None:
            visit = list(a.partitions.items())
        else:
            keys = a.changed | self._open_failed
            visit = [(k, a.partitions[k]) for k in keys if k in a.partitions]
        for key, ps in visit:
            if me not in ps.replicas:
                continue
            hosted.add(key)
            part = self.partitions.get(key)
            if part is None:
                spec = a.topics.get(key[0])
                try:
                    if spec is not None:
                        # a new directory: which topic's it is, and since when
                        self._mark(key, spec.created_ms, self.clock_ms())
                    part, _, _ = self._open(key, None, a)
                except OSError as exc:
                    # A full disk, say: the other partitions still get their assignment,
                    # and the next re-read of ZooKeeper tries this one again.
                    log.error(
                        "could not open new partition %s-%d: %s", key[0], key[1], describe(exc)
                    )
                    self._open_failed.add(key)
                    continue
                self._open_failed.discard(key)
                self.partitions[key] = part
                log.info("hosting new partition %s-%d", *key)
            part.hosted = True
            mode = self._mode(key[0], a)
            if mode != part.state.mode:
                log.warning("topic %s dedup mode %s -> %s", key[0], part.state.mode, mode)
                part.state.mode = mode
            policy = self._policy(key[0], a)
            if policy != part.log.policy:
                log.info("partition %s-%d: log policy %s", key[0], key[1], policy)
                part.log.policy = policy
            min_insync = self._min_insync(key[0], a)
            if min_insync != part.min_insync:
                log.info("partition %s-%d: min in-sync replicas %d", key[0], key[1], min_insync)
                part.set_min_insync(min_insync)
            if is_replicated(ps):
                self.replicas.apply_guarded(key, part, ps, a)
                continue
            role = Role.LEADER if ps.leader == me else Role.FOLLOWER
            if role is not part.role:
                log.info("partition %s-%d: %s -> %s", key[0], key[1], part.role.value, role.value)
            part.role = role
            leader = a.servers.get(ps.leader)
            part.leader_address = leader.address if leader is not None else ""
        if a.changed is not None and a.listed is None:
            # Only the visited partitions can have left this server.
            gone = [k for k, _ in visit if k not in hosted and k in self.partitions]
        else:
            gone = [k for k in self.partitions if k not in hosted]
        for key in gone:
            part = self.partitions[key]
            part.hosted = False
            part.role = Role.NONE

    def route(self, topic: str, partition: int) -> tuple[Partition | None, str | None]:
        """(partition to serve, None) when we lead it; (None, leader address or "") when
        another server should; (None, None) when the partition is unknown."""
        part = self.partitions.get((topic, partition))
        if part is not None and part.hosted and part.role is Role.LEADER:
            return part, None
        ps = self.assignment.partitions.get((topic, partition))
        if ps is None:
            return None, None
        leader = self.assignment.servers.get(ps.leader)
        return None, leader.address if leader is not None else ""

    def producer_list(self, rows_max: int, after: tuple[str, int, int]) -> tuple[list[bytes], bool]:
        """PRODUCER_LIST over the partitions this server leads (``producer_list_pages``)."""
        led = [
            (key, part.leader_epoch, part.state)
            for key, part in self.partitions.items()
            if part.hosted and part.role is Role.LEADER
        ]
        return producer_list_pages(led, rows_max, after)

    # -- snapshots -------------------------------------------------------------------------
    def note_append(self, batches: int = 1) -> None:
        self._batches_since_snapshot += batches
        if self._batches_since_snapshot >= self.s.snapshot_interval_batches:
            self._start_snapshot()

    def _start_snapshot(self) -> None:
        if self._snapshot_task is None or self._snapshot_task.done():
            self._snapshot_task = asyncio.get_running_loop().create_task(self.snapshot_now())

    async def snapshot_now(self) -> None:
        """Capture every partition's (next offset, producer state), wait until those
        offsets are fsynced, then write the file: a snapshot never holds undurable state."""
        async with self._snapshot_lock:
            t0 = time.perf_counter()
            self._batches_since_snapshot = 0
            self._last_snapshot_ms = self.clock_ms()
            snap = Snapshot(self._last_snapshot_ms)
            waits = []
            captured = []
            for key, part in list(self.partitions.items()):
                img = await part.capture()
                snap.partitions[key] = img
                captured.append((key, part, img))
                waits.append(part.wait_flushed(img.covered_to))
            self.flusher.flush_soon()
            done = await asyncio.gather(*waits, return_exceptions=True)
            for (key, part, img), res in zip(captured, done, strict=True):
                if self.partitions.get(key) is not part:
                    # Dropped meanwhile (its topic was deleted): not in this snapshot.
                    del snap.partitions[key]
                elif part.epochs.truncations != img.truncations:
                    # Cut since its capture began: recovery would not trust these rows, and
                    # the offsets waited for may be gone (the wait fails then). Left out,
                    # the partition is rebuilt from its log.
                    del snap.partitions[key]
                elif isinstance(res, BaseException):
                    raise res
            t_capture = time.perf_counter() - t0
            loop = asyncio.get_running_loop()
            path, nbytes = await loop.run_in_executor(None, self.snapshots.write, snap)
            self.snapshots_taken += 1
            for key, img in snap.partitions.items():
                held = self.partitions.get(key)
                if (
                    held is not None
                    and held.start_over_file
                    and held.epochs.truncations == img.truncations
                ):
                    # Captured after the start-over (which raised the truncation count)
                    # and none since: this file's rows supersede its image (rebuild.py).
                    held.start_over_file = False
                    forget_start_over(held.log.dir)
            # What recovery would use now: the newest file (a partition left out of it,
            # cut while it was taken, is rebuilt from its log and so may lose no segment).
            self._snapshot_replay_from = {
                k: (img.replay_from, img.truncations) for k, img in snap.partitions.items()
            }
            if self._retention_blocked:
                self.retention_soon()  # the deletion this snapshot was waited for
            log.info(
                "snapshot %s: %d partitions, %d pids, %d bytes, %.3fs (capture %.3fs)",
                path.name,
                len(snap.partitions),
                sum(len(i.rows) for i in snap.partitions.values()),
                nbytes,
                time.perf_counter() - t0,
                t_capture,
            )

    async def maintain(self) -> None:
        """Background: time-based snapshots and PID expiry. Runs until cancelled."""
        tick_s = (
            min(
                self.s.snapshot_interval_ms,
                self.s.pid_expire_check_ms,
                self.s.retention_check_ms,
                1000,
            )
            / 1000
        )
        last_expiry_ms = last_retention_ms = self.clock_ms()
        while True:
            await asyncio.sleep(tick_s)
            now = self.clock_ms()
            if (
                self._batches_since_snapshot > 0
                and now - self._last_snapshot_ms >= self.s.snapshot_interval_ms
            ):
                self._start_snapshot()
            if now - last_expiry_ms >= self.s.pid_expire_check_ms:
                last_expiry_ms = now
                self.expire_pids(now)
            if now - last_retention_ms >= self.s.retention_check_ms:
                last_retention_ms = now
                self.retention_soon()  # one pass at a time, with the roll-triggered ones

    def retention_soon(self) -> None:
        """Run a retention pass now (a segment rolled, or a snapshot a blocked deletion
        waited for was written), so ``retention_bytes`` holds whatever the ingest rate:
        the log outgrows it by about the segments written while one snapshot is taken,
        not by what arrives in ``retention_check_ms``."""
        if self._retention_task is not None and not self._retention_task.done():
            self._retention_again = True
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test driving a partition by hand): the timer does it
        self._retention_task = loop.create_task(self._retention_passes())

    async def _retention_passes(self) -> None:
        for _ in range(10):  # bounded: the timer catches up on anything left
            self._retention_again = False
            try:
                await self.apply_retention(self.clock_ms())
            except OSError as exc:
                log.error("retention failed: %s", describe(exc))
                return
            if not self._retention_again:
                return

    async def apply_retention(self, now_ms: int) -> int:
        """Delete the closed segments each hosted partition's policy lets go (leaders and
        followers alike). Deletion waits for a snapshot where the newest one's
        ``replay_from`` is below them (one is started then). Returns segments deleted."""
        deleted = 0
        want_snapshot = False
        loop = asyncio.get_running_loop()
        for key, part in list(self.partitions.items()):
            if not part.hosted or part.role is Role.NONE:
                continue
            replay_from, truncations = self._snapshot_replay_from.get(key, (0, -1))
            if truncations != part.epochs.truncations:
                replay_from = 0  # cut since that snapshot: recovery would not use it
                # and would rebuild from the log start: a new snapshot closes that window.
                want_snapshot = want_snapshot or part.log.log_start_offset > 0
            n, blocked = segments_to_delete(
                part.log.segment_infos(),
                part.log.policy,
                now_ms,
                high_watermark=part.high_watermark,
                replay_from=replay_from,
                release_below=part.release_below,
            )
            want_snapshot = want_snapshot or blocked > 0
            if n == 0:
                continue
            start = part.log.segments[n].base_offset
            await loop.run_in_executor(None, part.log.persist_log_start, start)
            deleted += self._delete_below(key, part, start)
        self._retention_blocked = want_snapshot
        if want_snapshot:
            self._start_snapshot()
        return deleted

    def _delete_below(self, key: Key, part: Partition, start: int) -> int:
        """Second half of a deletion, after ``start`` is persisted as the log start."""
        plog = part.log
        bases = [s.base_offset for s in plog.segments]
        if (
            part is not self.partitions.get(key)
            or start not in bases[1:]
            or start > part.high_watermark
        ):
            # Closed, or cut back while the log start was written: say where it starts now
            # (an open must not remove segments below a start that no longer holds).
            if bases and part is self.partitions.get(key):
                plog.persist_log_start(bases[0])
            return 0
        n, nbytes = plog.delete_below(start)
        # The unlinked files' fds are closed, and their space freed, at the next flush.
        part.flusher.note_write(part)
        self.segments_deleted += n
        self.bytes_deleted += nbytes
        segs, byts = self.deleted_by_partition.get(key, (0, 0))
        self.deleted_by_partition[key] = (segs + n, byts + nbytes)
        log.info(
            "partition %s-%d: retention deleted %d segments (%d bytes); log starts at %d",
            key[0],
            key[1],
            n,
            nbytes,
            start,
        )
        return n

    def expire_pids(self, now_ms: int) -> int:
        """Expire PIDs unused for pid_expire_ms in the partitions this server leads. A
        follower never expires: renewals touch only the leader's state, so a follower's
        last-use times say nothing of a live but idle producer (become_leader restarts the
        clock of every PID instead)."""
        dropped = 0
        for key, part in self.partitions.items():
            if part.role is not Role.LEADER:
                continue
            n = part.state.expire(now_ms, self.s.pid_expire_ms)
            if n:
                log.info(
                    "partition %s-%d: expired %d pids unused for %d ms",
                    key[0],
                    key[1],
                    n,
                    self.s.pid_expire_ms,
                )
            dropped += n
        return dropped

    # -- reporting and shutdown ------------------------------------------------------------
    def metadata(self, server_id: int, address: str) -> dict[str, Any]:
        parts = []
        for key, p in sorted(self.partitions.items()):
            entry = p.metadata()
            segs, byts = self.deleted_by_partition.get(key, (0, 0))
            entry.update(segments_deleted=segs, bytes_deleted=byts)
            parts.append(entry)
        return {
            "server_id": server_id,
            "address": address,
            "partitions": parts,
            "tracked_pids_total": sum(x["tracked_pids"] for x in parts),
            "recovery": self.recovery,
            "retention": {
                "segments_deleted": self.segments_deleted,
                "bytes_deleted": self.bytes_deleted,
            },
            "replica_fetchers": self.replicas.describe(),
            "step_downs": self.replicas.describe_step_downs(),
        }

    async def close(self) -> None:
        if self._retention_task is not None and not self._retention_task.done():
            self._retention_task.cancel()  # deletion is safe to stop anywhere (log-start)
        await self.replicas.close()
        try:
            await asyncio.wait_for(self.flusher.wait_idle(), 10)
            if self.partitions:
                await asyncio.wait_for(self.snapshot_now(), 30)
        except Exception as exc:  # noqa: BLE001 - shutting down anyway; recovery copes
            log.warning("final flush/snapshot failed: %s", describe(exc))
        if self._snapshot_task is not None and not self._snapshot_task.done():
            self._snapshot_task.cancel()
        for part in self.partitions.values():
            part.close()
