"""Leadership handed over by a live leader (issue 27): a controlled shutdown (SIGTERM hands
every partition this server leads to an in-sync follower before the server leaves) and the
preferred-leader election (a leader that is not its partition's preferred replica, the
first of the assignment, hands leadership back to it once it is in sync).

Each handover is a compare-and-set of the PartitionState znode, many of them in a few
ZooKeeper transactions (``leadership.write_many``, change kind ``hand_over``), under the
same rules as an election (``leadership.py``): the new leader is a live member of the in-sync set as
ZooKeeper holds it (so it holds every acked record), the epoch goes up by one, and the
write is refused unless the znode still names this server leader at the epoch it leads.
The leader steps down locally *before* the write (waiting acks are answered NOT_LEADER,
retriable; new produces and replica fetches are refused), so it never acks anything at
its old epoch once the new leader may be writing at the next. The SDK retries NOT_LEADER
after a leader lookup: the producer sees a pause, not an error.

- Controlled shutdown (``leave_isr=True``): the leaving server also leaves the in-sync
  set, as a dead leader does in an election; it is going, and a member that does not
  fetch would hold the new leader's high watermark back until it is found departed.
- Preferred leader (``leave_isr=False``): the old leader stays in the set; as the new
  leader's follower it reconciles its log first (EPOCH_END cuts any unacked tail it wrote
  at the old epoch) and holds the high watermark back only until its first fetch, as any
  follower at the start of a leadership. It still holds everything acked, so it may still
  be elected.

The pure rules: ``preferred_due`` here; ``successor``, ``handed_over`` and
``plan_hand_over`` in ``leadership.py`` with the other leadership rules (the bulk writes
plan by them). Here: the single ZooKeeper write (``hand_over``, blocking: run it in an
executor) and the two drivers the replica manager calls (``controlled_shutdown``,
``PreferredLeader``). docs/replication.md, "Handing leadership over".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Executor
from typing import Any, Protocol

from kazoo.exceptions import BadVersionError, NoNodeError

from partition_server import leadership
from partition_server.leadership import plan_hand_over, successor
from partition_server.partition import Partition, Role
from partition_server.registry import Registry
from pidlease import errors
from pidlease.wire.cluster import SERVERS, PartitionState, partition_path

log = logging.getLogger("partition_server.handoff")

Key = tuple[str, int]


class ReplicaManager(Protocol):
    """What a handover uses of ``replication.ReplicaManager`` (which imports this module,
    so it is named here by its shape, not imported)."""

    s: Any
    me: int
    registry: Registry
    partitions: dict[Key, Partition]
    zk_executor: Executor | None
    leaving: bool
    mono_ms: Callable[[], float]
    _busy: set[Key]

    def _zk(
        self,
        key: Key,
        op: Callable[..., PartitionState | None],
        *args: Any,
        after: Callable[[PartitionState | None], None] | None = None,
    ) -> None: ...

    def _zk_bulk(
        self,
        change: leadership.Change,
        after: Callable[[PartitionState | None], None] | None = None,
    ) -> None: ...

    async def _write_many(
        self, zk: Any, changes: list[leadership.Change]
    ) -> dict[Key, PartitionState | None]: ...

    def resign(self, key: Key, part: Partition) -> None: ...


def preferred_due(
    ps: PartitionState,
    me: int,
    live: Collection[int],
    *,
    high_watermark: int,
    follower_end: int,
    led_for_ms: float,
    settle_ms: float,
) -> bool:
    """Whether the leader ``me`` should hand leadership to its partition's preferred
    replica now: it is not the preferred replica itself, the preferred one is live, in the
    in-sync set as ZooKeeper holds it, and has fetched up to this leader's high watermark
    (everything acked: the move cuts at most the unacked tail, whose producers resend it
    after NOT_LEADER; requiring the whole log would never be met under steady load), and
    this leadership is at least ``settle_ms`` old (a leader that just took over first
    serves what is waiting)."""
    pref = ps.replicas[0]
    return (
        ps.leader == me
        and pref != me
        and pref in live
        and pref in ps.isr
        and follower_end >= high_watermark
        and led_for_ms >= settle_ms
    )


def hand_over(
    zk: Any,
    topic: str,
    partition: int,
    me: int,
    epoch: int,
    *,
    to: int | None = None,
    ends: Mapping[int, int] | None = None,
    leave_isr: bool,
) -> PartitionState | None:
    """Blocking. Hand leadership of ``topic``-``partition`` from ``me`` (leading at
    ``epoch``) to ``to`` or the best live in-sync replica, by compare-and-set. Returns the
    state written, or None when the znode no longer names ``me`` at ``epoch``, nobody may
    take over, or the write lost a race."""
    path = partition_path(topic, partition)
    try:
        raw, stat = zk.get(path)
    except NoNodeError:
        return None
    ps = PartitionState.from_bytes(raw)
    if ps.leader != me or ps.leader_epoch != epoch:
        return None
    live = {int(c) for c in zk.get_children(SERVERS) if c.isdigit()}
    planned = plan_hand_over(ps, me, epoch, live, ends, to, leave_isr=leave_isr)
    if planned is None:
        return None
    new, why = planned
    try:
        zk.set(path, new.to_bytes(), version=stat.version)
    except (BadVersionError, NoNodeError):
        log.info("%s-%d: handover to %d lost a race; re-reading", topic, partition, new.leader)
        return None
    log.info("%s-%d: %s -> epoch %d isr %s", topic, partition, why, new.leader_epoch, new.isr)
    return new


async def controlled_shutdown(rm: ReplicaManager, timeout_s: float) -> dict[str, int]:
    """SIGTERM's first step: hand every replicated partition this server leads to an
    in-sync follower, all at once, retrying a lost race until ``timeout_s``. From the
    start no leadership is taken any more (``rm.leaving``). Returns counts: handed over,
    and kept (nobody in sync and live to take it: it goes down with the server, as on a
    SIGKILL)."""
    rm.leaving = True
    zk = rm.registry.zk
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s  # the loop's clock: monotonic (virtual in tests/sim)
    handed: set[Key] = set()
    kept: set[Key] = set()  # nobody to take it: led until the server stops
    tried: set[Key] = set()
    while loop.time() < deadline:
        todo: list[tuple[Key, int, dict[int, int]]] = []
        a = rm.registry.assignment
        for key, part in list(rm.partitions.items()):
            ps = a.partitions.get(key)
            if key in handed or key in kept or ps is None or len(ps.replicas) < 2:
                continue
            if ps.leader != rm.me:
                continue
            ends = {}
            if part.isr is not None:
                ends = {r: f.end_offset for r, f in part.isr.followers.items()}
            if successor(ps, rm.me, set(a.servers), ends) is None:
                kept.add(key)  # no live in-sync follower: keep serving it to the end
                continue
            if part.role is Role.LEADER:
                rm.resign(key, part)
            todo.append((key, ps.leader_epoch, ends))
        if not todo or zk is None or not getattr(zk, "connected", True):
            break  # (ZooKeeper unreachable: nothing can be written; stop as before)
        tried |= {k for k, _, _ in todo}
        # All of them in a few ZooKeeper transactions (``leadership.write_many``, the
        # rule ``plan_hand_over`` checked against each znode's version), not a read, a
        # server list and a compare-and-set each: 1000 leaderships took 6 s one by one.
        changes = [
            leadership.Change(k[0], k[1], "hand_over", e, ends=tuple(sorted(ends.items())))
            for k, e, ends in todo
        ]
        try:
            results = await rm._write_many(zk, changes)  # noqa: SLF001 - bulk writes
        except Exception as exc:  # noqa: BLE001 - ZooKeeper trouble: maybe written; re-read
            log.warning("handing %d partition(s) over failed: %s", len(todo), errors.describe(exc))
            results = {}
        handed |= {key for key, state in results.items() if state is not None}
        if all(k in handed for k, _, _ in todo):
            continue  # one more pass finds anything left (none, usually) and ends
        await rm.registry.refresh()
        await asyncio.sleep(0.1)
    n_kept = len((tried | kept) - handed)
    log.info(
        "controlled shutdown: %d partition(s) handed over, %d kept (no live in-sync follower)",
        len(handed),
        n_kept,
    )
    return {"handed_over": len(handed), "kept": n_kept}


class PreferredLeader:
    """The preferred-leader election, checked on every maintenance tick of the replica
    manager: each partition this server leads whose preferred replica is due
    (``preferred_due``) is handed to it, the handovers of one tick written together."""

    def __init__(self, rm: ReplicaManager) -> None:
        self.rm = rm
        self.led_since: dict[Key, tuple[int, float]] = {}  # (epoch, monotonic ms)
        self.handed_total = 0

    def tick(self) -> None:
        rm = self.rm
        if rm.leaving or not getattr(rm.s, "preferred_leader_election", False):
            return
        a = rm.registry.assignment
        live = set(a.servers)
        now = rm.mono_ms()
        settle = float(getattr(rm.s, "preferred_leader_settle_ms", 0))
        led_since = self.led_since
        for key, part in list(rm.partitions.items()):
            if part.isr is None or part.role is not Role.LEADER:
                if key in led_since:
                    del led_since[key]
                continue  # (a follower: one look each tick, nothing built)
            ps = a.partitions.get(key)
            if ps is None:
                led_since.pop(key, None)
                continue
            epoch = part.leader_epoch
            since = self.led_since.get(key)
            if since is None or since[0] != epoch:
                self.led_since[key] = (epoch, now)
                continue
            if ps.leader_epoch != epoch or not ps.replicas:
                continue
            pref = ps.replicas[0]
            f = part.isr.followers.get(pref)
            if f is None or not preferred_due(
                ps,
                rm.me,
                live,
                high_watermark=part.high_watermark,
                follower_end=f.end_offset,
                led_for_ms=now - since[1],
                settle_ms=settle,
            ):
                continue
            self._hand(key, part, epoch, pref)

    def _hand(self, key: Key, part: Any, epoch: int, pref: int) -> None:
        rm = self.rm
        if key in rm._busy or rm.registry.zk is None:  # noqa: SLF001 - one write per partition
            return
        log.info("%s-%d: handing leadership to preferred replica %d", key[0], key[1], pref)
        rm.resign(key, part)
        self.handed_total += 1
        # Queued with every other leadership write of this tick and written together in
        # a few transactions (``leadership.write_many``): a server back after a restart
        # takes back hundreds of leaderships at once. When the write does not land, the
        # stepped-down leader's next reconcile finds its epoch inherited and steps in
        # (``leadership.step_in``): hands over to a live in-sync replica, or takes a new
        # epoch itself.
        rm._zk_bulk(  # noqa: SLF001 - the manager's bulk leadership writes
            leadership.Change(key[0], key[1], "hand_over", epoch, to=pref, leave_isr=False)
        )
