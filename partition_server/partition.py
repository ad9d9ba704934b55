"""One partition on this server: its log, its producer state and the acks waiting for
durability. Everything here runs on the event loop; a check and the write it allows happen
with no await in between, so appends to one partition are serialized without a lock.

Two ends matter: ``flushed_end`` (everything below it is fsynced here) and
``high_watermark`` (everything below it is committed: fsynced here and, on a replicated
partition, held by every in-sync replica). Acks, readers and the producer state's durable
highwaters follow the high watermark; snapshots and a follower's next fetch follow the
flushed end. With one replica the two are the same.

Replicated partitions (``replication.py`` drives them): as leader, ``isr`` tracks the
followers and followers' fetches wait in ``wait_for_data``; as follower, fetched batches go
through ``append_replicated`` and a divergent suffix is cut by ``truncate_to``."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

from partition_server import rebuild
from partition_server.epochs import EpochHistory
from partition_server.flusher import Flusher, FlushMark
from partition_server.isr import InSyncReplicas
from partition_server.log import DEFAULT_INDEX_INTERVAL_BYTES, OpenReport, PartitionLog
from partition_server.producer_state import (
    Decision,
    FenceOutcome,
    Outcome,
    ProducerStateTable,
    Row,
)
from partition_server.rebuild import replay_batch as replay_batch  # noqa: PLC0414 - re-exported: tests replay with it
from partition_server.retention import LogPolicy
from partition_server.snapshot import PartitionImage
from pidlease.errors import (
    CorruptRecord,
    NotEnoughReplicas,
    NotLeader,
    OffsetOutOfRange,
    PidleaseError,
    ServerUnavailable,
    TooManyPids,
)
from pidlease.wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    BatchHeader,
    encode_control_batch,
    iter_batches,
    set_base_offset,
)

log = logging.getLogger("partition_server.partition")


def dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_dir_name(name: str) -> tuple[str, int] | None:
    topic, sep, p = name.rpartition("-")
    if not sep or not topic or not p.isdigit():
        return None
    return topic, int(p)


Waiter = tuple[int, asyncio.Future[Any], Callable[[], Any]]


class Role(Enum):
    """What this replica is for its partition. Only a LEADER takes clients' batches
    (``Partition.append``, at the epoch it leads); a FOLLOWER takes its leader's
    (``Partition.append_replicated``); NONE: not hosted here."""

    LEADER = "leader"
    FOLLOWER = "follower"
    NONE = "none"


class Origin(Enum):
    """Where an appended batch comes from: a client (the rules decide, as a leader) or
    replication (the leader's log is the truth; the rules are only compared)."""

    CLIENT = "client"
    REPLICATION = "replication"


class Partition:
    def __init__(
        self,
        topic: str,
        partition: int,
        plog: PartitionLog,
        state: ProducerStateTable,
        flusher: Flusher,
        clock_ms: Callable[[], int],
        *,
        epochs: EpochHistory | None = None,
        high_watermark: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.log = plog
        self.state = state
        self.flusher = flusher
        self.clock_ms = clock_ms
        # Recovery fsyncs what it found, so all of the log is flushed at start; on a
        # replicated partition only what was known committed (checkpoint) counts as such.
        self.flushed_end = plog.next_offset
        self.high_watermark = (
            plog.next_offset if high_watermark is None else min(high_watermark, plog.next_offset)
        )
        self._waiters: deque[Waiter] = deque()  # acks: wait for the high watermark
        self._flush_waiters: deque[Waiter] = deque()  # snapshots, follower fetches
        self._role = Role.LEADER
        self.state.drops_allowed = True  # dropped (expiry, eviction) only where it leads
        self.leader_address = ""
        self.hosted = False  # assigned to this server in ZooKeeper
        # Segments wholly below this offset may go whatever the retention policy (the
        # group log's newest checkpoint start: partition_server/kafka/group_log.py).
        self.release_below = 0
        self.batches_appended = 0
        # -- replication (see replication.py) --
        self.replicated = high_watermark is not None
        self.epochs = epochs or EpochHistory([], 0, plog.dir / "leader-epochs")
        self.leader_epoch = -1  # the epoch this replica leads or follows
        self.leader_id = -1
        self.isr: InSyncReplicas | None = None  # while leading a replicated partition
        self.isr_clock_ms: Callable[[], int] = clock_ms  # its clock (become_leader)
        self.min_insync = 1  # the topic's effective min_insync_replicas (the log manager sets it)
        self.min_insync_refusals = 0
        self._data_waiter: asyncio.Future[None] | None = None
        self.follower_rule_mismatches = 0
        # Called when an append rolls the active segment (the log manager runs retention then,
        # so a size limit holds at any ingest rate, not only every retention_check_ms).
        self.on_roll: Callable[[], None] | None = None
        # A start-over image (rebuild.START_OVER_FILE) is on disk until a server snapshot
        # holds this partition (the log manager removes it then).
        self.start_over_file = False

    @classmethod
    def recover(
        cls,
        data_dir: Path,
        topic: str,
        partition: int,
        *,
        mode: str,
        segment_bytes_max: int,
        batches_kept: int,
        pids_max: int,
        flusher: Flusher,
        clock_ms: Callable[[], int],
        snapshot: PartitionImage | None = None,
        checkpoint_hw: int | None = None,
        evict_idle_min_ms: int | None = None,
        expire_ms: int | None = None,
        policy: LogPolicy | None = None,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    ) -> tuple[Partition, OpenReport, int]:
        """Open the log and rebuild producer state: snapshot rows + replay of the log from
        the snapshot's ``replay_from``; from 0 when the log ends before the snapshot's
        ``covered_to`` or was cut since the snapshot (``rebuild.recover``: the snapshot, or
        this partition's start-over image). ``checkpoint_hw`` (replicated
        partitions only; None otherwise) caps what counts as durable. Returns (partition,
        log report, batches replayed). ``evict_idle_min_ms`` and ``expire_ms`` are the
        tracked-PID limit's rules (producer_state.py; None: the table's defaults)."""
        limits: dict[str, Any] = {"expire_ms": expire_ms}
        if evict_idle_min_ms is not None:
            limits["evict_idle_min_ms"] = evict_idle_min_ms
        state = ProducerStateTable(
            mode=mode, batches_kept=batches_kept, pids_max=pids_max, **limits
        )
        directory = data_dir / dir_name(topic, partition)
        directory.mkdir(parents=True, exist_ok=True)
        epochs = EpochHistory.load(directory)

        def open_log(
            from_offset: int, on_batch: Callable[[BatchHeader], None]
        ) -> tuple[PartitionLog, OpenReport]:
            return PartitionLog.open(
                directory,
                segment_bytes_max,
                verify_from_offset=from_offset,
                on_batch=on_batch,
                replay_from_offset=from_offset,
                policy=policy,
                clock_ms=clock_ms,
                index_interval_bytes=index_interval_bytes,
            )

        plog, report, replayed, checkpoint_hw, start_over_file = rebuild.recover(
            directory,
            f"{topic}-{partition}",
            state,
            epochs,
            snapshot,
            open_log,
            clock_ms(),
            checkpoint_hw,
        )
        part = cls(
            topic,
            partition,
            plog,
            state,
            flusher,
            clock_ms,
            epochs=epochs,
            high_watermark=checkpoint_hw,
        )
        part.start_over_file = start_over_file
        return part, report, replayed

    # -- appends ---------------------------------------------------------------------------
    def append(
        self,
        batch: memoryview,
        h: BatchHeader,
        on_durable: Callable[[int, int], Any],
        *,
        epoch: int,
    ) -> tuple[Decision, asyncio.Future[Any] | None]:
        """Check a client's validated batch and write it when the rules allow. Returns the
        decision and, on APPEND, a future resolved with ``on_durable(base, last)`` once
        committed. ``epoch`` is the leader epoch the request was routed at
        (``produce.ProducePath``): NotLeader (retriable, nothing noted) unless this
        replica still leads at that epoch, so a batch routed before an await can never
        reach a follower's log. Raises TooManyPids for a new PID the tracked-PID limit
        has no room for (only here, the leader's decision: followers and replay apply
        what the log holds), and ServerUnavailable when the log write fails (full disk),
        NotEnoughReplicas when the in-sync set is below the topic's minimum (before
        anything is written). Each refusal is noted in the producer state: on a monotonic
        topic the PID's later batches are refused until this one is resent ("a refusal
        leaves no hole", docs/protocol.md)."""
        if self._role is not Role.LEADER or epoch != self.leader_epoch:
            raise NotLeader(
                f"{self.topic}-{self.partition}: routed as leader at epoch {epoch}; this "
                f"replica is now {self._role.value} at epoch {self.leader_epoch}; retry"
            )
        now = self.clock_ms()
        d = self._decide(h, Origin.CLIENT, now)
        if d.outcome is not Outcome.APPEND:
            if d.outcome is Outcome.DUPLICATE or d.outcome is Outcome.SEQUENCE_UNKNOWN:
                self.state.refresh(h.pid, now)
            elif d.outcome is Outcome.TOO_MANY_PIDS:
                n = self.state.refused_total
                if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th ... refusal: no log flood
                    log.warning(
                        "%s-%d: new pid %d refused, tracked-PID limit %d reached "
                        "(%d refusals so far)",
                        self.topic,
                        self.partition,
                        h.pid,
                        self.state.pids_max,
                        n,
                    )
                self.state.note_refused(h.pid, h.generation, h.base_sequence, h.count)
                raise TooManyPids(f"partition {self.topic}-{self.partition}: {d.detail}")
            return d, None
        if self.isr is not None and not self.isr.accepts_writes():
            self.state.note_refused(h.pid, h.generation, h.base_sequence, h.count)
            raise self._not_enough_replicas("produce")
        buf = bytearray(batch)
        set_base_offset(buf, self.log.next_offset)
        active = self.log.segments[-1]
        try:
            base = self.log.append(buf, h.count, h.timestamp_ms)
        except ServerUnavailable:
            self.state.note_refused(h.pid, h.generation, h.base_sequence, h.count)
            raise
        if self.log.segments[-1] is not active:
            self.rolled()
        self.state.apply_append(h.pid, h.generation, h.base_sequence, h.count, base, now)
        self.batches_appended += 1
        self._wake_data_waiters()
        last = base + h.count - 1
        return d, self._when_durable(last + 1, lambda: on_durable(base, last))

    def _decide(self, h: BatchHeader, origin: Origin, now: int) -> Decision:
        """The rules' decision for a data batch. A client's is the leader's: the
        tracked-PID limit applies (a new PID may be refused TOO_MANY_PIDS). A replicated
        batch is already in the leader's log: the decision is only compared."""
        at = now if origin is Origin.CLIENT else None
        return self.state.check_append(h.pid, h.generation, h.base_sequence, h.count, at)

    def _assign_fetched_epochs(
        self, hist: EpochHistory, epochs: list[tuple[int, int]], start: int, end: int
    ) -> None:
        for epoch, first in epochs:
            latest = hist.latest_epoch
            if (latest is None or epoch > latest) and max(first, start) < end:
                if first < start and start != self.log.log_start_offset:
                    raise CorruptRecord(
                        f"leader says epoch {epoch} starts at {first}, inside "
                        f"this replica's log (ends {start}); reconcile again"
                    )
                # An empty log restarted at the leader's log start (restart_at) holds
                # the epoch from there on: nothing below it is here.
                hist.assign(epoch, max(first, start))

    def prepare_replicated_epochs(
        self, data: memoryview | bytes, epochs: list[tuple[int, int]]
    ) -> bytes | None:
        """The leader-epoch file's bytes once ``append_replicated(data, epochs)`` has
        assigned the entries it brings, changing nothing; None when it brings none (or would
        refuse them). A follower's fetch round writes these files for many partitions at
        once, off the loop (``EpochHistory.prewrite``), before it appends (issue 24)."""
        if self._role is Role.LEADER or not epochs:
            return None
        latest = self.epochs.latest_epoch
        if latest is not None and all(e <= latest for e, _ in epochs):
            return None  # the common case: nothing new
        start = end = self.log.next_offset
        try:
            for h, _ in iter_batches(data):
                if h.base_offset + h.count > end:
                    if h.base_offset != end:
                        return None
                    end = h.base_offset + h.count
            copy = EpochHistory(self.epochs.entries, self.epochs.truncations)
            self._assign_fetched_epochs(copy, epochs, start, end)
        except (CorruptRecord, ValueError):
            return None
        return copy.encode() if copy.entries != self.epochs.entries else None

    def append_replicated(self, data: memoryview, epochs: list[tuple[int, int]]) -> int:
        """As a follower: append the batches the leader sent (already in its log, offsets
        set) and replay them into the producer state, as recovery would. ``epochs`` are
        the leader's (epoch, start) entries for them. Returns the number of batches
        appended. A mismatch between the leader's log and these rules is counted
        (``follower_rule_mismatches``), never refused: the leader's log is the truth."""
        if self._role is Role.LEADER:
            raise NotLeader(f"{self.topic}-{self.partition}: leads; it appends no fetched batch")
        start = self.log.next_offset
        batches = []
        end = start
        for h, pos in iter_batches(data):  # checks every checksum
            if h.base_offset + h.count <= end:
                continue  # already here (a fetch starts at the batch holding the offset)
            if h.base_offset != end:
                raise CorruptRecord(f"fetched batch at offset {h.base_offset}, expected {end}")
            batches.append((h, pos))
            end = h.base_offset + h.count
        if not batches:
            return 0
        # Saved before the batches: a crash in between only refetches. A failed save (or a
        # refused entry) leaves nothing in memory, so the refetch assigns and saves it again.
        with self.epochs.change():
            self._assign_fetched_epochs(self.epochs, epochs, start, end)
        now = self.clock_ms()
        state = self.state
        active = self.log.segments[-1]
        for h, pos in batches:
            try:
                self.log.append(bytes(data[pos : pos + h.size]), h.count, h.timestamp_ms)
            except (ServerUnavailable, OSError):
                # A failed write (a full disk) after the entries above were saved: an entry
                # starting past the log end would make this replica unable to lead at its
                # end (the next epoch must start at or after the last one's start). The
                # file is trimmed the same way at the next open.
                self.epochs.trim_past(self.log.next_offset)
                raise
            if h.is_control:
                state.apply_fence(h.pid, h.generation, now)
                continue
            if state.tracks(h.pid):
                d = self._decide(h, Origin.REPLICATION, now)
                if d.outcome is not Outcome.APPEND:
                    # The leader's log is the truth; a mismatch means the tables drifted
                    # (expiry at other times, an evicted PID). Counted and shown.
                    self.follower_rule_mismatches += 1
            state.apply_append(h.pid, h.generation, h.base_sequence, h.count, h.base_offset, now)
        self.batches_appended += len(batches)
        if self.log.segments[-1] is not active:
            self.rolled()
        return len(batches)

    def rolled(self) -> None:
        """The active segment rolled (an append here or a follower's fetched batch)."""
        if self.on_roll is not None:
            self.on_roll()

    def fence(
        self,
        pid: int,
        generation: int,
        create_if_absent: bool,
        on_durable: Callable[[bool, int, int], Any],
        *,
        leased_since_ms: int = 0,
    ) -> tuple[FenceOutcome, asyncio.Future[Any]]:
        """Apply FENCE. The future resolves with ``on_durable(existed, durable_highwater,
        fence_offset)`` once the fence (or, when nothing is written, everything appended so
        far) is durable, so the durable highwater it reports is final. A PID with no state
        here gets a fresh entry only when nothing dropped here could have been its state
        (``ProducerStateTable.may_create`` with ``leased_since_ms``); otherwise the answer is
        ABSENT (existed false, nothing written) and the coordinator answers UNKNOWN_PID.
        Raises NotEnoughReplicas, with nothing changed, when the in-sync set is below the
        topic's minimum: the answer waits for the high watermark, which cannot move then."""
        if self.isr is not None and not self.isr.accepts_writes():
            raise self._not_enough_replicas("fence")
        now = self.clock_ms()
        outcome = self.state.check_fence(pid, generation, create_if_absent)
        existed = self.state.get(pid) is not None
        if (
            outcome is FenceOutcome.APPEND
            and not existed
            and not self.state.may_create(leased_since_ms)
        ):
            outcome = FenceOutcome.ABSENT
        if outcome is FenceOutcome.FENCED:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return outcome, fut
        fence_offset = -1
        if outcome is FenceOutcome.APPEND:
            buf = bytearray(encode_control_batch(pid=pid, generation=generation, timestamp_ms=now))
            set_base_offset(buf, self.log.next_offset)
            fence_offset = self.log.append(buf, 1, now)
            self.state.apply_fence(pid, generation, now)
            self.batches_appended += 1
            self._wake_data_waiters()
        else:
            self.state.touch(pid, now)

        def result() -> Any:
            e = self.state.get(pid)
            return on_durable(existed, e.durable_highwater if e is not None else -1, fence_offset)

        return outcome, self._when_durable(self.log.next_offset, result)

    def _not_enough_replicas(self, what: str) -> NotEnoughReplicas:
        assert self.isr is not None
        self.min_insync_refusals += 1
        n = self.min_insync_refusals
        detail = (
            f"partition {self.topic}-{self.partition}: {len(self.isr.isr)} in-sync "
            f"replica(s) {sorted(self.isr.isr)}, the topic needs {self.min_insync} "
            f"(min_insync_replicas); nothing written, retry"
        )
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th ... refusal: no log flood
            log.warning("%s refused (%d refusals so far): %s", what, n, detail)
        return NotEnoughReplicas(detail)

    def set_min_insync(self, n: int) -> None:
        """The topic's effective ``min_insync_replicas`` (at open and on every change of
        its record): applies at once, to the running leadership too."""
        self.min_insync = n
        if self.isr is not None:
            self.isr.min_insync = n
            self.in_sync_changed()

    def in_sync_changed(self) -> None:
        """The in-sync set (or the minimum) changed: move the high watermark if it may.
        When too few replicas count for it to move, the acks waiting for it are answered
        NOT_ENOUGH_REPLICAS (retriable) rather than held: held, they would hold back every
        later answer on their connections for as long as the set stays small. Their
        batches stay in the log, uncommitted: a resend is answered SEQUENCE_UNKNOWN until
        the set grows back and the high watermark passes them, then DUPLICATE; it is never
        appended twice."""
        self.advance_high_watermark()
        isr = self.isr
        if self.role is not Role.LEADER or isr is None or isr.commits() or not self._waiters:
            return
        log.warning(
            "%s-%d: in-sync replicas %s, below min_insync_replicas %d; %d waiting ack(s) "
            "answered NOT_ENOUGH_REPLICAS (their batches stay in the log, uncommitted)",
            self.topic,
            self.partition,
            sorted(isr.counted()),
            self.min_insync,
            len(self._waiters),
        )
        self.fail_waiters(
            f"partition {self.topic}-{self.partition}: the in-sync set fell below "
            f"min_insync_replicas {self.min_insync} before this write was committed; retry "
            "(a resend is answered SEQUENCE_UNKNOWN until it is committed, then DUPLICATE)",
            NotEnoughReplicas,
            acks_only=True,
        )

    def _when_durable(self, end_offset: int, make: Callable[[], Any]) -> asyncio.Future[Any]:
        """A future resolved with ``make()`` once the high watermark reaches
        ``end_offset``: once the batch is fsynced here and held by the in-sync replicas."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if end_offset <= self.high_watermark:
            fut.set_result(make())
        else:
            self._waiters.append((end_offset, fut, make))
            if end_offset > self.flushed_end:
                self.flusher.note_write(self)
        return fut

    def wait_durable(self, end_offset: int) -> asyncio.Future[Any]:
        return self._when_durable(end_offset, lambda: None)

    def wait_flushed(self, end_offset: int) -> asyncio.Future[Any]:
        """Resolved once everything below ``end_offset`` is fsynced on this server."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if end_offset <= self.flushed_end:
            fut.set_result(None)
        else:
            self._flush_waiters.append((end_offset, fut, lambda: None))
            self.flusher.note_write(self)
        return fut

    # -- durability (called by the flusher) ------------------------------------------------
    def prepare_flush(self) -> tuple[FlushMark, list[int]]:
        # The truncation count is the log's generation: a flush's end means nothing for a
        # log cut back since it began (flush_done).
        return (self.epochs.truncations, self.log.next_offset), self.log.take_dirty()

    def flush_done(self, mark: FlushMark) -> None:
        self.log.release_retired()  # the flush that held them has ended
        generation, end_offset = mark
        if generation != self.epochs.truncations:
            # The fsync covered the log as it was before a cut; the batches now above the
            # cut may have been written after it took its fds. truncate_to already set
            # what is durable and asked for a flush of the log as it is now.
            return
        self.mark_durable(end_offset)

    def mark_durable(self, end_offset: int) -> None:
        if end_offset <= self.flushed_end:
            return
        self.flushed_end = end_offset
        _resolve(self._flush_waiters, end_offset)
        self.advance_high_watermark()

    def advance_high_watermark(self) -> None:
        """Raise the high watermark as far as the replicas allow (leader, or one replica)."""
        if not self.replicated:
            self.set_high_watermark(self.flushed_end)
        elif self.role is Role.LEADER and self.isr is not None and self.isr.commits():
            self.set_high_watermark(self.isr.high_watermark(self.flushed_end))

    def set_high_watermark(self, hw: int) -> None:
        """Committed up to ``hw`` (never lowered here): durable highwaters, acks, and the
        followers waiting to learn it."""
        hw = min(hw, self.log.next_offset)
        if hw <= self.high_watermark:
            return
        self.high_watermark = hw
        self.state.mark_durable(hw)
        _resolve(self._waiters, hw)
        if self.replicated:
            self._wake_data_waiters()

    def fail_waiters(
        self,
        why: str,
        exc_type: type[PidleaseError] = ServerUnavailable,
        *,
        acks_only: bool = False,
        above: int = -1,
    ) -> None:
        """The one way waiters are failed: every ack waiter (and, unless ``acks_only``,
        every flush waiter) for an end above ``above`` gets ``exc_type(why)``. Used at a
        role change (the role setter: acks, all), above a cut (``truncate_to``: both,
        above the new end), when the in-sync set is too small, and at close. Each error
        used is retriable: the producer resends, and the rules answer the resend."""
        for q in (self._waiters,) if acks_only else (self._waiters, self._flush_waiters):
            _fail_above(q, above, exc_type(why))
        self._wake_data_waiters()

    # -- reads -----------------------------------------------------------------------------
    def fetch(self, offset: int, max_bytes: int) -> list[bytes]:
        """For readers: committed batches only. OffsetOutOfRange below the log start."""
        self.check_offset(offset)
        return self.log.read(offset, max_bytes, self.high_watermark)

    def check_offset(self, offset: int) -> None:
        start = self.log.log_start_offset
        if offset < start:
            raise OffsetOutOfRange(
                f"offset {offset} of {self.topic}-{self.partition} was deleted by retention; "
                f"the log holds {start} to {self.high_watermark}",
                earliest=start,
                latest=self.high_watermark,
            )

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """Where a reader starting at ``timestamp_ms`` begins: the first committed batch
        at or after that time (the high watermark when none: the reader waits for new
        records); ``LATEST_TIMESTAMP`` is the high watermark, ``EARLIEST_TIMESTAMP`` the
        log start. Only committed batches count, as only they are served."""
        hw = self.high_watermark
        if timestamp_ms == LATEST_TIMESTAMP:
            return hw
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return self.log.log_start_offset
        return self.log.offset_for_timestamp(timestamp_ms, hw)

    def producer_state(self, pid: int) -> tuple[bool, int, int, int]:
        """(found, generation, durable_highwater, last_use_ms); refreshes last use."""
        e = self.state.touch(pid, self.clock_ms())
        if e is None:
            return False, 0, -1, 0
        return True, e.generation, e.durable_highwater, e.last_use_ms

    async def capture(self, chunk_pids: int = 20_000) -> PartitionImage:
        """Producer state for a snapshot, exported ``chunk_pids`` at a time with the loop
        free in between (see snapshot.py for why replay over it is exact). The caller
        fsyncs up to ``covered_to`` before writing it: a snapshot holds only durable state.
        The image carries the truncation count from before the first row: rows read
        across a cut then disagree with the count on disk, and recovery never trusts them
        (a count read at the end would vouch for rows from before the cut)."""
        truncations = self.epochs.truncations
        replay_from = self.log.next_offset
        pids = self.state.pids()
        rows = []
        durable: dict[int, int] = {}
        # A million new row objects would set off full GC passes over the whole heap
        # (hundreds of ms each, stalling the loop); rows hold no cycles, so pause the GC.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            for i in range(0, len(pids), chunk_pids):
                if i:
                    await asyncio.sleep(0)
                chunk = pids[i : i + chunk_pids]
                rows.extend(self.state.export_rows(chunk))
                durable.update(self.state.durable_lags(chunk))
        finally:
            if gc_was_on:
                gc.enable()
        # Read after the rows: a PID dropped before its row was exported is covered here.
        return PartitionImage(
            replay_from,
            self.log.next_offset,
            rows,
            truncations,
            self.state.dropped_last_use_max_ms,
            durable,
        )

    # -- replication: roles ---------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self._role

    @role.setter
    def role(self, role: Role) -> None:
        """Every role change goes through here. Leaving the leadership of a replicated
        partition fails the acks still waiting (``fail_waiters``: NOT_LEADER, retriable):
        only the leader's high watermark could answer them, and its batches may be cut."""
        if not isinstance(role, Role):
            raise TypeError(f"a replica role is a Role, not {role!r}")
        was = self._role
        self._role = role
        # Producer state is dropped (expiry, eviction) only where the partition leads.
        self.state.drops_allowed = role is Role.LEADER
        if was is Role.LEADER and role is not Role.LEADER and self.replicated:
            # The producers resend to the new leader, which answers DUPLICATE or appends.
            self.fail_waiters(
                f"no longer the leader of {self.topic}-{self.partition}", NotLeader, acks_only=True
            )

    def become_leader(
        self,
        me: int,
        epoch: int,
        replicas: list[int],
        isr: list[int],
        isr_clock_ms: Callable[[], int] | None = None,
    ) -> None:
        """Lead ``epoch`` (won in ZooKeeper): record where it starts before any write. As a
        follower this replica saw no renewals (they touch the leader's state only), so
        every PID it holds starts a full expiry period now: a live producer renews within
        it, a dead one expires one period later than it would have. Raises OSError when the
        epoch cannot be saved (a full disk): nothing changes, the role is not taken, and the
        next reconcile retries. ``isr_clock_ms``: the clock the in-sync bookkeeping reads
        (fetch and lag times), a monotonic one (``ReplicaManager`` passes its own: a wall
        clock stepped by NTP would make every follower look lagging at once); without it,
        ``clock_ms`` (tests that drive one hand-moved clock)."""
        with self.epochs.change():
            self.epochs.assign(epoch, self.log.next_offset)
        if self.role is not Role.LEADER:
            self.state.raise_last_use(self.clock_ms())
        # The epoch first: a batch routed at the previous epoch is refused from here on.
        self.leader_epoch = epoch
        self.role = Role.LEADER
        self.leader_id = me
        self.isr_clock_ms = isr_clock_ms or self.clock_ms
        self.isr = InSyncReplicas(
            me, replicas, isr, self.isr_clock_ms(), self.min_insync, self.log.next_offset
        )
        self.advance_high_watermark()

    def become_follower(self, leader: int, epoch: int, address: str) -> None:
        self.leader_epoch = epoch
        self.role = Role.FOLLOWER  # fails the acks waiting, when it led
        self.leader_id = leader
        self.leader_address = address
        self.isr = None

    # -- replication: the leader's side ----------------------------------------------------
    def record_replica_fetch(self, replica: int, offset: int) -> None:
        assert self.isr is not None
        self.isr.record_fetch(replica, offset, self.log.next_offset, self.isr_clock_ms())
        self.advance_high_watermark()

    def wait_for_data(self) -> asyncio.Future[None]:
        """Resolved at the next append, high watermark change or role change (a follower's
        fetch waits here when it has everything). One future shared by every waiter, so
        fetches that time out leave nothing behind."""
        fut = self._data_waiter
        if fut is None or fut.done():
            fut = self._data_waiter = asyncio.get_running_loop().create_future()
        return fut

    def _wake_data_waiters(self) -> None:
        fut, self._data_waiter = self._data_waiter, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def replica_read(self, offset: int, max_bytes: int) -> list[bytes]:
        """For followers: everything written, durable here or not (they fsync it
        themselves; what counts as acked is decided by the high watermark)."""
        self.check_offset(offset)
        return self.log.read(offset, max_bytes, self.log.next_offset)

    # -- replication: the follower's side --------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Drop the log from the batch holding ``offset`` on (a suffix that diverges from
        the leader's), then rebuild the producer state. Returns the new log end. Safe with
        a flush running: its completion no longer counts (``flush_done``), and whoever
        waits for an offset above the new end is told it is gone."""
        if offset >= self.log.next_offset:
            return self.log.next_offset
        if offset < self.high_watermark:
            log.error(
                "%s-%d: cutting the log to %d, below the high watermark %d",
                self.topic,
                self.partition,
                offset,
                self.high_watermark,
            )
        # Lowered before anything below can fail: whatever path leaves this method, neither
        # end may stay above the log's end (batches fetched later would count as fsynced).
        end = self.log.cut_point(offset)
        self.flushed_end = min(self.flushed_end, end)
        self.high_watermark = min(self.high_watermark, end)
        # Count the cut first: a crash right after must not trust older snapshot rows. A
        # failed save (full disk) leaves the history and the log as they were (only the
        # ends above are lowered; a flush raises them again): the next session retries.
        kept = rebuild.rows_kept_through_cut(self.state, self.log, end)
        with self.epochs.change():
            self.epochs.truncations += 1
            self.epochs.truncate_to(offset)
        try:
            end = self.log.truncate_to(offset)
        except OSError as exc:
            # A failed ftruncate or fsync leaves the file in a state nobody knows (and a
            # later fsync may "succeed" over dropped pages): the policy of a failed fsync,
            # crash and recover from what is on disk. Never carry on with this log.
            self.flusher.fatal(exc)
            raise
        self.epochs.truncate_to(end)
        # Offsets above the cut will hold other batches, if any: a wait for one must not
        # be answered by their flush or high watermark (acks, snapshots).
        self.fail_waiters(
            f"{self.topic}-{self.partition}: the log was cut back to {end}", above=end
        )
        if self._flush_waiters:
            self.flusher.note_write(self)  # the flush they counted on may be stale now
        self.rebuild_state(kept)
        return end

    def rows_below_log_start(self) -> bytes:
        """For a follower starting over at this leader's log start: the rows of the PIDs
        with no batch left in the log, and what was dropped here (``rebuild``)."""
        return rebuild.rows_below_log_start(
            self.state,
            self.topic,
            self.partition,
            self.log.log_start_offset,
            self.epochs.truncations,
            self.clock_ms(),
        )

    def restart_at(self, offset: int, leader: PartitionImage | None = None) -> None:
        """The leader's log starts at ``offset``, beyond this replica's end: drop the whole
        log and go on from there (retention there deleted what this replica lacks), with
        the state ``rebuild.start_over`` persisted first: this replica's and the leader's
        (``rows_below_log_start``: its rows as of its log start) rows.
        Raises OSError, with nothing changed, when that state cannot be saved."""
        log.warning(
            "%s-%d: log ends at %d, below the leader's log start %d: starting over there "
            "with the leader's producer state of %d PID(s) that wrote below it",
            self.topic,
            self.partition,
            self.log.next_offset,
            offset,
            len(leader.rows) if leader is not None else 0,
        )
        rows = rebuild.start_over(
            self.state,
            self.epochs,
            self.log,
            (self.topic, self.partition),
            offset,
            leader,
            self.clock_ms(),
        )
        self.start_over_file = True
        try:
            self.log.restart_at(offset)
        except OSError as exc:
            self.flusher.fatal(exc)  # as in truncate_to: never go on with a log in doubt
            raise
        self.flushed_end = offset
        self.high_watermark = offset
        self.state.load_rows(rows)  # all durable: below the leader's log start
        _resolve(self._flush_waiters, offset)
        _resolve(self._waiters, offset)

    def rebuild_state(self, kept: list[Row] | None = None) -> None:
        """Producer state from the log (and ``kept``, the rows of PIDs whose batches
        retention deleted); batches above the high watermark pending."""
        rebuild.rebuild_from_log(self.state, self.log, self.high_watermark, self.clock_ms(), kept)

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "role": self.role.value,
            "log_start_offset": self.log.log_start_offset,
            "log_end_offset": self.log.next_offset,
            "size_bytes": self.log.size_bytes,
            "high_watermark": self.high_watermark,
            "tracked_pids": len(self.state),
        }
        if self.replicated:
            out.update(
                leader_epoch=self.leader_epoch,
                leader=self.leader_id,
                flushed_end=self.flushed_end,
                epochs=self.epochs.entries[-5:],
                truncations=self.epochs.truncations,
                follower_rule_mismatches=self.follower_rule_mismatches,
                min_insync=self.min_insync,
                min_insync_refusals=self.min_insync_refusals,
            )
            if self.isr is not None:
                out.update(
                    isr=sorted(self.isr.isr), followers=self.isr.lag_report(self.isr_clock_ms())
                )
        return out

    def close(self) -> None:
        self.fail_waiters("server shutting down")
        self.log.close()


def _resolve(waiters: deque[Waiter], end_offset: int) -> None:
    while waiters and waiters[0][0] <= end_offset:
        _, fut, make = waiters.popleft()
        if not fut.done():
            fut.set_result(make())


def _fail_above(waiters: deque[Waiter], end_offset: int, exc: Exception) -> None:
    keep = [w for w in waiters if w[0] <= end_offset]
    for w_end, fut, _ in waiters:
        if w_end > end_offset and not fut.done():
            fut.set_exception(exc)
    waiters.clear()
    waiters.extend(keep)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
