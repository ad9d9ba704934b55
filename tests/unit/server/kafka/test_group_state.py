"""The rules of one consumer group (``partition_server/kafka/group_state.py``), checked
against Kafka's protocol as documented (the consumer group protocol of KIP-62/KIP-394 and
the broker's error codes), not against the module's code:

- JoinGroup v4+ with no member id answers MEMBER_ID_REQUIRED with an id to join with;
- a rebalance completes when every member has rejoined; the leader's answer alone lists
  the members; every member gets the same generation and leader;
- SyncGroup answers each member the assignment the leader gave it;
- Heartbeat: UNKNOWN_MEMBER_ID for a stranger, ILLEGAL_GENERATION for another
  generation, REBALANCE_IN_PROGRESS while one is prepared;
- a member not heard from for its session timeout is removed and the group rebalances;
- OffsetCommit: accepted from a member of the current generation; from no member with
  generation -1 only while the group is empty; a removed member (zombie) is refused.

The property test drives random clients against one group with a model of what each
client knows (the member id and generation of its last successful JoinGroup).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.kafka import group_state as G
from partition_server.kafka.group_log import (
    apply_record,
    group_key,
    group_value,
    offset_key,
    offset_value,
)
from partition_server.kafka.group_state import Events, Group, OffsetEntry, State
from pidlease.wire import kafka_errors as E

SESSION = 6_000
META = b"\0\0\0\0\0\1\0\6orders\xff\xff\xff\xff"  # consumer protocol: ["orders"]


def join(
    g: Group, now: int, member_id: str = "", *, v4: bool = True, protocols=None, session=SESSION
) -> tuple[G.JoinAnswer | None, Events]:  # type: ignore[no-untyped-def]
    return g.join(
        now,
        member_id=member_id,
        instance_id=None,
        client_id="c",
        client_host="",
        session_timeout_ms=session,
        rebalance_timeout_ms=SESSION,
        protocol_type="consumer",
        protocols=protocols or [("range", META)],
        require_known_member_id=v4,
    )


def new_member(g: Group, now: int) -> str:
    ans, _ = join(g, now)
    assert ans is not None and ans.error_code == E.MEMBER_ID_REQUIRED and ans.member_id
    return ans.member_id


def test_first_join_needs_a_member_id_then_waits_for_the_initial_delay() -> None:
    g = Group("g")
    mid = new_member(g, 0)
    assert not g.members, "a member id handed out is not a member yet"
    ans, ev = join(g, 0, mid)
    assert ans is None and not ev.joins, "waits for others during the initial delay"
    ev = g.tick(G.INITIAL_REBALANCE_DELAY_MS)
    (j,) = ev.joins
    assert j.error_code == E.NONE and j.generation == 1 and j.leader == mid
    assert [m[0] for m in j.members] == [mid] and j.members[0][2] == META
    assert g.state is State.COMPLETING_REBALANCE


def test_two_members_one_generation_leader_alone_gets_the_members() -> None:
    g = Group("g")
    a, b = new_member(g, 0), new_member(g, 0)
    join(g, 0, a)
    _, ev = join(g, 10, b)
    ev.extend(g.tick(1_000))
    answers = {j.member_id: j for j in ev.joins}
    assert set(answers) == {a, b}
    assert {j.generation for j in answers.values()} == {1}
    leader = answers[a].leader
    assert answers[b].leader == leader
    assert len(answers[leader].members) == 2
    other = b if leader == a else a
    assert answers[other].members == ()
    # Sync: the follower waits, the leader's assignment completes both.
    s, plan = g.sync(
        1_000, member_id=other, generation=1, protocol_type=None, protocol_name=None, assignments={}
    )
    assert s is None and plan is None
    s, plan = g.sync(
        1_000,
        member_id=leader,
        generation=1,
        protocol_type="consumer",
        protocol_name="range",
        assignments={a: b"A", b: b"B"},
    )
    assert s is None and plan == {a: b"A", b: b"B"}
    ev = g.complete_sync(1, plan)
    assert {x.member_id: x.assignment for x in ev.syncs} == {a: b"A", b: b"B"}
    assert all(x.error_code == E.NONE for x in ev.syncs)
    assert g.state is State.STABLE


def stable_group(n: int = 2) -> tuple[Group, list[str], int]:
    g = Group("g")
    ids = [new_member(g, 0) for _ in range(n)]
    ev = Events()
    for mid in ids:
        ev.extend(join(g, 0, mid)[1])
    ev.extend(g.tick(1_000))
    leader = ev.joins[0].leader
    _, plan = g.sync(
        1_000,
        member_id=leader,
        generation=g.generation,
        protocol_type=None,
        protocol_name=None,
        assignments={m: m.encode() for m in ids},
    )
    assert plan is not None
    g.complete_sync(g.generation, plan)
    return g, ids, 1_000


def test_heartbeat_codes() -> None:
    g, (a, _b), now = stable_group()
    assert g.heartbeat(now, a, 1) == E.NONE
    assert g.heartbeat(now, "stranger", 1) == E.UNKNOWN_MEMBER_ID
    assert g.heartbeat(now, a, 0) == E.ILLEGAL_GENERATION
    c = new_member(g, now)
    join(g, now, c)
    assert g.state is State.PREPARING_REBALANCE
    assert g.heartbeat(now, a, 1) == E.REBALANCE_IN_PROGRESS


def test_session_timeout_removes_a_member_and_its_commits_are_refused() -> None:
    g, (a, b), now = stable_group()
    assert g.commit_check(a, 1) == E.NONE
    t = now + SESSION // 2
    assert g.heartbeat(t, b, 1) == E.NONE  # b alive, a silent
    ev = g.tick(now + SESSION + 1)
    assert a not in g.members and g.state is State.PREPARING_REBALANCE
    assert not ev.joins
    assert g.commit_check(a, 1) == E.UNKNOWN_MEMBER_ID, "a zombie's commit is refused"
    assert g.heartbeat(now + SESSION + 1, b, 1) == E.REBALANCE_IN_PROGRESS
    _, ev = join(g, now + SESSION + 2, b)
    (j,) = ev.joins
    assert j.generation == 2 and j.leader == b
    assert g.commit_check(b, 1) == E.ILLEGAL_GENERATION
    assert g.commit_check(b, 2) == E.REBALANCE_IN_PROGRESS  # completing: no assignment yet


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    g, (a, b), now = stable_group()
    _, ev = join(g, now, a)  # a rejoins (the leader or not: a rebalance either way)
    if g.state is State.STABLE:  # a follower with the same metadata: answered at once
        return
    assert g.state is State.PREPARING_REBALANCE
    t = now + 100
    assert g.heartbeat(t, b, 1) == E.REBALANCE_IN_PROGRESS
    ev = g.tick(now + SESSION + 1)  # b never rejoined within the rebalance timeout
    assert b not in g.members and [j.member_id for j in ev.joins] == [a]


def test_simple_commits_only_into_an_empty_group() -> None:
    g = Group("g")
    assert g.commit_check("", -1) == E.NONE
    g2, (a, _), now = stable_group()
    assert g2.commit_check("", -1) == E.UNKNOWN_MEMBER_ID
    assert g2.leave(now, a)[0] == E.NONE
    assert g2.leave(now, a)[0] == E.UNKNOWN_MEMBER_ID


def test_last_member_leaving_empties_the_group() -> None:
    g, (a, b), now = stable_group()
    g.leave(now, a)
    _, ev = g.leave(now, b)
    assert ev.emptied and g.state is State.EMPTY and not g.members
    assert g.commit_check("", -1) == E.NONE


def test_join_refusals() -> None:
    g = Group("g")
    ans, _ = join(g, 0, session=10)
    assert ans is not None and ans.error_code == E.INVALID_SESSION_TIMEOUT
    ans, _ = join(g, 0, "made-up")
    assert ans is not None and ans.error_code == E.UNKNOWN_MEMBER_ID
    g2, _, now = stable_group()
    ans, _ = join(g2, now, protocols=[("roundrobin", META)], v4=False)
    assert ans is not None and ans.error_code == E.INCONSISTENT_GROUP_PROTOCOL


def test_parse_subscription() -> None:
    assert G.parse_subscription(META) == {"orders"}
    assert G.parse_subscription(b"\0") is None


# -- property: random clients against one group -----------------------------------------------
@dataclass
class Client:
    member_id: str = ""
    generation: int = -1  # from its last successful JoinGroup answer
    gone: bool = False  # left successfully: that member id must never work again


ops = st.lists(
    st.tuples(
        st.sampled_from(["join", "sync", "heartbeat", "leave", "commit", "tick"]),
        st.integers(0, 3),  # client
        st.integers(0, 4_000),  # time advance
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_generations_and_zombies(seq: list[tuple[str, int, int]]) -> None:
    g = Group("g")
    clients = [Client() for _ in range(4)]
    now = 0
    latest = 0  # the newest generation any JoinGroup answer carried
    dead_ids: set[str] = set()
    stale: set[tuple[str, int]] = set()  # (member, generation) pairs superseded

    def absorb(ev: Events) -> None:
        nonlocal latest
        gens = {j.generation for j in ev.joins if j.error_code == E.NONE}
        assert len(gens) <= 1, "one completed rebalance: one generation"
        for j in ev.joins:
            c = next((c for c in clients if c.member_id == j.member_id), None)
            if j.error_code == E.NONE:
                assert j.generation > latest or j.generation == latest, "never goes back"
                leaders = {x.leader for x in ev.joins if x.error_code == E.NONE}
                assert len(leaders) == 1
                if c is not None:
                    if c.generation >= 0:
                        stale.add((c.member_id, c.generation))
                    c.generation = j.generation
        if gens:
            g_new = gens.pop()
            assert g_new >= latest
            if g_new > latest:
                for c in clients:
                    if c.generation >= 0 and c.generation < g_new:
                        stale.add((c.member_id, c.generation))
            latest = g_new

    for op, i, dt in seq:
        now += dt
        c = clients[i]
        if op == "tick":
            absorb(g.tick(now))
        elif op == "join":
            if not c.member_id or c.gone:
                ans, ev = join(g, now)
                absorb(ev)
                if ans is not None and ans.error_code == E.MEMBER_ID_REQUIRED:
                    clients[i] = c = Client(ans.member_id)
                else:
                    continue
            ans, ev = join(g, now, c.member_id)
            absorb(ev)
            if ans is not None and ans.error_code == E.NONE:
                c.generation = ans.generation
        elif op == "sync" and c.member_id:
            ans, plan = g.sync(
                now,
                member_id=c.member_id,
                generation=c.generation,
                protocol_type=None,
                protocol_name=None,
                assignments={x.member_id: b"x" for x in clients},
            )
            if plan is not None:
                absorb(g.complete_sync(g.generation, plan))
        elif op == "heartbeat" and c.member_id:
            code = g.heartbeat(now, c.member_id, c.generation)
            if (c.member_id, c.generation) in stale or c.member_id in dead_ids:
                assert code != E.NONE, "a zombie's heartbeat is refused"
        elif op == "leave" and c.member_id:
            code, ev = g.leave(now, c.member_id)
            absorb(ev)
            if code == E.NONE:
                dead_ids.add(c.member_id)
                c.gone = True
        elif op == "commit" and c.member_id:
            code = g.commit_check(c.member_id, c.generation)
            if code == E.NONE:
                assert (c.member_id, c.generation) not in stale, "a stale generation committed"
                assert c.member_id not in dead_ids, "a member that left committed"
                assert c.generation == g.generation == latest
                assert g.state in (State.STABLE, State.PREPARING_REBALANCE)
        assert g.generation >= latest  # an emptied group may count one more
        if g.state is State.EMPTY:
            assert not g.members
        if g.state in (State.COMPLETING_REBALANCE, State.STABLE):
            assert g.leader in g.members and g.generation == latest


def test_a_session_runs_from_the_join_answer_not_from_the_join() -> None:
    # a waits in JoinGroup for b, who never rejoins: the rebalance completes at its
    # timeout, after a's session timeout; a must not be expired for having waited.
    g, (a, _b), now = stable_group()
    c = new_member(g, now)
    join(g, now, c)
    join(g, now, a)
    ev = g.tick(now + SESSION + 1)
    assert {j.member_id for j in ev.joins} == {a, c}
    g.tick(now + SESSION + 2)
    assert set(g.members) == {a, c}, "members expired for the time they waited in JoinGroup"


# -- offset retention of a consumer group (issue 25 item 3)
RET = 60_000


def commit(g: Group, topic: str, p: int, offset: int, now: int) -> None:
    g.offsets[(topic, p)] = OffsetEntry(offset, -1, "", now)


def emptied(at: int) -> Group:
    """A group whose only member left at ``at`` with offsets committed before."""
    g, (a, b), now = stable_group()
    commit(g, "orders", 0, 10, now)
    commit(g, "orders", 1, 20, now)
    g.leave(at, a)
    g.leave(at, b)
    assert g.state is State.EMPTY
    return g


def test_an_empty_group_expires_whole_only_after_the_retention() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    g = emptied(5_000)
    assert g.expired(5_000 + RET, RET) == ([], False)
    assert g.expired(5_000 + RET + 1, RET) == ([("orders", 0), ("orders", 1)], True)


def test_a_commit_to_an_empty_group_starts_the_wait_over() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    g = emptied(5_000)
    assert g.commit_check("", -1) == E.NONE  # an assign() consumer may commit
    commit(g, "orders", 0, 11, 50_000)
    assert g.expired(5_000 + RET + 1, RET) == ([], False)
    assert g.expired(50_000 + RET + 1, RET)[1]


def test_an_empty_group_without_offsets_goes_too() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    g, (a,), _ = stable_group(1)
    g.leave(2_000, a)
    assert g.expired(2_000 + RET + 1, RET) == ([], True)


def test_members_keep_what_they_subscribe_to_and_lose_the_rest() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    g, _, now = stable_group()  # members subscribe to "orders"
    commit(g, "orders", 0, 1, now)
    commit(g, "old", 0, 1, now)
    commit(g, "old", 1, 1, now + 30_000)
    much_later = now + 10 * RET
    for m in g.members.values():
        m.last_seen_ms = much_later  # alive all along
    assert g.expired(now + RET, RET) == ([], False)
    assert g.expired(now + RET + 1, RET) == ([("old", 0)], False)
    assert g.expired(much_later, RET) == ([("old", 0), ("old", 1)], False)


def test_a_member_on_its_way_in_or_a_deleted_group_expire_nothing() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    g = emptied(0)
    new_member(g, RET)  # MEMBER_ID_REQUIRED handed out: it will join with it
    assert g.pending
    assert g.expired(10 * RET, RET) == ([], False)
    g2 = emptied(0)
    g2.state = State.DEAD
    assert g2.expired(10 * RET, RET) == ([], False)


def test_a_reloaded_group_waits_from_its_record_not_from_the_reload() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    g = emptied(7_000)
    groups: dict[str, Group] = {}
    for (t, p), e in g.offsets.items():
        apply_record(groups, offset_key("g", t, p), offset_value(e))
    apply_record(groups, group_key("g"), group_value(g, g.empty_since_ms))
    back = groups["g"]
    assert back.state is State.EMPTY and not back.members
    assert back.expired(7_000 + RET, RET) == ([], False)
    assert back.expired(7_000 + RET + 1, RET)[1]
    # A record of an older format (no time): the offsets' own commit times count.
    old: dict[str, Group] = {}
    apply_record(old, offset_key("g", "orders", 0), offset_value(OffsetEntry(1, -1, "", 9_000)))
    apply_record(old, group_key("g"), b'{"gen": 3, "pt": "consumer", "pn": null, "members": 0}')
    assert old["g"].expired(9_000 + RET, RET) == ([], False)
    assert old["g"].expired(9_000 + RET + 1, RET)[1]


def test_a_rejoined_group_is_not_expired() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    g = emptied(0)
    mid = new_member(g, RET + 5)
    join(g, RET + 5, mid)
    g.tick(RET + 5 + G.INITIAL_REBALANCE_DELAY_MS)
    assert g.state is State.COMPLETING_REBALANCE
    # Its topic is subscribed: nothing goes, however late.
    assert g.expired(100 * RET, RET) == ([], False)
    assert SESSION < RET


def test_nothing_expires_while_a_commit_is_being_written() -> None:
    """Issue 25 item 3 (offset retention, Kafka's offsets.retention.minutes since KIP-211): a
    group's offsets expire by Kafka's rule, checked from the rule, not from the module's
    code."""

    # A group created by its first commit (an assign() consumer): the commit is in flight,
    # not yet in ``offsets``. Expiring then would write a group tombstone after the commit
    # and take the acknowledged commit with it (seen: the dashboard test's group vanished).
    g = Group("g")
    g.empty_since_ms = 1_000
    g.writes_in_flight = 1
    assert g.expired(1_000 + 10 * RET, RET) == ([], False)
    g.writes_in_flight = 0
    commit(g, "orders", 0, 5, 2_000)
    assert g.expired(2_000 + RET, RET) == ([], False)
    assert g.expired(2_000 + RET + 1, RET) == ([("orders", 0)], True)
