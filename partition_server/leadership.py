"""Leadership changes of replicated partitions, written to ZooKeeper by compare-and-set on
the PartitionState znode's version, so two servers can never both win an epoch.

There is no controller: the replicas of a partition change its state themselves, under
three rules (each re-checked against the znode just read, then written with its version):

- ``elect``: the leader's ``/servers/<id>`` is gone and this server is in the in-sync set:
  it becomes leader at epoch + 1, and the dead leader leaves the set (it may have lost an
  unflushed tail; it rejoins once caught up). Only an in-sync replica may: no unclean
  election, so a new leader holds every acked record.
- ``step_in``: this server just started and ZooKeeper still names it leader (it restarted
  faster than its session expired). It does not resume as if nothing happened: if another
  in-sync replica is live it hands leadership to it (epoch + 1) and leaves the set, to
  rejoin as a follower once caught up; if it is the only in-sync replica it takes a new
  epoch itself, so nothing it writes now can be mistaken for what it wrote before.
- ``set_isr``: the leader shrinks or grows the in-sync set; refused when the znode no
  longer names it leader at its epoch (a deposed leader cannot shrink the set to itself
  and ack alone).

Every function is blocking (kazoo): run them in an executor. Each returns the state it
wrote, or None when the znode said otherwise (someone else moved first; the caller re-reads
the assignment and follows whatever won).
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.exceptions import BadVersionError, NoNodeError

from pidlease.wire.cluster import SERVERS, PartitionState, partition_path, server_path

log = logging.getLogger("partition_server.leadership")


def _read(zk: Any, topic: str, partition: int) -> tuple[PartitionState, int] | None:
    try:
        raw, stat = zk.get(partition_path(topic, partition))
    except NoNodeError:
        return None
    return PartitionState.from_bytes(raw), stat.version


def _write(
    zk: Any, topic: str, partition: int, new: PartitionState, version: int, why: str
) -> PartitionState | None:
    try:
        zk.set(partition_path(topic, partition), new.to_bytes(), version=version)
    except (BadVersionError, NoNodeError):
        log.info("%s-%d: %s lost a race (the state changed); re-reading", topic, partition, why)
        return None
    log.info(
        "%s-%d: %s -> leader %d epoch %d isr %s",
        topic,
        partition,
        why,
        new.leader,
        new.leader_epoch,
        new.isr,
    )
    return new


def elect(zk: Any, topic: str, partition: int, me: int) -> PartitionState | None:
    got = _read(zk, topic, partition)
    if got is None:
        return None
    ps, version = got
    if ps.leader == me or me not in ps.isr or me not in ps.replicas:
        return None
    if zk.exists(server_path(ps.leader)) is not None:
        return None  # the leader is back (or never left)
    isr = [r for r in ps.isr if r != ps.leader]
    new = PartitionState(replicas=ps.replicas, leader=me, leader_epoch=ps.leader_epoch + 1, isr=isr)
    return _write(zk, topic, partition, new, version, f"election after leader {ps.leader} left")


def step_in(zk: Any, topic: str, partition: int, me: int, epoch: int) -> PartitionState | None:
    got = _read(zk, topic, partition)
    if got is None:
        return None
    ps, version = got
    if ps.leader != me or ps.leader_epoch != epoch:
        return None  # already moved on
    live = {int(c) for c in zk.get_children(SERVERS) if c.isdigit()}
    others = [r for r in ps.isr if r != me and r in live]
    if others:
        new = PartitionState(
            replicas=ps.replicas,
            leader=others[0],
            leader_epoch=ps.leader_epoch + 1,
            isr=[r for r in ps.isr if r != me],
        )
        why = f"server {me} restarted; hands leadership to in-sync server {others[0]}"
    else:
        new = PartitionState(
            replicas=ps.replicas,
            leader=me,
            leader_epoch=ps.leader_epoch + 1,
            isr=ps.isr if me in ps.isr else [*ps.isr, me],
        )
        why = f"server {me} restarted as the only live in-sync replica; new epoch"
    return _write(zk, topic, partition, new, version, why)


def set_isr(
    zk: Any, topic: str, partition: int, me: int, epoch: int, isr: list[int]
) -> PartitionState | None:
    got = _read(zk, topic, partition)
    if got is None:
        return None
    ps, version = got
    if ps.leader != me or ps.leader_epoch != epoch:
        return None
    if sorted(ps.isr) == sorted(isr):
        return ps
    new = PartitionState(
        replicas=ps.replicas, leader=me, leader_epoch=epoch, isr=sorted(isr, key=ps.replicas.index)
    )
    return _write(zk, topic, partition, new, version, f"in-sync set {ps.isr} -> {new.isr}")


class ZkLease:
    """How long this server can be sure its ZooKeeper session is alive, and so that nobody
    has been elected in place of the partitions it leads (an election needs its
    ``/servers/<id>`` gone, which only the session's end removes). Pure: the caller feeds it
    monotonic milliseconds (docs/replication.md, Step-down: the timing argument).

    A request sent at ``t`` and answered, within the same session, proves the ZooKeeper
    server heard from the session at or after ``t``; the server expires a session no sooner
    than ``session_timeout_ms`` after it last heard from it. So the session lives at least
    until ``t + session_timeout_ms`` on the server's clock, and the lease ends
    ``margin_ms`` before that on ours (the margin covers clock rate and this process being
    late to notice). A confirmation from another session than the one the lease holds does
    not extend it: a new session says nothing about the gap between the two.
    """

    def __init__(self, session_timeout_ms: float, margin_ms: float) -> None:
        if not 0 <= margin_ms < session_timeout_ms:
            raise ValueError("the step-down margin must be below the session timeout")
        self.session_timeout_ms = session_timeout_ms
        self.margin_ms = margin_ms
        self.session: int | None = None
        self.valid_until_ms = float("-inf")

    def set_session_timeout(self, session_timeout_ms: float) -> None:
        """The timeout the ZooKeeper server granted (it may differ from the one asked)."""
        self.session_timeout_ms = session_timeout_ms
        self.margin_ms = min(self.margin_ms, session_timeout_ms / 2)

    def confirm(self, session: int, sent_at_ms: float) -> bool:
        """A request sent at ``sent_at_ms`` in ``session`` was answered and found the
        session alive. Returns True when this begins a new session's lease."""
        new = session != self.session
        if new:
            self.session = session
            self.valid_until_ms = float("-inf")
        until = sent_at_ms + self.session_timeout_ms - self.margin_ms
        self.valid_until_ms = max(self.valid_until_ms, until)
        return new

    def lost(self) -> None:
        """The session ended (expired or closed): nothing is certain any more."""
        self.session = None
        self.valid_until_ms = float("-inf")

    def valid(self, now_ms: float) -> bool:
        return now_ms < self.valid_until_ms

    def held_by(self, session: int | None, now_ms: float) -> bool:
        """Valid, and still the lease of ``session`` (the one a leadership was taken in)."""
        return session is not None and session == self.session and self.valid(now_ms)

    def remaining_ms(self, now_ms: float) -> float:
        return self.valid_until_ms - now_ms
