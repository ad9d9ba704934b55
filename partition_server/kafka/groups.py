"""The group coordinator of a partition server (docs/kafka.md, "Consumer groups"):
FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
ListGroups, DescribeGroups, DeleteGroups and OffsetDelete, over the rules of
``group_state.py``.

**Placement.** A group lives in partition ``crc32(group id) mod GROUPS_PARTITIONS`` of
the internal topic ``__pidlease_groups`` (replication factor min(3, servers with a Kafka
listener), on those, dedup off, no retention by time or size: compaction cuts it),
created by the first server a FindCoordinator reaches while it does not exist. The
coordinator of a group is the leader of its partition; any other server
answers NOT_COORDINATOR, and FindCoordinator (any server) names the leader from
ZooKeeper's view.

**Durability.** What must survive a coordinator's death goes to that partition as Kafka
records, through the server's one produce path (``produce.py``, as a Kafka producer's
batch: ``kafka_partition.kafka_produce`` with acks=all), and is answered only once the
high watermark covers it (committed on the in-sync replicas): every committed offset, a
group's generation and protocol once its leader's assignment is stored, the group going
empty, and tombstones (a null value) for DeleteGroups and OffsetDelete. The in-memory
state is changed only by records that became durable, in log order, so it is always a
replay of the log's committed prefix.

**Loading.** A server that finds itself leader of a group partition (at a new leader
epoch) starts loading it at the next tick (not at the first request for one of its
groups: ListGroups covers them all), answers COORDINATOR_LOAD_IN_PROGRESS while it waits
for its log end to be committed and replays the partition from its start; members are
not restored (they get UNKNOWN_MEMBER_ID and rejoin, so no member of the old coordinator
can commit), offsets and generations are. A partition that stops leading here drops its
groups and answers every waiting request NOT_COORDINATOR.

**Retention.** Once a second each loaded partition's groups are checked against
``group_offsets_retention_ms`` (Kafka's ``offsets.retention.minutes``; the rule is
``Group.expired``): what expires gets tombstones through the same durable path, so a
reload after a coordinator's death does not bring it back.

**Compaction.** Every server reads the committed records of the group log partitions it
hosts (leader or follower) into a ``group_log.LogTable``. The leader writes a checkpoint
(the table's image, then a marker naming where it starts) once ``group_log_compact_bytes``
were written since the last one and everything in the log is committed and read; every
replica, on reading a committed marker, sets ``Partition.release_below`` and its retention
deletes the segments below the checkpoint (docs/kafka.md, "Compaction of the group log").

Not done: static membership, group ACLs beyond SASL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from partition_server.kafka import codec as C
from partition_server.kafka import group_state as G
from partition_server.kafka.group_log import (
    CHECKPOINT_KEY,
    CompactPolicy,
    LogTable,
    apply_record,
    checkpoint_batches,
    checkpoint_size,
    group_key,
    group_value,
    offset_key,
    offset_value,
)
from partition_server.kafka.group_state import Events, Group, JoinAnswer, State, SyncAnswer
from partition_server.kafka.topics import CreateError, create, plan
from partition_server.kafka_partition import KafkaProduceResult, kafka_produce
from partition_server.log_manager import LogManager
from partition_server.partition import Partition
from partition_server.produce import NotRouted, Route
from partition_server.registry import Registry
from partition_server.settings import ServerSettings
from pidlease.wire import kafka_batch as K
from pidlease.wire import kafka_errors as E
from pidlease.wire.protocol import iter_batches, iter_records

log = logging.getLogger("partition_server.kafka.groups")

GROUPS_TOPIC = "__pidlease_groups"
GROUPS_PARTITIONS = 8
TICK_S = 0.1
LOAD_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 15.0
LOAD_READ_BYTES = 1 << 20
READ_PER_TICK_BYTES = 4 << 20
EXPIRE_CHECK_MS = 1_000

GROUP_APIS = frozenset(
    [
        C.OFFSET_COMMIT,
        C.OFFSET_FETCH,
        C.FIND_COORDINATOR,
        C.JOIN_GROUP,
        C.HEARTBEAT,
        C.LEAVE_GROUP,
        C.SYNC_GROUP,
        C.DESCRIBE_GROUPS,
        C.LIST_GROUPS,
        C.DELETE_GROUPS,
        C.OFFSET_DELETE,
    ]
)

Reply = bytes | asyncio.Future[bytes]


def partition_of(group_id: str) -> int:
    return zlib.crc32(group_id.encode("utf-8")) % GROUPS_PARTITIONS


@dataclass
class Slot:
    """A partition of the group log led here, at ``epoch``."""

    index: int
    epoch: int
    part: Partition
    groups: dict[str, Group] = field(default_factory=dict)
    loaded: bool = False
    task: asyncio.Task[None] | None = None
    expire_at_ms: int = 0  # the next offset retention pass
    expiring: set[str] = field(default_factory=set)  # groups whose tombstones are pending
    checkpointing: bool = False  # a checkpoint written and not yet durable


@dataclass
class LogReader:
    """A group log partition hosted here (led or followed) as read so far: the table of
    its committed records up to ``at`` (``group_log.LogTable``), from which this replica
    learns where the newest checkpoint starts (its segments below may go) and the leader
    takes the image of its next checkpoint."""

    part: Partition
    table: LogTable
    at: int
    bytes_since: int = 0  # bytes read since the newest checkpoint marker
    image_bytes: int = 0  # the newest checkpoint's size (keys and values)


class GroupCoordinator:
    def __init__(
        self,
        settings: ServerSettings,
        log_manager: LogManager,
        registry: Registry,
        refresh: Callable[[], Awaitable[None]],
        *,
        stopping: Callable[[], bool],
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.s = settings
        self.log_manager = log_manager
        self.registry = registry
        self._refresh = refresh
        self._stopping = stopping
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self.slots: dict[int, Slot] = {}
        # Requests waiting on a group: (slot, group, member) -> answer callback.
        self._joins: dict[tuple[int, str, str], Callable[[JoinAnswer], None]] = {}
        self._syncs: dict[tuple[int, str, str], Callable[[SyncAnswer], None]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._creating: asyncio.Task[None] | None = None
        self.loads = 0
        self.readers: dict[int, LogReader] = {}
        self.compact = CompactPolicy(settings.group_log_compact_bytes)
        self.checkpoints = 0  # written by this server as leader

    # -- entry -----------------------------------------------------------------------------
    def handle(self, h: C.Header, req: Any, client_host: str = "") -> Reply:
        self._ensure_ticker()
        k = h.api_key
        if k == C.FIND_COORDINATOR:
            return self.find_coordinator(h, req)
        if k == C.JOIN_GROUP:
            return self.join_group(h, req, client_host)
        if k == C.SYNC_GROUP:
            return self.sync_group(h, req)
        if k == C.HEARTBEAT:
            return self.heartbeat(h, req)
        if k == C.LEAVE_GROUP:
            return self.leave_group(h, req)
        if k == C.OFFSET_COMMIT:
            return self.offset_commit(h, req)
        if k == C.OFFSET_FETCH:
            return self.offset_fetch(h, req)
        if k == C.LIST_GROUPS:
            return self.list_groups(h, req)
        if k == C.DESCRIBE_GROUPS:
            return self.describe_groups(h, req)
        if k == C.DELETE_GROUPS:
            return self.delete_groups(h, req)
        if k == C.OFFSET_DELETE:
            return self.offset_delete(h, req)
        raise AssertionError(f"api {k} is not a group API")

    def start(self) -> None:
        """Start the timers (the listener starts): followers of the group log read it
        too, to learn where its checkpoints let it be cut."""
        self._ensure_ticker()

    def _ensure_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick_loop())

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for idx in list(self.slots):
            self._drop(idx, "server stopping")

    # -- placement -------------------------------------------------------------------------
    def _locate(self, group_id: str) -> tuple[Slot | None, int]:
        """The loaded slot of this group, or the error code to answer."""
        if self._stopping():
            return None, E.NOT_COORDINATOR
        return self._slot(partition_of(group_id))

    def _slot(self, idx: int) -> tuple[Slot | None, int]:
        """The loaded slot of group log partition ``idx`` (its load started when it is
        led here and not loaded yet), or the error code to answer."""
        r = self.log_manager.produce.route(GROUPS_TOPIC, idx)
        slot = self.slots.get(idx)
        if isinstance(r, NotRouted):
            if slot is not None:
                self._drop(idx, "no longer leads")
            a = self.registry.assignment
            ps = a.partitions.get((GROUPS_TOPIC, idx))
            if ps is None:
                return None, E.COORDINATOR_NOT_AVAILABLE
            if ps.leader == self.s.server_id:
                return None, E.COORDINATOR_LOAD_IN_PROGRESS  # becoming leader
            return None, E.NOT_COORDINATOR
        if slot is not None and (slot.epoch != r.epoch or slot.part is not r.part):
            self._drop(idx, f"leader epoch {slot.epoch} -> {r.epoch}")
            slot = None
        if slot is None:
            slot = Slot(idx, r.epoch, r.part)
            self.slots[idx] = slot
            slot.task = asyncio.get_running_loop().create_task(self._load(slot))
        if not slot.loaded:
            return None, E.COORDINATOR_LOAD_IN_PROGRESS
        return slot, E.NONE

    async def _load(self, slot: Slot) -> None:
        """Replay the group log's partition once its end is committed."""
        part = slot.part
        t0 = time.perf_counter()
        try:
            end = part.log.next_offset
            await asyncio.wait_for(asyncio.shield(part.wait_durable(end)), LOAD_TIMEOUT_S)
            groups: dict[str, Group] = {}
            at = part.log.log_start_offset
            records = 0
            while at < end:
                chunks = part.fetch(at, LOAD_READ_BYTES)
                if not chunks:
                    break
                for c in chunks:
                    for bh, pos in iter_batches(c):
                        if not bh.is_control:
                            for rec in iter_records(c, bh, pos):
                                apply_record(groups, rec.key, rec.value)
                                records += 1
                        at = bh.base_offset + bh.count
                await asyncio.sleep(0)  # a long log does not stall the server
        except Exception as exc:  # noqa: BLE001 - not loaded: dropped, the next request retries
            log.warning("group log partition %d: load failed: %s", slot.index, exc)
            if self.slots.get(slot.index) is slot:
                del self.slots[slot.index]
            return
        if self.slots.get(slot.index) is not slot:
            return
        for g in groups.values():
            g.initial_delay_ms = G.INITIAL_REBALANCE_DELAY_MS
        slot.groups = groups
        slot.loaded = True
        self.loads += 1
        log.info(
            "group log partition %d (epoch %d): loaded %d groups from %d records in %.3fs",
            slot.index,
            slot.epoch,
            len(groups),
            records,
            time.perf_counter() - t0,
        )

    def _drop(self, idx: int, why: str) -> None:
        slot = self.slots.pop(idx, None)
        if slot is None:
            return
        if slot.task is not None and not slot.task.done():
            slot.task.cancel()
        for g in slot.groups.values():
            g.state = State.DEAD
        for key in [k for k in self._joins if k[0] == idx]:
            self._joins.pop(key)(JoinAnswer(key[2], E.NOT_COORDINATOR))
        for key in [k for k in self._syncs if k[0] == idx]:
            self._syncs.pop(key)(SyncAnswer(key[2], E.NOT_COORDINATOR))
        log.info("group log partition %d: dropped (%s)", idx, why)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick()
            except Exception:
                log.exception("group coordinator tick failed")

    def tick(self) -> None:
        now = self._clock()
        self._read_group_logs()
        self._load_led()
        for idx, slot in list(self.slots.items()):
            r = self.log_manager.produce.route(GROUPS_TOPIC, idx)
            if self._stopping() or isinstance(r, NotRouted) or r.epoch != slot.epoch:
                self._drop(idx, "no longer leads at that epoch")
                continue
            if not slot.loaded:
                continue
            for g in list(slot.groups.values()):
                self._deliver(slot, g, g.tick(now))
            if now >= slot.expire_at_ms:
                slot.expire_at_ms = now + EXPIRE_CHECK_MS
                self._expire(slot, now)
            self._maybe_checkpoint(slot)

    def _load_led(self) -> None:
        """Start loading every group log partition this server has come to lead, as a
        Kafka broker does at its election, not at the first request for one of its groups:
        a ListGroups (which covers all of them) answered COORDINATOR_LOAD_IN_PROGRESS
        whenever one had not been asked for yet, and kafkajs's ``admin.listGroups`` does
        not retry that."""
        if self._stopping():
            return
        for idx in range(GROUPS_PARTITIONS):
            if idx in self.slots:
                continue
            if isinstance(self.log_manager.produce.route(GROUPS_TOPIC, idx), Route):
                self._slot(idx)

    # -- compaction of the group log -------------------------------------------------------
    def _read_group_logs(self) -> None:
        """Read what became committed in each group log partition hosted here (leader or
        follower, at most ``READ_PER_TICK_BYTES`` each) into its table; a checkpoint marker
        read sets ``release_below``, the offset below which retention may delete this
        replica's segments (the committed log is the same on every replica, so each cuts
        where the leader does, deciding alone)."""
        hosted = {}
        for idx in range(GROUPS_PARTITIONS):
            part = self.log_manager.partitions.get((GROUPS_TOPIC, idx))
            if part is not None and part.hosted:
                hosted[idx] = part
        for idx in [i for i in self.readers if i not in hosted]:
            del self.readers[idx]
        for idx, part in hosted.items():
            rd = self.readers.get(idx)
            plog = part.log
            if (
                rd is None
                or rd.part is not part
                or rd.at < plog.log_start_offset
                or rd.at > plog.next_offset
            ):
                rd = self.readers[idx] = LogReader(part, LogTable(), plog.log_start_offset)
            before = rd.table.checkpoint_from
            try:
                self._read_into(rd)
            except Exception as exc:  # noqa: BLE001 - read again from the start next tick
                log.warning("group log partition %d: read failed: %s", idx, exc)
                del self.readers[idx]
                continue
            cp = rd.table.checkpoint_from
            if cp > before and cp > part.release_below:
                part.release_below = cp
                self.log_manager.retention_soon()

    def _read_into(self, rd: LogReader) -> None:
        part = rd.part
        budget = READ_PER_TICK_BYTES
        while rd.at < part.high_watermark and budget > 0:
            chunks = part.fetch(rd.at, min(LOAD_READ_BYTES, budget))
            if not chunks:
                return
            for c in chunks:
                budget -= len(c)
                for bh, pos in iter_batches(c):
                    if bh.base_offset + bh.count <= rd.at:
                        continue
                    if not bh.is_control:
                        for rec in iter_records(c, bh, pos):
                            marker = rec.key == CHECKPOINT_KEY
                            before = rd.table.checkpoint_from
                            rd.table.apply(rec.key, rec.value)
                            if marker and rd.table.checkpoint_from != before:
                                rd.bytes_since = 0
                                rd.image_bytes = checkpoint_size(rec.value)
                            else:
                                rd.bytes_since += len(rec.key or b"") + len(rec.value or b"")
                    rd.at = bh.base_offset + bh.count

    def _maybe_checkpoint(self, slot: Slot) -> None:
        """Write a checkpoint (the table's image, then its marker) when the policy says
        so and every record of the log is committed and read (so the image is the log's
        state as of where it lands: nothing between)."""
        rd = self.readers.get(slot.index)
        part = slot.part
        if (
            slot.checkpointing
            or rd is None
            or rd.part is not part
            or rd.at != part.log.next_offset
            or not self.compact.due(rd.bytes_since, rd.image_bytes)
        ):
            return
        start = part.log.next_offset
        image = rd.table.image()
        batches = checkpoint_batches(image, start, self.s.batch_bytes_max // 2)
        futures = []
        for records in batches:
            f = self._write(slot, records, apply=False)
            futures.append(f)
            if f.done() and f.result() != E.NONE:
                return  # not written: no marker, the next tick tries again
        slot.checkpointing = True
        self.checkpoints += 1
        log.info(
            "group log partition %d: checkpoint of %d groups, %d offsets at offset %d "
            "(%d bytes written since the last)",
            slot.index,
            len(rd.table.groups),
            rd.table.offsets(),
            start,
            rd.bytes_since,
        )

        def done(_f: asyncio.Future[int]) -> None:
            slot.checkpointing = False

        futures[-1].add_done_callback(done)

    def _expire(self, slot: Slot, now: int) -> None:
        """Offset retention (``Group.expired``): tombstones for the offsets it lets go, and
        for the group itself when it goes whole (DEAD meanwhile, as DeleteGroups: a
        JoinGroup in between is told to retry; back to EMPTY if the write fails)."""
        retention = self.s.group_offsets_retention_ms
        for g in list(slot.groups.values()):
            if g.group_id in slot.expiring:
                continue
            gone, whole = g.expired(now, retention)
            if not gone and not whole:
                continue
            gid = g.group_id
            records: list[tuple[bytes, bytes | None]] = [
                (offset_key(gid, t, p), None) for t, p in gone
            ]
            if whole:
                records.append((group_key(gid), None))
                g.state = State.DEAD
            log.info(
                "group %r: %d committed offsets expired (%s)",
                gid,
                len(gone),
                "the group goes with them" if whole else "topics no member subscribes to",
            )
            slot.expiring.add(gid)
            written = self._write(slot, records)
            if whole:
                written.add_done_callback(functools.partial(_undead, g))
            written.add_done_callback(functools.partial(_expired, slot.expiring, gid))

    # -- delivering what the rules decided ---------------------------------------------------
    def _deliver(self, slot: Slot, g: Group, ev: Events) -> None:
        for j in ev.joins:
            cb = self._joins.pop((slot.index, g.group_id, j.member_id), None)
            if cb is not None:
                cb(j)
        for s in ev.syncs:
            cb2 = self._syncs.pop((slot.index, g.group_id, s.member_id), None)
            if cb2 is not None:
                cb2(s)
        if ev.emptied:
            self._write(slot, [(group_key(g.group_id), group_value(g, g.empty_since_ms))])

    def _write(
        self, slot: Slot, records: list[tuple[bytes, bytes | None]], *, apply: bool = True
    ) -> asyncio.Future[int]:
        """Append ``records`` to the slot's partition through the produce path, acks=all;
        the future resolves with a group error code once committed (NONE) or refused.
        Applied to the slot's groups once committed, in log order (unless ``apply`` is
        False: a checkpoint restates what the groups already hold)."""
        loop = asyncio.get_running_loop()
        out: asyncio.Future[int] = loop.create_future()
        r = self.log_manager.produce.route(GROUPS_TOPIC, slot.index)
        if (
            not isinstance(r, Route)
            or r.epoch != slot.epoch
            or self.slots.get(slot.index) is not slot
        ):
            out.set_result(E.NOT_COORDINATOR)
            return out
        batch = K.encode_kafka_batch(records, base_timestamp_ms=self._clock())
        res = kafka_produce(
            self.log_manager.produce,
            GROUPS_TOPIC,
            slot.index,
            batch,
            acks=-1,
            batch_bytes_max=self.s.batch_bytes_max,
        )
        if isinstance(res, NotRouted):
            out.set_result(E.NOT_COORDINATOR)
            return out

        def done(result: KafkaProduceResult) -> None:
            code = _group_code(result.error_code)
            if apply and code == E.NONE and self.slots.get(slot.index) is slot:
                for k, v in records:
                    apply_record(slot.groups, k, v)
            if code != E.NONE:
                log.warning(
                    "group log partition %d: write refused (%d: %s)",
                    slot.index,
                    result.error_code,
                    result.error_message,
                )
            if not out.done():
                out.set_result(code)

        if isinstance(res, KafkaProduceResult):
            done(res)
        else:
            res.add_done_callback(lambda f: done(f.result()))
        return out

    async def _written(self, fut: asyncio.Future[int]) -> int:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), WRITE_TIMEOUT_S)
        except TimeoutError:
            return E.COORDINATOR_NOT_AVAILABLE

    # -- FindCoordinator -------------------------------------------------------------------
    def find_coordinator(self, h: C.Header, req: Any) -> Reply:
        v = h.api_version
        keys = list(req.coordinator_keys) if v >= 4 else [req.key]
        key_type = int(getattr(req, "key_type", 0))

        def one(key: str) -> dict[str, Any]:
            if key_type != 0:
                return {
                    "key": key,
                    "error_code": E.COORDINATOR_NOT_AVAILABLE,
                    "error_message": "transactions are not supported",
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                }
            a = self.registry.assignment
            if GROUPS_TOPIC not in a.topics:
                self._create_groups_topic()
                return _no_coordinator(key, "the group log is being created")
            ps = a.partitions.get((GROUPS_TOPIC, partition_of(key)))
            info = a.servers.get(ps.leader) if ps is not None else None
            if info is None or info.kafka_port <= 0:
                return _no_coordinator(key, "the group's log partition has no live leader")
            return {
                "key": key,
                "error_code": E.NONE,
                "node_id": info.id,
                "host": info.host,
                "port": info.kafka_port,
            }

        answers = [one(k) for k in keys]
        if v >= 4:
            values: dict[str, Any] = {"coordinators": answers}
        else:
            values = dict(answers[0])
        return C.respond(C.FIND_COORDINATOR, v, h.correlation_id, values)

    def _create_groups_topic(self) -> None:
        if self._creating is not None and not self._creating.done():
            return

        async def run() -> None:
            # Servers with a Kafka listener only: their coordinators read the log and cut it
            # at its checkpoints (a server without one would keep every commit).
            servers = self.registry.assignment.servers
            live = sorted(i for i, info in servers.items() if info.kafka_port > 0)
            if not live:
                return
            spec, states = plan(GROUPS_TOPIC, GROUPS_PARTITIONS, min(3, len(live)), live, {})
            spec = dataclasses.replace(
                spec,
                dedup="off",
                retention_ms=-1,
                retention_bytes=-1,
                segment_bytes=self.s.group_log_segment_bytes,
            )
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, create, self.registry.zk, spec, states)
                log.info(
                    "created the group log %s (%d partitions, R=%d)",
                    GROUPS_TOPIC,
                    spec.partitions,
                    spec.replication_factor,
                )
            except CreateError as exc:
                log.info("group log not created here: %s", exc)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper trouble: the next request retries
                log.warning("creating the group log failed: %s", exc)
            await self._refresh()

        self._creating = asyncio.get_running_loop().create_task(run())

    # -- JoinGroup -------------------------------------------------------------------------
    def join_group(self, h: C.Header, req: Any, client_host: str) -> Reply:
        v, corr = h.api_version, h.correlation_id

        def answer(j: JoinAnswer) -> bytes:
            return C.respond(
                C.JOIN_GROUP,
                v,
                corr,
                {
                    "error_code": j.error_code,
                    "generation_id": j.generation,
                    "protocol_type": j.protocol_type,
                    "protocol_name": j.protocol_name or ("" if v < 7 else None),
                    "leader": j.leader,
                    "member_id": j.member_id,
                    "members": [
                        {"member_id": m, "group_instance_id": i, "metadata": meta}
                        for m, i, meta in j.members
                    ],
                },
            )

        gid = req.group_id
        if G.group_id_problem(gid):
            return answer(JoinAnswer(req.member_id, E.INVALID_GROUP_ID))
        slot, code = self._locate(gid)
        if slot is None:
            return answer(JoinAnswer(req.member_id, code))
        g = slot.groups.get(gid)
        if g is None:
            g = slot.groups[gid] = Group(gid)
        session_ms = int(req.session_timeout.total_seconds() * 1000)
        rebalance = getattr(req, "rebalance_timeout", None)
        rebalance_ms = int(rebalance.total_seconds() * 1000) if rebalance is not None else 0
        now, ev = g.join(
            self._clock(),
            member_id=req.member_id,
            instance_id=getattr(req, "group_instance_id", None),
            client_id=h.client_id or "",
            client_host=client_host,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocol_type=req.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
            require_known_member_id=v >= 4,
        )
        if now is not None:
            self._deliver(slot, g, ev)
            return answer(now)
        # The member id the rules gave this join (a new member's is generated).
        member_id = req.member_id or next(reversed(g.members))
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        key = (slot.index, gid, member_id)
        old = self._joins.pop(key, None)
        if old is not None:
            old(JoinAnswer(member_id, E.REBALANCE_IN_PROGRESS))

        def resolve(j: JoinAnswer) -> None:
            if not fut.done():
                fut.set_result(answer(j))

        self._joins[key] = resolve
        self._deliver(slot, g, ev)
        return fut

    # -- SyncGroup -------------------------------------------------------------------------
    def sync_group(self, h: C.Header, req: Any) -> Reply:
        v, corr = h.api_version, h.correlation_id

        def answer(s: SyncAnswer) -> bytes:
            return C.respond(
                C.SYNC_GROUP,
                v,
                corr,
                {
                    "error_code": s.error_code,
                    "protocol_type": s.protocol_type,
                    "protocol_name": s.protocol_name,
                    "assignment": s.assignment,
                },
            )

        gid, mid = req.group_id, req.member_id
        slot, code = self._locate(gid)
        if slot is None:
            return answer(SyncAnswer(mid, code))
        g = slot.groups.get(gid)
        if g is None:
            return answer(SyncAnswer(mid, E.UNKNOWN_MEMBER_ID))
        now, plan_ = g.sync(
            self._clock(),
            member_id=mid,
            generation=req.generation_id,
            protocol_type=getattr(req, "protocol_type", None),
            protocol_name=getattr(req, "protocol_name", None),
            assignments={a.member_id: bytes(a.assignment) for a in req.assignments},
        )
        if now is not None:
            return answer(now)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def resolve(s: SyncAnswer) -> None:
            if not fut.done():
                fut.set_result(answer(s))

        self._syncs[(slot.index, gid, mid)] = resolve
        if plan_ is not None:
            generation = g.generation
            written = self._write(slot, [(group_key(gid), group_value(g, self._clock()))])

            def stored(f: asyncio.Future[int]) -> None:
                c = f.result()
                ev = (
                    g.complete_sync(generation, plan_)
                    if c == E.NONE
                    else g.fail_sync(generation, c)
                )
                self._deliver(slot, g, ev)

            written.add_done_callback(stored)
        return fut

    # -- Heartbeat, LeaveGroup -------------------------------------------------------------
    def heartbeat(self, h: C.Header, req: Any) -> Reply:
        slot, code = self._locate(req.group_id)
        if code == E.COORDINATOR_LOAD_IN_PROGRESS:
            # As Kafka's broker: a heartbeat while the group's partition loads is answered
            # NONE ("blindly"); the member learns it is unknown at the next one, once
            # loaded. aiokafka raises COORDINATOR_LOAD_IN_PROGRESS from a heartbeat to the
            # application (its getmany()), which stopped its consumers at a failover.
            code = E.NONE
        if slot is not None:
            g = slot.groups.get(req.group_id)
            code = (
                E.UNKNOWN_MEMBER_ID
                if g is None
                else g.heartbeat(self._clock(), req.member_id, req.generation_id)
            )
        return C.respond(C.HEARTBEAT, h.api_version, h.correlation_id, {"error_code": code})

    def leave_group(self, h: C.Header, req: Any) -> Reply:
        v = h.api_version
        if v >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in req.members]
        else:
            leaving = [(req.member_id, None)]
        slot, code = self._locate(req.group_id)
        results = []
        for mid, iid in leaving:
            c = code
            if slot is not None:
                g = slot.groups.get(req.group_id)
                if g is None:
                    c = E.UNKNOWN_MEMBER_ID
                else:
                    c, ev = g.leave(self._clock(), mid)
                    self._deliver(slot, g, ev)
            results.append({"member_id": mid, "group_instance_id": iid, "error_code": c})
        top = code if slot is None else (results[0]["error_code"] if v < 3 else E.NONE)
        return C.respond(
            C.LEAVE_GROUP, v, h.correlation_id, {"error_code": top, "members": results}
        )

    # -- OffsetCommit ----------------------------------------------------------------------
    def offset_commit(self, h: C.Header, req: Any) -> Reply:
        v, corr = h.api_version, h.correlation_id
        gid = req.group_id
        generation = int(getattr(req, "generation_id_or_member_epoch", -1))
        mid = getattr(req, "member_id", "") or ""

        def answer(codes: dict[tuple[str, int], int]) -> bytes:
            return C.respond(
                C.OFFSET_COMMIT,
                v,
                corr,
                {
                    "topics": [
                        {
                            "name": t.name,
                            "partitions": [
                                {
                                    "partition_index": p.partition_index,
                                    "error_code": codes[(t.name, p.partition_index)],
                                }
                                for p in t.partitions
                            ],
                        }
                        for t in req.topics
                    ]
                },
            )

        wanted = [(t.name, p) for t in req.topics for p in t.partitions]

        def all_(code: int) -> bytes:
            return answer({(name, p.partition_index): code for name, p in wanted})

        if G.group_id_problem(gid):
            return all_(E.INVALID_GROUP_ID)
        slot, code = self._locate(gid)
        if slot is None:
            return all_(code)
        g = slot.groups.get(gid)
        if g is None:
            if generation >= 0 or mid:
                return all_(E.UNKNOWN_MEMBER_ID if mid else E.ILLEGAL_GENERATION)
            g = slot.groups[gid] = Group(gid)
            g.empty_since_ms = self._clock()  # its retention runs from its first commit
        code = g.commit_check(mid, generation)
        if code != E.NONE:
            return all_(code)
        now = self._clock()
        g.touch(now, mid)
        codes: dict[tuple[str, int], int] = {}
        records: list[tuple[bytes, bytes | None]] = []
        a = self.registry.assignment
        for name, p in wanted:
            i = p.partition_index
            meta = p.committed_metadata or ""
            if (name, i) not in a.partitions:
                codes[(name, i)] = E.UNKNOWN_TOPIC_OR_PARTITION
            elif len(meta.encode()) > G.METADATA_MAX_BYTES:
                codes[(name, i)] = E.OFFSET_METADATA_TOO_LARGE
            else:
                codes[(name, i)] = E.NONE
                entry = G.OffsetEntry(
                    int(p.committed_offset),
                    int(getattr(p, "committed_leader_epoch", -1)),
                    meta,
                    now,
                )
                records.append((offset_key(gid, name, i), offset_value(entry)))
        if not records:
            return answer(codes)
        written = self._write(slot, records)
        g.writes_in_flight += 1
        written.add_done_callback(functools.partial(_commit_done, g))

        async def run() -> bytes:
            c = await self._written(written)
            for key, got in codes.items():
                if got == E.NONE:
                    codes[key] = c
            return answer(codes)

        return asyncio.ensure_future(run())

    # -- OffsetFetch -----------------------------------------------------------------------
    def offset_fetch(self, h: C.Header, req: Any) -> Reply:
        v, corr = h.api_version, h.correlation_id
        if v >= 8:
            asked = [
                (
                    x.group_id,
                    None
                    if x.topics is None
                    else [(t.name, list(t.partition_indexes)) for t in x.topics],
                )
                for x in req.groups
            ]
        else:
            asked = [
                (
                    req.group_id,
                    None
                    if req.topics is None
                    else [(t.name, list(t.partition_indexes)) for t in req.topics],
                )
            ]
        results = [
            self._fetch_group(gid, topics, per_partition_error=v < 2) for gid, topics in asked
        ]
        if v >= 8:
            values: dict[str, Any] = {
                "groups": [
                    {"group_id": gid, "topics": topics, "error_code": code}
                    for (gid, _), (topics, code) in zip(asked, results, strict=True)
                ]
            }
        else:
            topics, code = results[0]
            values = {"topics": topics, "error_code": code}
        return C.respond(C.OFFSET_FETCH, v, corr, values)

    def _fetch_group(
        self,
        gid: str,
        topics: list[tuple[str, list[int]]] | None,
        *,
        per_partition_error: bool,
    ) -> tuple[list[dict[str, Any]], int]:
        slot, code = self._locate(gid)
        if slot is None:
            if per_partition_error and topics is not None:
                return [
                    {
                        "name": name,
                        "partitions": [_fetched(i, None, code) for i in parts],
                    }
                    for name, parts in topics
                ], code
            return [], code
        g = slot.groups.get(gid)
        offsets = g.offsets if g is not None else {}
        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for name, i in sorted(offsets):
                by_topic.setdefault(name, []).append(i)
            topics = sorted(by_topic.items())
        out = [
            {
                "name": name,
                "partitions": [_fetched(i, offsets.get((name, i)), E.NONE) for i in parts],
            }
            for name, parts in topics
        ]
        return out, E.NONE

    # -- ListGroups, DescribeGroups --------------------------------------------------------
    def list_groups(self, h: C.Header, req: Any) -> Reply:
        states = {s.lower() for s in getattr(req, "states_filter", ()) or ()}
        groups = []
        code = E.NONE
        for idx in range(GROUPS_PARTITIONS):
            slot, got = self._slot(idx)
            if got == E.COORDINATOR_LOAD_IN_PROGRESS:
                code = got
            if slot is None:
                continue
            for g in slot.groups.values():
                if g.state is State.DEAD:
                    continue
                if states and g.state.value.lower() not in states:
                    continue
                groups.append(
                    {
                        "group_id": g.group_id,
                        "protocol_type": g.protocol_type or "",
                        "group_state": g.state.value,
                    }
                )
        return C.respond(
            C.LIST_GROUPS, h.api_version, h.correlation_id, {"error_code": code, "groups": groups}
        )

    def describe_groups(self, h: C.Header, req: Any) -> Reply:
        out = []
        for gid in req.groups:
            slot, code = self._locate(gid)
            g = slot.groups.get(gid) if slot is not None else None
            if slot is None or g is None:
                out.append(
                    {
                        "error_code": code,
                        "group_id": gid,
                        "group_state": State.DEAD.value if code == E.NONE else "",
                        "protocol_type": "",
                        "protocol_data": "",
                        "members": [],
                        "authorized_operations": -2147483648,
                    }
                )
                continue
            members = [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata_for(g.protocol_name or "")
                    if g.state is not State.PREPARING_REBALANCE
                    else b"",
                    "member_assignment": m.assignment,
                }
                for m in g.members.values()
            ]
            out.append(
                {
                    "error_code": E.NONE,
                    "group_id": gid,
                    "group_state": g.state.value,
                    "protocol_type": g.protocol_type or "",
                    "protocol_data": g.protocol_name or "",
                    "members": members,
                    "authorized_operations": -2147483648,
                }
            )
        return C.respond(C.DESCRIBE_GROUPS, h.api_version, h.correlation_id, {"groups": out})

    # -- DeleteGroups, OffsetDelete --------------------------------------------------------
    def delete_groups(self, h: C.Header, req: Any) -> Reply:
        v, corr = h.api_version, h.correlation_id
        results: list[tuple[str, int | asyncio.Future[int]]] = []
        for gid in req.groups_names:
            slot, code = self._locate(gid)
            if slot is None:
                results.append((gid, code))
                continue
            g = slot.groups.get(gid)
            if g is None or g.state is State.DEAD:
                results.append((gid, E.GROUP_ID_NOT_FOUND))
                continue
            if g.state is not State.EMPTY or g.pending:
                results.append((gid, E.NON_EMPTY_GROUP))
                continue
            records: list[tuple[bytes, bytes | None]] = [
                (offset_key(gid, t, p), None) for t, p in sorted(g.offsets)
            ]
            records.append((group_key(gid), None))
            # Dead at once (a JoinGroup meanwhile is told to retry), gone when durable;
            # back to Empty when the tombstones could not be written.
            g.state = State.DEAD
            written = self._write(slot, records)
            written.add_done_callback(functools.partial(_undead, g))
            results.append((gid, written))

        async def run() -> bytes:
            out = []
            for gid, r in results:
                code = r if isinstance(r, int) else await self._written(r)
                out.append({"group_id": gid, "error_code": code})
            return C.respond(C.DELETE_GROUPS, v, corr, {"results": out})

        return asyncio.ensure_future(run())

    def offset_delete(self, h: C.Header, req: Any) -> Reply:
        v, corr = h.api_version, h.correlation_id
        gid = req.group_id
        wanted = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]

        def answer(top: int, codes: dict[tuple[str, int], int]) -> bytes:
            topics: dict[str, list[dict[str, Any]]] = {}
            for name, i in wanted:
                topics.setdefault(name, []).append(
                    {"partition_index": i, "error_code": codes.get((name, i), E.NONE)}
                )
            return C.respond(
                C.OFFSET_DELETE,
                v,
                corr,
                {
                    "error_code": top,
                    "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()],
                },
            )

        slot, code = self._locate(gid)
        if slot is None:
            return answer(code, {})
        g = slot.groups.get(gid)
        if g is None or g.state is State.DEAD:
            return answer(E.GROUP_ID_NOT_FOUND, {})
        subscribed = g.subscribed_topics() if g.members else set()
        codes: dict[tuple[str, int], int] = {}
        records: list[tuple[bytes, bytes | None]] = []
        for name, i in wanted:
            if subscribed is None or name in subscribed:
                codes[(name, i)] = E.GROUP_SUBSCRIBED_TO_TOPIC
            elif (name, i) in g.offsets:
                records.append((offset_key(gid, name, i), None))
        if not records:
            return answer(E.NONE, codes)
        written = self._write(slot, records)

        async def run() -> bytes:
            c = await self._written(written)
            if c != E.NONE:
                return answer(c, {})
            return answer(E.NONE, codes)

        return asyncio.ensure_future(run())


def _commit_done(g: Group, _f: asyncio.Future[int]) -> None:
    g.writes_in_flight -= 1


def _expired(expiring: set[str], gid: str, _f: asyncio.Future[int]) -> None:
    expiring.discard(gid)


def _undead(g: Group, f: asyncio.Future[int]) -> None:
    if f.result() != E.NONE and g.state is State.DEAD:
        g.state = State.EMPTY


def _no_coordinator(key: str, why: str) -> dict[str, Any]:
    return {
        "key": key,
        "error_code": E.COORDINATOR_NOT_AVAILABLE,
        "error_message": why,
        "node_id": -1,
        "host": "",
        "port": -1,
    }


def _fetched(i: int, e: G.OffsetEntry | None, code: int) -> dict[str, Any]:
    return {
        "partition_index": i,
        "committed_offset": e.offset if e is not None else -1,
        "committed_leader_epoch": e.leader_epoch if e is not None else -1,
        "metadata": e.metadata if e is not None else "",
        "error_code": code,
    }


def _group_code(produce_code: int) -> int:
    """Kafka's mapping of a failed group-log append to the group APIs' codes."""
    if produce_code == K.NONE:
        return E.NONE
    if produce_code in (K.NOT_LEADER_OR_FOLLOWER, K.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if produce_code == K.MESSAGE_TOO_LARGE:
        return E.INVALID_COMMIT_OFFSET_SIZE
    return E.COORDINATOR_NOT_AVAILABLE
