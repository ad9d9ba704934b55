"""Leadership changes in bulk (issue 24 item 3): ``leadership.write_many`` against the
simulation's fake ZooKeeper (versioned znodes, ephemeral ``/servers/<id>``, ``multi`` that
applies all or nothing). The rules are the single functions' (``elect``, ``step_in``,
``set_isr``): checked here against them on random states, and a transaction never writes
over a znode that moved after it was read."""

from __future__ import annotations

import random
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from partition_server import leadership
from partition_server.leadership import Change, ZkLease, write_many
from pidlease.wire.cluster import PartitionState, partition_path, server_path
from tests.sim.zk import FakeZk, FakeZkClient
from tests.unit.server._replicas import MARGIN_MS, TIMEOUT_MS


def world(states: dict[int, PartitionState], live: set[int]) -> tuple[FakeZk, FakeZkClient]:
    zk = FakeZk(random.Random(0), lambda *_: None)
    c = zk.client("test")
    c.ensure_path("/servers")
    for sid in live:
        zk.create(server_path(sid), b"{}", owner=c.session, makepath=True)
    for p, ps in states.items():
        zk.create(partition_path("t", p), ps.to_bytes(), makepath=True)
    return zk, c


def read(zk: FakeZk, p: int) -> PartitionState:
    return PartitionState.from_bytes(zk.nodes[partition_path("t", p)].data)


class Counting:
    """The client, counting transactions and the writes in each; ``before_commit`` runs
    before each commit (another server moving first)."""

    def __init__(self, c: FakeZkClient, before_commit: Any = None) -> None:
        self.c = c
        self.commits: list[int] = []
        self.before_commit = before_commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.c, name)

    def transaction(self) -> Any:
        t = self.c.transaction()
        commit = t.commit

        def counted() -> list[Any]:
            if self.before_commit is not None:
                self.before_commit(len(self.commits))
            self.commits.append(len(t.writes))
            return commit()

        t.commit = counted  # type: ignore[method-assign]
        return t


def test_the_partitions_of_a_dead_leader_move_in_a_few_transactions() -> None:
    states = {p: PartitionState([1, 2, 3], 1, 4, [1, 2, 3]) for p in range(600)}
    zk, c = world(states, live={2, 3})
    counting = Counting(c)
    out = write_many(counting, 2, [Change("t", p, "elect") for p in range(600)], multi_max=250)
    assert counting.commits == [250, 250, 100]
    for p in range(600):
        assert out[("t", p)] == PartitionState([1, 2, 3], 2, 5, [2, 3]) == read(zk, p)


def test_a_transaction_that_meets_a_moved_znode_writes_nothing_and_the_lost_one_drops_out() -> None:
    """Server 3 wins partition 7 between our read and our commit: our first transaction
    fails whole (no partition of it written), the re-read finds 7 led by 3 (the rule says
    no) and the others are written in the next round; 7 keeps 3's state."""
    states = {p: PartitionState([1, 2, 3], 1, 4, [1, 2, 3]) for p in range(20)}
    zk, c = world(states, live={2, 3})

    def server_3_first(n: int) -> None:
        if n == 0:
            zk.set(partition_path("t", 7), PartitionState([1, 2, 3], 3, 5, [2, 3]).to_bytes())

    counting = Counting(c, server_3_first)
    out = write_many(counting, 2, [Change("t", p, "elect") for p in range(20)])
    assert counting.commits == [20, 19]
    assert out[("t", 7)] is None
    assert read(zk, 7) == PartitionState([1, 2, 3], 3, 5, [2, 3])
    for p in set(range(20)) - {7}:
        assert read(zk, p) == PartitionState([1, 2, 3], 2, 5, [2, 3]) == out[("t", p)]


def test_a_znode_that_keeps_moving_is_left_to_the_next_reconcile() -> None:
    states = {p: PartitionState([1, 2, 3], 2, 4, [1, 2, 3]) for p in range(3)}
    zk, c = world(states, live={1, 2, 3})

    def bump(_: int) -> None:  # the same state again, a new version: the CAS must fail
        zk.set(partition_path("t", 0), zk.nodes[partition_path("t", 0)].data)

    counting = Counting(c, bump)
    out = write_many(counting, 2, [Change("t", p, "set_isr", 4, (2, 3)) for p in range(3)])
    assert len(counting.commits) == leadership.BULK_ROUNDS
    assert all(v is None for v in out.values())
    assert all(read(zk, p).isr == [1, 2, 3] for p in range(3))


def test_a_lost_connection_raises() -> None:
    zk, c = world({0: PartitionState([1, 2], 1, 0, [1, 2])}, live={2})
    zk.write_fail_p = 1.0
    with pytest.raises(ConnectionLoss):
        write_many(c, 2, [Change("t", 0, "elect")])
    assert read(zk, 0).leader == 1


def random_state(rng: random.Random) -> PartitionState:
    replicas = rng.sample([1, 2, 3, 4], rng.choice([2, 3]))
    leader = rng.choice(replicas)
    isr = [r for r in replicas if r == leader or rng.random() < 0.6]
    return PartitionState(replicas, leader, rng.randint(0, 5), isr)


def hand_over_args(rng: random.Random, ps: PartitionState) -> tuple[Any, ...]:
    """A handover's ``to`` (0: the best), the followers' ends and ``leave_isr``, random."""
    to = rng.choice([0, *ps.replicas])
    ends = tuple((r, rng.randint(0, 9)) for r in ps.replicas if rng.random() < 0.7)
    return to, ends, rng.random() < 0.5


def single_hand_over(c: Any, ch: Change, me: int) -> PartitionState | None:
    """The single handover (handoff.py, one compare-and-set) the bulk one must match."""
    from partition_server.handoff import hand_over

    to = ch.to or None
    ends = dict(ch.ends)
    return hand_over(c, "t", ch.partition, me, ch.epoch, to=to, ends=ends, leave_isr=ch.leave_isr)


@pytest.mark.parametrize("seed", range(40))
def test_bulk_rules_are_the_single_rules(seed: int) -> None:
    """Random states, random changes asked by server ``me``: what ``write_many`` writes
    (or refuses) for each partition is what the single function does on a copy."""
    rng = random.Random(seed)
    me = rng.choice([1, 2, 3, 4])
    live = {s for s in (1, 2, 3, 4) if s == me or rng.random() < 0.5}
    states = {p: random_state(rng) for p in range(12)}
    changes = []
    for p, ps in states.items():
        kind = rng.choice(["elect", "step_in", "set_isr", "hand_over"])
        epoch = ps.leader_epoch if rng.random() < 0.8 else ps.leader_epoch + 1
        isr = tuple(r for r in ps.replicas if r == me or rng.random() < 0.5)
        changes.append(Change("t", p, kind, epoch, isr, *hand_over_args(rng, ps)))
    bulk_zk, bulk_c = world(states, live)
    got = write_many(bulk_c, me, changes)
    for ch in changes:
        one_zk, one_c = world({ch.partition: states[ch.partition]}, live)
        if ch.kind == "elect":
            want = leadership.elect(one_c, "t", ch.partition, me)
        elif ch.kind == "step_in":
            want = leadership.step_in(one_c, "t", ch.partition, me, ch.epoch)
        elif ch.kind == "hand_over":
            want = single_hand_over(one_c, ch, me)
        else:
            want = leadership.set_isr(one_c, "t", ch.partition, me, ch.epoch, list(ch.isr))
        assert got[ch.key] == want, (ch, states[ch.partition])
        assert read(bulk_zk, ch.partition) == read(one_zk, ch.partition)


def test_a_lost_election_race_does_not_fail_the_in_sync_changes_beside_it() -> None:
    """Server 2 leads 0-9 (server 1, dead, follows them) and asks to elect itself for 10-19
    (led by 1): server 3 wins 10-19 first. The in-sync changes go out in their own
    transaction and land in the first round; only the elections are re-read."""
    states = {p: PartitionState([2, 3, 1], 2, 0, [2, 3, 1]) for p in range(10)}
    states.update({p: PartitionState([1, 2, 3], 1, 0, [1, 2, 3]) for p in range(10, 20)})
    zk, c = world(states, live={2, 3})

    def server_3_first(n: int) -> None:
        if n == 0:
            for p in range(10, 20):
                zk.set(partition_path("t", p), PartitionState([1, 2, 3], 3, 1, [2, 3]).to_bytes())

    counting = Counting(c, server_3_first)
    changes = [Change("t", p, "elect") for p in range(10, 20)]
    changes += [Change("t", p, "set_isr", 0, (2, 3)) for p in range(10)]
    out = write_many(counting, 2, changes)
    assert counting.commits == [10, 10]  # the elections (lost), then the in-sync changes
    assert all(out[("t", p)] == PartitionState([2, 3, 1], 2, 0, [2, 3]) for p in range(10))
    assert all(out[("t", p)] is None and read(zk, p).leader == 3 for p in range(10, 20))


def known_from(zk: FakeZk) -> dict[tuple[str, int], tuple[PartitionState, int]]:
    """What a registry's read of every partition of ``t`` holds now: (state, version)."""
    out = {}
    for path, node in zk.nodes.items():
        if path.startswith(partition_path("t", 0).rsplit("/", 1)[0] + "/"):
            out[("t", int(path.rsplit("/", 1)[1]))] = (
                PartitionState.from_bytes(node.data),
                node.version,
            )
    return out


class CountingReads(Counting):
    """Counting, and the partition znodes read (the fake client has no ``get_async``)."""

    def __init__(self, c: FakeZkClient, before_commit: Any = None) -> None:
        super().__init__(c, before_commit)
        self.reads = 0

    def get(self, path: str, *args: Any, **kw: Any) -> Any:
        self.reads += "/partitions/" in path
        return self.c.get(path, *args, **kw)


def bulk(c: Any, me: int, changes: list[Change], known: Any) -> leadership.Results:
    """``write_many``'s rounds as ``ReplicaManager._write_many`` runs them: the first
    round planned against ``known``, the later ones read."""
    result: leadership.Results = {}
    pending = {ch.key: ch for ch in changes}
    for _ in range(leadership.BULK_ROUNDS):
        if not pending:
            break
        planned = leadership.read_and_plan(c, me, list(pending.values()), result, known)
        known = None
        pending = leadership.commit_planned(c, planned, result)
    for key in pending:
        result[key] = None
    return result


def test_elections_against_known_versions_read_no_partition_again() -> None:
    """The registry's last read gives each state with its version: the 334 elections of a
    failover are planned against them and committed in two transactions, no znode read."""
    states = {p: PartitionState([1, 2, 3], 1, 4, [1, 2, 3]) for p in range(334)}
    zk, c = world(states, live={2, 3})
    known = known_from(zk)
    counting = CountingReads(c)
    out = bulk(counting, 2, [Change("t", p, "elect") for p in range(334)], known.get)
    assert counting.reads == 0
    assert counting.commits == [250, 84]
    assert all(
        out[("t", p)] == PartitionState([1, 2, 3], 2, 5, [2, 3]) == read(zk, p) for p in states
    )


def test_a_known_version_that_moved_loses_its_race_and_is_read_again() -> None:
    """Server 3 won partition 5 after our registry read it: the transaction planned with
    the old version fails whole; the next round reads, 5 is 3's, the rest are ours."""
    states = {p: PartitionState([1, 2, 3], 1, 4, [1, 2, 3]) for p in range(10)}
    zk, c = world(states, live={2, 3})
    known = known_from(zk)
    zk.set(partition_path("t", 5), PartitionState([1, 2, 3], 3, 5, [3, 2]).to_bytes())
    counting = CountingReads(c)
    out = bulk(counting, 2, [Change("t", p, "elect") for p in range(10)], known.get)
    assert counting.commits == [10, 9]
    assert counting.reads == 10
    assert out[("t", 5)] is None and read(zk, 5).leader == 3
    assert all(out[("t", p)] == read(zk, p) and read(zk, p).leader == 2 for p in set(states) - {5})


def test_already_so_is_never_answered_from_a_known_state() -> None:
    """Server 2 leads; its registry read the set [2, 3]; its own write then added 1 back
    ([2, 3, 1], a newer version the registry has not read yet). Asked to shrink to [2, 3]
    again, the known state says "already so": taken from it, nothing would be written, the
    leader would count [2, 3] while ZooKeeper still names 1 in sync (electable without
    the records acked meanwhile). The answer must come from a read."""
    zk, c = world({0: PartitionState([2, 3, 1], 2, 7, [2, 3])}, live={2, 3})
    known = known_from(zk)
    zk.set(partition_path("t", 0), PartitionState([2, 3, 1], 2, 7, [2, 3, 1]).to_bytes())
    out = bulk(c, 2, [Change("t", 0, "set_isr", 7, (2, 3))], known.get)
    assert read(zk, 0).isr == [2, 3]
    assert out[("t", 0)] == read(zk, 0)


@pytest.mark.parametrize("seed", range(40))
def test_bulk_rules_against_known_states_are_the_single_rules(seed: int) -> None:
    """As above, the first round planned against states read earlier, some of which
    moved since (another server's write): every answer is still the single function's on
    the znode as it is now."""
    rng = random.Random(1000 + seed)
    me = rng.choice([1, 2, 3, 4])
    live = {s for s in (1, 2, 3, 4) if s == me or rng.random() < 0.5}
    earlier = {p: random_state(rng) for p in range(12)}
    zk, c = world(earlier, live)
    known = known_from(zk)
    now = dict(earlier)
    for p in range(12):
        if rng.random() < 0.3:
            now[p] = random_state(rng)
            zk.set(partition_path("t", p), now[p].to_bytes())
    changes = []
    for p, ps in now.items():
        kind = rng.choice(["elect", "step_in", "set_isr", "hand_over"])
        base = ps if rng.random() < 0.5 else earlier[p]  # asked on either view
        epoch = base.leader_epoch if rng.random() < 0.8 else base.leader_epoch + 1
        isr = tuple(r for r in base.replicas if r == me or rng.random() < 0.5)
        changes.append(Change("t", p, kind, epoch, isr, *hand_over_args(rng, base)))
    got = bulk(c, me, changes, known.get)
    for ch in changes:
        one_zk, one_c = world({ch.partition: now[ch.partition]}, live)
        if ch.kind == "elect":
            want = leadership.elect(one_c, "t", ch.partition, me)
        elif ch.kind == "step_in":
            want = leadership.step_in(one_c, "t", ch.partition, me, ch.epoch)
        elif ch.kind == "hand_over":
            want = single_hand_over(one_c, ch, me)
        else:
            want = leadership.set_isr(one_c, "t", ch.partition, me, ch.epoch, list(ch.isr))
        assert got[ch.key] == want, (ch, earlier[ch.partition], now[ch.partition])
        assert read(zk, ch.partition) == read(one_zk, ch.partition)


# -- ZkLease: how long the ZooKeeper session is certainly alive ---------------------------
def test_a_confirmed_request_makes_the_lease_end_a_margin_before_the_earliest_expiry() -> None:
    """Step-down (docs/replication.md, Step-down): how long the ZooKeeper session is certainly
    alive."""

    lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
    assert not lease.valid(0)
    assert lease.confirm(5, 1_000)  # a new session's lease begins
    assert lease.valid(2_199) and not lease.valid(2_200)  # 1000 + 1500 - 300
    assert not lease.confirm(5, 900)  # an older send time never shortens it
    assert lease.valid_until_ms == 2_200
    lease.confirm(5, 1_400)
    assert lease.valid(2_599) and not lease.valid(2_600)
    assert lease.held_by(5, 2_000) and not lease.held_by(6, 2_000)
    assert not lease.held_by(None, 2_000)


def test_another_session_restarts_the_lease_and_a_lost_session_ends_it() -> None:
    """Step-down (docs/replication.md, Step-down): how long the ZooKeeper session is certainly
    alive."""

    lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
    lease.confirm(5, 1_000)
    # A new session says nothing of the gap between the two: its lease counts from its
    # own confirmation, and the old session's leaderships are over.
    assert lease.confirm(6, 500)
    assert lease.valid_until_ms == 1_700
    assert not lease.held_by(5, 600) and lease.held_by(6, 600)
    lease.lost()
    assert not lease.valid(600) and lease.session is None


def test_the_granted_timeout_replaces_the_asked_one_and_bounds_the_margin() -> None:
    """Step-down (docs/replication.md, Step-down): how long the ZooKeeper session is certainly
    alive."""

    lease = ZkLease(TIMEOUT_MS, MARGIN_MS)
    lease.set_session_timeout(4_000)  # minSessionTimeout above what was asked
    lease.confirm(1, 0)
    assert lease.valid_until_ms == 3_700
    lease.set_session_timeout(400)  # maxSessionTimeout below it: never outlive the session
    assert lease.margin_ms == 200
    lease.confirm(1, 10_000)
    assert lease.valid_until_ms == 10_200
    with pytest.raises(ValueError, match="margin"):
        ZkLease(1_000, 1_000)
