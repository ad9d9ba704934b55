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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError, RuntimeInconsistency

from pidlease.wire.cluster import SERVERS, PartitionState, partition_path, server_path

log = logging.getLogger("partition_server.leadership")

# The answers of a multi that failed because a znode moved (the failing write), and of its
# other writes (not applied).
_LOST_RACE = (BadVersionError, NoNodeError, RolledBackError, RuntimeInconsistency)


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


def plan_elect(ps: PartitionState, me: int, leader_live: bool) -> PartitionState | None:
    """The ``elect`` rule on the state just read: the state to write, or None (not ours)."""
    if ps.leader == me or me not in ps.isr or me not in ps.replicas:
        return None
    if leader_live:
        return None  # the leader is back (or never left)
    isr = [r for r in ps.isr if r != ps.leader]
    return PartitionState(
        replicas=ps.replicas, leader=me, leader_epoch=ps.leader_epoch + 1, isr=isr
    )


def plan_step_in(
    ps: PartitionState, me: int, epoch: int, live: set[int]
) -> tuple[PartitionState, str] | None:
    """The ``step_in`` rule on the state just read (``live``: the servers registered)."""
    if ps.leader != me or ps.leader_epoch != epoch:
        return None  # already moved on
    others = [r for r in ps.isr if r != me and r in live]
    if others:
        new = PartitionState(
            replicas=ps.replicas,
            leader=others[0],
            leader_epoch=ps.leader_epoch + 1,
            isr=[r for r in ps.isr if r != me],
        )
        return new, f"server {me} restarted; hands leadership to in-sync server {others[0]}"
    new = PartitionState(
        replicas=ps.replicas,
        leader=me,
        leader_epoch=ps.leader_epoch + 1,
        isr=ps.isr if me in ps.isr else [*ps.isr, me],
    )
    return new, f"server {me} restarted as the only live in-sync replica; new epoch"


def plan_set_isr(ps: PartitionState, me: int, epoch: int, isr: list[int]) -> PartitionState | None:
    """The ``set_isr`` rule on the state just read: the state to write (``ps`` itself when
    it already says so: nothing to write), or None (no longer our epoch, or a set naming a
    replica the partition no longer has: asked on a view from before a replica move)."""
    if ps.leader != me or ps.leader_epoch != epoch or not set(isr) <= set(ps.replicas):
        return None
    if sorted(ps.isr) == sorted(isr):
        return ps
    return PartitionState(
        replicas=ps.replicas, leader=me, leader_epoch=epoch, isr=sorted(isr, key=ps.replicas.index)
    )


def successor(
    ps: PartitionState,
    me: int,
    live: Collection[int],
    ends: Mapping[int, int] | None = None,
    to: int | None = None,
) -> int | None:
    """Who may take leadership from ``me``: a live in-sync replica other than ``me``
    (``to`` when given, and only it). Among several, the furthest fetched (``ends``, the
    leader's view of each follower's log end: the shortest catch-up for the new leader's
    followers), then the assignment's order (the preferred replica first). None: nobody
    may (the leader keeps leading, or is lost with the server)."""
    if ps.leader != me:
        return None
    ok = [r for r in ps.replicas if r != me and r in ps.isr and r in live]
    if to is not None:
        return to if to in ok else None
    if not ok:
        return None
    ends = ends or {}
    return max(ok, key=lambda r: (ends.get(r, -1), -ps.replicas.index(r)))


def handed_over(ps: PartitionState, me: int, to: int, *, leave_isr: bool) -> PartitionState:
    """The state a handover writes: ``to`` leads at the next epoch; ``me`` leaves the
    in-sync set when it is going away (``leave_isr``)."""
    isr = [r for r in ps.isr if r != me] if leave_isr else list(ps.isr)
    return PartitionState(
        replicas=list(ps.replicas), leader=to, leader_epoch=ps.leader_epoch + 1, isr=isr
    )


def plan_hand_over(
    ps: PartitionState,
    me: int,
    epoch: int,
    live: Collection[int],
    ends: Mapping[int, int] | None,
    to: int | None,
    *,
    leave_isr: bool,
) -> tuple[PartitionState, str] | None:
    """The ``hand_over`` rule (handoff.py: a controlled shutdown, a preferred-leader
    election) on the state just read: the state to write and why, or None (the znode no
    longer names ``me`` at ``epoch``, or nobody may take over)."""
    if ps.leader != me or ps.leader_epoch != epoch:
        return None
    target = successor(ps, me, live, ends, to)
    if target is None:
        return None
    why = "leaving" if leave_isr else "preferred replica"
    return (
        handed_over(ps, me, target, leave_isr=leave_isr),
        f"server {me} hands leadership to in-sync server {target} ({why})",
    )


def elect(zk: Any, topic: str, partition: int, me: int) -> PartitionState | None:
    got = _read(zk, topic, partition)
    if got is None:
        return None
    ps, version = got
    if ps.leader == me or me not in ps.isr or me not in ps.replicas:
        return None
    new = plan_elect(ps, me, zk.exists(server_path(ps.leader)) is not None)
    if new is None:
        return None
    return _write(zk, topic, partition, new, version, f"election after leader {ps.leader} left")


def step_in(zk: Any, topic: str, partition: int, me: int, epoch: int) -> PartitionState | None:
    got = _read(zk, topic, partition)
    if got is None:
        return None
    ps, version = got
    if ps.leader != me or ps.leader_epoch != epoch:
        return None  # already moved on
    live = {int(c) for c in zk.get_children(SERVERS) if c.isdigit()}
    planned = plan_step_in(ps, me, epoch, live)
    if planned is None:
        return None
    return _write(zk, topic, partition, planned[0], version, planned[1])


def set_isr(
    zk: Any, topic: str, partition: int, me: int, epoch: int, isr: list[int]
) -> PartitionState | None:
    got = _read(zk, topic, partition)
    if got is None:
        return None
    ps, version = got
    new = plan_set_isr(ps, me, epoch, isr)
    if new is None or new is ps:
        return new
    return _write(zk, topic, partition, new, version, f"in-sync set {ps.isr} -> {new.isr}")


# -- in bulk (issue 24 item 3) ---------------------------------------------------------------
MULTI_MAX = 250  # writes per ZooKeeper transaction (a few dozen KB, far below jute.maxbuffer)
READ_TIMEOUT_S = 10.0  # one pipelined read's answer (kazoo fails them on a lost connection)
BULK_ROUNDS = 4  # read-plan-commit rounds before the rest is left to the next reconcile


@dataclass(frozen=True)
class Change:
    """One leadership write asked for: ``kind`` is ``elect``, ``step_in`` (``epoch``: the
    one this server was named for), ``set_isr`` (``epoch``: the leadership's, ``isr``:
    the set wanted) or ``hand_over`` (``epoch``: the leadership's; ``to``: the replica to
    hand it to, 0 for the best live in-sync one, chosen by ``ends``, the followers' log
    ends as the leader saw them; ``leave_isr``: this server leaves the in-sync set)."""

    topic: str
    partition: int
    kind: str
    epoch: int = 0
    isr: tuple[int, ...] = ()
    to: int = 0
    ends: tuple[tuple[int, int], ...] = ()
    leave_isr: bool = True

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


def _read_many(zk: Any, keys: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
    """Each partition's (state, version), or None when its znode is gone; pipelined when
    the client can (kazoo ``get_async``), in windows (the session's heartbeat waits behind
    whatever is in flight)."""
    out: dict[tuple[str, int], Any] = {}
    get_async = getattr(zk, "get_async", None)
    window = 32 if get_async is not None else 1
    for i in range(0, len(keys), window):
        part = keys[i : i + window]
        answers: list[Any] = (
            [get_async(partition_path(t, p)) for t, p in part] if get_async is not None else []
        )
        for j, key in enumerate(part):
            try:
                raw, stat = (
                    answers[j].get(timeout=READ_TIMEOUT_S)
                    if answers
                    else zk.get(partition_path(*key))
                )
            except NoNodeError:
                out[key] = None
                continue
            out[key] = (PartitionState.from_bytes(raw), stat.version)
    return out


def _plan(
    zk: Any, c: Change, ps: PartitionState, me: int, live: dict[int, bool], servers: list[set[int]]
) -> tuple[PartitionState, str] | None:
    """The single functions' rules, with ZooKeeper's answers about servers read once per
    round (``live``: one ``exists`` per leader asked about; ``servers``: the children of
    ``/servers``, read at most once), after the states they are checked against."""
    if c.kind == "elect":
        if ps.leader == me or me not in ps.isr or me not in ps.replicas:
            return None
        if ps.leader not in live:
            live[ps.leader] = zk.exists(server_path(ps.leader)) is not None
        new = plan_elect(ps, me, live[ps.leader])
        return None if new is None else (new, f"election after leader {ps.leader} left")
    if c.kind == "step_in":
        if ps.leader != me or ps.leader_epoch != c.epoch:
            return None
        if not servers:
            servers.append({int(s) for s in zk.get_children(SERVERS) if s.isdigit()})
        return plan_step_in(ps, me, c.epoch, servers[0])
    if c.kind == "hand_over":
        if ps.leader != me or ps.leader_epoch != c.epoch:
            return None
        if not servers:
            servers.append({int(s) for s in zk.get_children(SERVERS) if s.isdigit()})
        return plan_hand_over(
            ps, me, c.epoch, servers[0], dict(c.ends), c.to or None, leave_isr=c.leave_isr
        )
    if c.kind == "set_isr":
        new = plan_set_isr(ps, me, c.epoch, list(c.isr))
        if new is None or new is ps:
            return None if new is None else (ps, "")
        return new, f"in-sync set {ps.isr} -> {new.isr}"
    raise ValueError(f"unknown leadership change {c.kind!r}")


Planned = list[tuple[Change, PartitionState, int, str]]  # (change, new state, version, why)
Results = dict[tuple[str, int], PartitionState | None]


def write_many(zk: Any, me: int, changes: list[Change], *, multi_max: int = MULTI_MAX) -> Results:
    """Many leadership writes (the partitions of a dead server, the in-sync sets it leaves)
    in a few ZooKeeper transactions instead of one compare-and-set each. Each change is
    planned by the same rule as its single function, against its znode as just read, and
    written with that read's version: a transaction (kazoo ``transaction()``, ZooKeeper
    ``multi``) of up to ``multi_max`` versioned writes commits all or nothing, so no rule
    is weaker than a single compare-and-set's. When one znode moved meanwhile (another
    survivor won it) the whole transaction fails: its changes are read and planned again
    (those lost drop out, their rule no longer holding), at most ``BULK_ROUNDS`` rounds.

    Returns, per key, the state written (or the one read, for an in-sync set already as
    asked), or None when not written: the rule said no, or the rounds ran out (the caller's
    re-read and reconcile retry). A ZooKeeper error other than a lost race raises: the
    caller treats every change as maybe written. Blocking; ``ReplicaManager`` runs the same
    two steps (:func:`read_and_plan`, :func:`commit_planned`) as two executor calls, so
    the simulation can let other servers move between a read and its commit."""
    result: Results = {}
    pending = {c.key: c for c in changes}
    for _ in range(BULK_ROUNDS):
        if not pending:
            break
        planned = read_and_plan(zk, me, list(pending.values()), result)
        pending = commit_planned(zk, planned, result, multi_max=multi_max)
    for key in pending:
        result[key] = None
    return result


def read_and_plan(
    zk: Any,
    me: int,
    changes: list[Change],
    result: Results,
    known: Callable[[tuple[str, int]], tuple[PartitionState, int] | None] | None = None,
) -> Planned:
    """Step 1 of a round: read the changes' znodes and plan each by its rule; the changes
    with nothing to write get their answer in ``result``.

    ``known`` gives a state this server already read with its znode version (the
    registry's last read, ``Assignment.known``); a change that state calls for a write of
    is planned against it, without reading the znode again. That is as safe as reading it
    now: the write is committed with that version, so a znode that moved since fails the
    transaction, and its changes are read and planned again in the next round, as after
    any lost race. Only a write is taken from a known state: an answer without one ("not
    ours", "already so") is what the znode says *now*, which a state read earlier cannot
    tell (this server's own in-sync write may have landed after that read), so those
    changes are read. A failover's elections spent most of their time re-reading the
    hundreds of znodes the registry had just read, 32 at a time."""
    live: dict[int, bool] = {}
    servers: list[set[int]] = []
    planned: Planned = []
    unknown: list[Change] = []
    for c in changes:
        got = None if known is None else known(c.key)
        plan = None if got is None else _plan(zk, c, got[0], me, live, servers)
        if got is None or plan is None or plan[0] is got[0]:
            unknown.append(c)
        else:
            planned.append((c, plan[0], got[1], plan[1]))
    reads = _read_many(zk, [c.key for c in unknown]) if unknown else {}
    for c in unknown:
        got = reads.get(c.key)
        plan = None if got is None else _plan(zk, c, got[0], me, live, servers)
        if got is None or plan is None:
            result[c.key] = None
        elif plan[0] is got[0]:
            result[c.key] = got[0]  # nothing to write
        else:
            planned.append((c, plan[0], got[1], plan[1]))
    return planned


def commit_planned(
    zk: Any, planned: Planned, result: Results, *, multi_max: int = MULTI_MAX
) -> dict[tuple[str, int], Change]:
    """Step 2: commit the plans, with the versions they were read at, in transactions of
    one kind of change each (a race lost by an election, another survivor having won it,
    fails only elections, never this server's in-sync changes of its own partitions).
    Written ones go in ``result``; returns those of a transaction that lost a race, to be
    read and planned again."""
    retry: dict[tuple[str, int], Change] = {}
    chunks = [
        same[i : i + multi_max]
        for kind in ("elect", "hand_over", "step_in", "set_isr")  # a failover's elections first
        for same in [[x for x in planned if x[0].kind == kind]]
        for i in range(0, len(same), multi_max)
    ]
    # One transaction in flight at a time. ZooKeeper answers a session's requests in order,
    # and the lease's heartbeat shares the session: with every transaction sent at once
    # (eight of 250 writes for a dead server's 1000 partitions and the in-sync sets it
    # left, P=3000), a heartbeat waited 0.8 s behind them and the survivor's lease ran
    # out in the middle of the failover; one at a time, it waits for one at most.
    for chunk in chunks:
        t = zk.transaction()
        for c, new, version, _why in chunk:
            t.set_data(partition_path(c.topic, c.partition), new.to_bytes(), version=version)
        answers = t.commit()
        failed = [a for a in answers if isinstance(a, Exception)]
        if not failed:
            for c, new, _version, why in chunk:
                log.info(
                    "%s-%d: %s -> leader %d epoch %d isr %s",
                    c.topic,
                    c.partition,
                    why,
                    new.leader,
                    new.leader_epoch,
                    new.isr,
                )
                result[c.key] = new
            continue
        if not all(isinstance(a, _LOST_RACE) for a in failed):
            raise failed[0]
        log.info(
            "a transaction of %d leadership writes lost a race (a state changed); re-reading them",
            len(chunk),
        )
        retry.update((c.key, c) for c, _new, _version, _why in chunk)
    return retry


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
