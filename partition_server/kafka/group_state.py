"""The rules of one Kafka consumer group (the classic protocol), pure: no sockets, no
log, no clock of its own (every call takes ``now_ms``). ``groups.py`` is the shell: it
holds the answers that wait (JoinGroup until the rebalance completes, SyncGroup until the
leader's assignment is durable), writes what must survive to the group log, and calls
``tick`` on a timer.

The states and transitions are Kafka's (docs/kafka.md, "Consumer groups"):

- EMPTY: no members (offsets may be committed with generation -1 and no member id).
- PREPARING_REBALANCE: a member joined, left or died; every known member must send
  JoinGroup again. It completes when all have (and the first rebalance of an empty group
  has waited ``initial_delay_ms`` for the others to arrive), or at the rebalance timeout,
  when the members that did not rejoin are removed. The generation is then bumped, one
  protocol chosen, the first member to have joined is the leader, and every JoinGroup
  is answered (the leader's with every member's metadata).
- COMPLETING_REBALANCE: waiting for the leader's SyncGroup with the assignment.
- STABLE: the assignment is durable; SyncGroups are answered with each member's share.
- DEAD: deleted (DeleteGroups) or its log partition is no longer led here.

Generation and member checks, as Kafka's broker makes them: a request naming an unknown
member is UNKNOWN_MEMBER_ID, a known member with another generation ILLEGAL_GENERATION;
a commit during COMPLETING_REBALANCE is REBALANCE_IN_PROGRESS; a commit with generation
-1 and no member id is accepted only from an EMPTY group (a consumer using ``assign()``
with the group only for its offsets). So a member removed by a rebalance (a zombie) can
never commit again: its member id is gone, and a new one comes with a new generation.

Offset retention (``expired``, Kafka's ``offsets.retention.minutes`` as since KIP-211):
an EMPTY group loses its offsets, and goes, once empty and without a commit for the
retention; a group with members only loses those of topics none of them subscribes to.

Static membership (``group.instance.id``) is not implemented: the instance id is kept
and shown, and the member is treated as a dynamic one.
"""

from __future__ import annotations

import enum
import struct
import uuid
from dataclasses import dataclass, field

from pidlease.wire.kafka_errors import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)

# Limits (Kafka's broker settings of the same meaning; the session bounds are lower than
# Kafka's 6 s minimum so that tests and impatient users can detect a dead member fast).
SESSION_TIMEOUT_MIN_MS = 1_000
SESSION_TIMEOUT_MAX_MS = 1_800_000
INITIAL_REBALANCE_DELAY_MS = 500  # Kafka: group.initial.rebalance.delay.ms (3 s there)
GROUP_MAX_SIZE = 1_000
METADATA_MAX_BYTES = 4_096  # Kafka: offset.metadata.max.bytes
GROUP_ID_MAX = 255


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_seen_ms: int
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


@dataclass(frozen=True)
class OffsetEntry:
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


@dataclass(frozen=True)
class JoinAnswer:
    """One member's JoinGroup answer once the rebalance completes (or an error)."""

    member_id: str
    error_code: int
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    # (member id, instance id, metadata) of every member: the leader's answer only.
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True)
class SyncAnswer:
    member_id: str
    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass
class Events:
    """What a call decided that the shell must deliver: answers of waiting requests."""

    joins: list[JoinAnswer] = field(default_factory=list)
    syncs: list[SyncAnswer] = field(default_factory=list)
    # The group became EMPTY (its last member left or died): the shell records it.
    emptied: bool = False

    def extend(self, other: Events) -> None:
        self.joins.extend(other.joins)
        self.syncs.extend(other.syncs)
        self.emptied = self.emptied or other.emptied


def new_member_id(client_id: str) -> str:
    return f"{client_id[:64] or 'member'}-{uuid.uuid4()}"


def group_id_problem(group_id: str | None) -> str | None:
    if not group_id:
        return "group id is empty"
    if len(group_id) > GROUP_ID_MAX:
        return f"group id longer than {GROUP_ID_MAX} characters"
    return None


class Group:
    def __init__(self, group_id: str, *, initial_delay_ms: int = INITIAL_REBALANCE_DELAY_MS):
        self.group_id = group_id
        self.state = State.EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        # Member ids handed out with MEMBER_ID_REQUIRED (JoinGroup v4+), with the time by
        # which the member must join with it.
        self.pending: dict[str, int] = {}
        self.offsets: dict[tuple[str, int], OffsetEntry] = {}
        self.initial_delay_ms = initial_delay_ms
        self.rebalance_deadline_ms = 0
        self.join_not_before_ms = 0
        # When the group last became EMPTY (its group record's time after a reload): the
        # start of its offsets' retention (``expired``).
        self.empty_since_ms = 0
        # Offset commits written and not yet durable (the shell counts them): nothing
        # expires meanwhile, or a tombstone after them would undo an acknowledged commit.
        self.writes_in_flight = 0

    # -- joining ---------------------------------------------------------------------------
    def join(
        self,
        now_ms: int,
        *,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> tuple[JoinAnswer | None, Events]:
        """A JoinGroup. Returns (an answer now, or None: the member waits for the
        rebalance to complete; events to deliver)."""
        ev = Events()
        if self.state is State.DEAD:
            return JoinAnswer(member_id, COORDINATOR_NOT_AVAILABLE), ev
        if not SESSION_TIMEOUT_MIN_MS <= session_timeout_ms <= SESSION_TIMEOUT_MAX_MS:
            return JoinAnswer(member_id, INVALID_SESSION_TIMEOUT), ev
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms  # JoinGroup v0 has none
        if not protocol_type or not protocols:
            return JoinAnswer(member_id, INCONSISTENT_GROUP_PROTOCOL), ev
        if not self._protocols_fit(protocol_type, protocols):
            return JoinAnswer(member_id, INCONSISTENT_GROUP_PROTOCOL), ev
        if member_id == "":
            if len(self.members) + len(self.pending) >= GROUP_MAX_SIZE:
                return JoinAnswer(member_id, GROUP_MAX_SIZE_REACHED), ev
            new_id = new_member_id(client_id)
            if require_known_member_id:
                self.pending[new_id] = now_ms + session_timeout_ms
                return JoinAnswer(new_id, MEMBER_ID_REQUIRED), ev
            member_id = new_id
        elif member_id in self.pending:
            del self.pending[member_id]
        elif member_id not in self.members:
            return JoinAnswer(member_id, UNKNOWN_MEMBER_ID), ev
        m = self.members.get(member_id)
        if m is None:
            m = Member(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                list(protocols),
                now_ms,
            )
            self.members[member_id] = m
            changed = True
        else:
            changed = m.protocols != list(protocols)
            m.protocols = list(protocols)
            m.session_timeout_ms = session_timeout_ms
            m.rebalance_timeout_ms = rebalance_timeout_ms
            m.last_seen_ms = now_ms
        if self.protocol_type is None:
            self.protocol_type = protocol_type
        m.awaiting_join = True
        if self.state is State.STABLE and not changed and member_id != self.leader:
            # A follower rejoining with the same metadata: Kafka answers it with the
            # current generation at once (no rebalance for nothing).
            m.awaiting_join = False
            return self._join_answer(m, with_members=False), ev
        if self.state is not State.PREPARING_REBALANCE:
            ev.extend(self._prepare_rebalance(now_ms))
        ev.extend(self.try_complete_join(now_ms))
        return None, ev

    def _protocols_fit(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """A member must speak the group's protocol type and share a protocol with all."""
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        names = {n for n, _ in protocols}
        return bool(names & self._common_protocols())

    def _common_protocols(self) -> set[str]:
        common: set[str] | None = None
        for m in self.members.values():
            names = {n for n, _ in m.protocols}
            common = names if common is None else common & names
        return common or set()

    def _prepare_rebalance(self, now_ms: int) -> Events:
        ev = Events()
        if self.state is State.COMPLETING_REBALANCE:
            # SyncGroups waiting for an assignment that will not come.
            for m in self.members.values():
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    ev.syncs.append(SyncAnswer(m.member_id, REBALANCE_IN_PROGRESS))
        was_empty = self.state is State.EMPTY
        self.state = State.PREPARING_REBALANCE
        timeout = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        self.rebalance_deadline_ms = now_ms + timeout
        self.join_not_before_ms = now_ms + (min(self.initial_delay_ms, timeout) if was_empty else 0)
        return ev

    def try_complete_join(self, now_ms: int) -> Events:
        """Complete the rebalance when every member has rejoined (and the initial delay
        passed), or when the rebalance timeout passed (removing those that did not)."""
        ev = Events()
        if self.state is not State.PREPARING_REBALANCE:
            return ev
        waiting = [m for m in self.members.values() if not m.awaiting_join]
        if waiting and now_ms < self.rebalance_deadline_ms:
            return ev
        if not waiting and now_ms < self.join_not_before_ms:
            return ev
        for m in waiting:
            del self.members[m.member_id]
        if not self.members:
            self.generation += 1
            self._to_empty(now_ms)
            ev.emptied = True
            return ev
        self.generation += 1
        self.protocol_name = self._choose_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self.state = State.COMPLETING_REBALANCE
        for m in self.members.values():
            m.awaiting_join = False
            m.assignment = b""
            m.last_seen_ms = now_ms  # its session runs from its JoinGroup answer
            ev.joins.append(self._join_answer(m, with_members=m.member_id == self.leader))
        return ev

    def _choose_protocol(self) -> str:
        """The protocol every member speaks that the most members prefer (each member's
        first choice among the common ones: Kafka's vote)."""
        common = self._common_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            for name, _ in m.protocols:
                if name in common:
                    votes[name] = votes.get(name, 0) + 1
                    break
        return max(sorted(votes), key=lambda n: votes[n])

    def _join_answer(self, m: Member, *, with_members: bool) -> JoinAnswer:
        assert self.protocol_name is not None and self.leader is not None
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if with_members:
            members = tuple(
                (x.member_id, x.instance_id, x.metadata_for(self.protocol_name))
                for x in self.members.values()
            )
        return JoinAnswer(
            m.member_id,
            NONE,
            self.generation,
            self.protocol_type,
            self.protocol_name,
            self.leader,
            members,
        )

    def _to_empty(self, now_ms: int) -> None:
        self.state = State.EMPTY
        self.empty_since_ms = now_ms
        self.leader = None
        self.protocol_name = None
        if not self.offsets:
            # Kafka keeps the protocol type of a group that has offsets; one without
            # anything left is forgotten by the shell (``removable``).
            pass

    # -- syncing ---------------------------------------------------------------------------
    def sync(
        self,
        now_ms: int,
        *,
        member_id: str,
        generation: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[SyncAnswer | None, dict[str, bytes] | None]:
        """A SyncGroup. Returns (an answer now, or None: the member waits; the leader's
        assignment to make durable before ``complete_sync``, or None)."""
        if self.state is State.DEAD:
            return SyncAnswer(member_id, COORDINATOR_NOT_AVAILABLE), None
        m = self.members.get(member_id)
        if m is None:
            return SyncAnswer(member_id, UNKNOWN_MEMBER_ID), None
        if generation != self.generation:
            return SyncAnswer(member_id, ILLEGAL_GENERATION), None
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
            protocol_name is not None and protocol_name != self.protocol_name
        ):
            return SyncAnswer(member_id, INCONSISTENT_GROUP_PROTOCOL), None
        m.last_seen_ms = now_ms
        if self.state is State.PREPARING_REBALANCE:
            return SyncAnswer(member_id, REBALANCE_IN_PROGRESS), None
        if self.state is State.STABLE:
            return self._sync_answer(m), None
        if self.state is not State.COMPLETING_REBALANCE:
            return SyncAnswer(member_id, UNKNOWN_MEMBER_ID), None
        m.awaiting_sync = True
        if member_id != self.leader:
            return None, None
        # Members the leader left out get an empty assignment, as in Kafka.
        plan = {mid: assignments.get(mid, b"") for mid in self.members}
        return None, plan

    def complete_sync(self, generation: int, plan: dict[str, bytes]) -> Events:
        """The leader's assignment of ``generation`` is durable: STABLE, answer syncs.
        Nothing when the group moved on meanwhile (its syncs were answered then)."""
        ev = Events()
        if self.state is not State.COMPLETING_REBALANCE or generation != self.generation:
            return ev
        for mid, m in self.members.items():
            m.assignment = plan.get(mid, b"")
        self.state = State.STABLE
        for m in self.members.values():
            if m.awaiting_sync:
                m.awaiting_sync = False
                ev.syncs.append(self._sync_answer(m))
        return ev

    def fail_sync(self, generation: int, code: int) -> Events:
        """The assignment could not be made durable: the waiting syncs get ``code`` and
        the group rebalances (the members rejoin on the error)."""
        ev = Events()
        if self.state is not State.COMPLETING_REBALANCE or generation != self.generation:
            return ev
        for m in self.members.values():
            if m.awaiting_sync:
                m.awaiting_sync = False
                ev.syncs.append(SyncAnswer(m.member_id, code))
        return ev

    def _sync_answer(self, m: Member) -> SyncAnswer:
        return SyncAnswer(m.member_id, NONE, m.assignment, self.protocol_type, self.protocol_name)

    # -- liveness --------------------------------------------------------------------------
    def heartbeat(self, now_ms: int, member_id: str, generation: int) -> int:
        if self.state is State.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        m = self.members.get(member_id)
        if m is None:
            return UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ILLEGAL_GENERATION
        m.last_seen_ms = now_ms
        if self.state is State.PREPARING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def leave(self, now_ms: int, member_id: str) -> tuple[int, Events]:
        ev = Events()
        if self.state is State.DEAD:
            return COORDINATOR_NOT_AVAILABLE, ev
        if member_id in self.pending:
            del self.pending[member_id]
            return NONE, ev
        m = self.members.pop(member_id, None)
        if m is None:
            return UNKNOWN_MEMBER_ID, ev
        ev.extend(self._member_gone(now_ms, m))
        return NONE, ev

    def _member_gone(self, now_ms: int, m: Member) -> Events:
        ev = Events()
        if m.awaiting_join:
            ev.joins.append(JoinAnswer(m.member_id, UNKNOWN_MEMBER_ID))
        if m.awaiting_sync:
            ev.syncs.append(SyncAnswer(m.member_id, UNKNOWN_MEMBER_ID))
        if self.leader == m.member_id:
            self.leader = None
        if not self.members:
            if self.state is State.PREPARING_REBALANCE:
                self.generation += 1
            self._to_empty(now_ms)
            ev.emptied = True
            return ev
        if self.state is State.PREPARING_REBALANCE:
            ev.extend(self.try_complete_join(now_ms))
        else:
            ev.extend(self._prepare_rebalance(now_ms))
            ev.extend(self.try_complete_join(now_ms))
        return ev

    def tick(self, now_ms: int) -> Events:
        """Session timeouts (a member not heard from for its session timeout is removed
        and the group rebalances), pending member ids that never joined, and the
        rebalance deadline."""
        ev = Events()
        for mid, until in list(self.pending.items()):
            if now_ms > until:
                del self.pending[mid]
        for m in list(self.members.values()):
            if m.awaiting_join:
                continue  # waits on the rebalance deadline instead
            if now_ms - m.last_seen_ms > m.session_timeout_ms:
                self.members.pop(m.member_id, None)
                ev.extend(self._member_gone(now_ms, m))
        ev.extend(self.try_complete_join(now_ms))
        return ev

    # -- offsets ---------------------------------------------------------------------------
    def commit_check(self, member_id: str, generation: int) -> int:
        """Whether an OffsetCommit of this member and generation may be written."""
        if self.state is State.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if generation < 0 and member_id == "":
            return NONE if self.state is State.EMPTY else UNKNOWN_MEMBER_ID
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ILLEGAL_GENERATION
        if self.state is State.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def touch(self, now_ms: int, member_id: str) -> None:
        """A member's commit counts as a sign of life, as in Kafka."""
        m = self.members.get(member_id)
        if m is not None:
            m.last_seen_ms = now_ms

    def subscribed_topics(self) -> set[str] | None:
        """The topics the members subscribe to (consumer protocol), None when a member's
        subscription cannot be read (then every topic counts as subscribed)."""
        out: set[str] = set()
        for m in self.members.values():
            topics = parse_subscription(m.metadata_for(self.protocol_name or ""))
            if topics is None:
                return None
            out |= topics
        return out

    # -- retention -------------------------------------------------------------------------
    def expired(self, now_ms: int, retention_ms: int) -> tuple[list[tuple[str, int]], bool]:
        """What offset retention lets go (Kafka's ``offsets.retention.minutes``, as since
        KIP-211): (the offsets to delete, whether the whole group goes with them).

        An EMPTY group (no members, no member id handed out) that has been empty and
        without a commit for more than ``retention_ms`` loses all its offsets and goes
        itself. In a consumer group with members, the offsets of topics no member
        subscribes to go once committed more than ``retention_ms`` ago (none when a
        subscription cannot be read). Nothing expires while a commit of the group is being
        written (``writes_in_flight``): its record would land before the tombstones, and a
        group tombstone would take it too. Nothing else ever expires: a group with members
        keeps the offsets of what it reads, however old."""
        if self.state is State.DEAD or self.pending or self.writes_in_flight:
            return [], False
        if self.state is State.EMPTY:
            last = max([self.empty_since_ms, *(e.commit_ms for e in self.offsets.values())])
            if now_ms - last > retention_ms:
                return sorted(self.offsets), True
            return [], False
        if self.protocol_type != "consumer":
            return [], False
        subscribed = self.subscribed_topics()
        if subscribed is None:
            return [], False
        gone = [
            tp
            for tp, e in self.offsets.items()
            if tp[0] not in subscribed and now_ms - e.commit_ms > retention_ms
        ]
        return sorted(gone), False

    def removable(self) -> bool:
        """Nothing left to remember: no members and no offsets."""
        return self.state is State.EMPTY and not self.offsets and not self.pending


def parse_subscription(meta: bytes) -> set[str] | None:
    """The topics of a consumer protocol subscription (version int16, then an array of
    strings), None when it does not parse."""
    try:
        pos = 2
        (n,) = struct.unpack_from(">i", meta, pos)
        pos += 4
        if n < 0 or n > 100_000:
            return None
        out = set()
        for _ in range(n):
            (ln,) = struct.unpack_from(">h", meta, pos)
            pos += 2
            if ln < 0 or pos + ln > len(meta):
                return None
            out.add(meta[pos : pos + ln].decode("utf-8"))
            pos += ln
        return out
    except (struct.error, UnicodeDecodeError):
        return None
