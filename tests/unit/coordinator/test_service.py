"""The lease flows of coordinator/service.py with a fake ZooKeeper store (versions and
compare-and-set like the real one) and fake partition leaders; time is a fake clock."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from coordinator.allocator import PidAllocator
from coordinator.leases import LeaseKind, LeaseRequest
from coordinator.metrics import Metrics
from coordinator.service import LeaseService
from coordinator.settings import CoordinatorSettings
from coordinator.testing import FakeStore
from pidlease.errors import (
    CoordinatorUnavailable,
    NotLeader,
    ProducerFenced,
    UnknownPid,
    UnknownTopicOrPartition,
)
from pidlease.wire import cluster
from pidlease.wire.protocol import FENCE_CREATE_IF_ABSENT, PartitionEntry, Response
from pidlease.wire.token import verify_token
from tests.helpers import ManualClock


class FakeLeaders:
    """Holds per (address, topic, partition, pid) producer state like a partition leader."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: dict[tuple[str, int, int], tuple[int, int]] = {}  # -> (generation, durable hw)
        # (topic, partition) -> newest last use of a PID the partition expired (a server's
        # dropped_last_use_max_ms); ``expire`` drops a PID's state and raises it.
        self.dropped: dict[tuple[str, int], int] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.leased_since: list[int] = []  # of each FENCE, in call order
        self.down: set[str] = set()
        self.many_calls: list[tuple[str, str, int]] = []  # (kind, address, partitions)

    def expire(self, topic: str, partition: int, pid: int, last_use_ms: int) -> None:
        with self.lock:
            del self.state[(topic, partition, pid)]
            self.dropped[(topic, partition)] = max(
                self.dropped.get((topic, partition), 0), last_use_ms
            )

    def producer_state(self, address: str, topic: str, partition: int, pid: int) -> Response:
        with self.lock:
            self.calls.append(("state", address, topic, partition, pid))
            if address in self.down:
                raise CoordinatorUnavailable(f"{address} unreachable")
            st = self.state.get((topic, partition, pid))
            dropped = self.dropped.get((topic, partition), 0)
        if st is None:
            return Response(1, 0, "", found=False, dropped_last_use_max_ms=dropped)
        return Response(
            1,
            0,
            "",
            found=True,
            generation=st[0],
            durable_highwater=st[1],
            dropped_last_use_max_ms=dropped,
        )

    def producer_states(
        self, address: str, pid: int, partitions: list[tuple[str, int]]
    ) -> list[Response]:
        """PRODUCER_STATES: the per-partition answers (an unreachable leader fails all)."""
        self.many_calls.append(("states", address, len(partitions)))
        return [self.producer_state(address, t, p, pid) for t, p in partitions]

    def fences(
        self, address: str, pid: int, generation: int, token: str, entries: list[PartitionEntry]
    ) -> list[Response]:
        self.many_calls.append(("fences", address, len(entries)))
        return [
            self.fence(
                address,
                e.topic,
                e.partition,
                pid,
                generation,
                token,
                create_if_absent=bool(e.flags & FENCE_CREATE_IF_ABSENT),
                leased_since_ms=e.leased_since_ms,
            )
            for e in entries
        ]

    def fence(
        self,
        address: str,
        topic: str,
        partition: int,
        pid: int,
        generation: int,
        token: str,
        *,
        create_if_absent: bool,
        leased_since_ms: int = 0,
    ) -> Response:
        with self.lock:
            self.calls.append(
                ("fence", address, topic, partition, pid, generation, create_if_absent)
            )
            self.leased_since.append(leased_since_ms)
            if address in self.down:
                raise CoordinatorUnavailable(f"{address} unreachable")
            key = (topic, partition, pid)
            st = self.state.get(key)
            dropped = self.dropped.get((topic, partition), 0)
            if st is not None and generation < st[0]:
                return Response(1, ProducerFenced.code, "older generation")
            # The server's rule (partition.py fence): no fresh entry where a PID used since
            # this one's lease began was dropped.
            if st is None and (
                not create_if_absent or not (leased_since_ms <= 0 or dropped < leased_since_ms)
            ):
                return Response(
                    1, 0, "", existed=False, durable_highwater=-1, dropped_last_use_max_ms=dropped
                )
            self.state[key] = (generation, st[1] if st else -1)
            return Response(
                1,
                0,
                "",
                existed=st is not None,
                durable_highwater=st[1] if st else -1,
                fence_offset=100,
                dropped_last_use_max_ms=dropped,
            )


@pytest.fixture
def env() -> Any:
    settings = CoordinatorSettings(
        zk="x",
        pid_block_size=10,
        lease_expire_ms_default=1_000,
        lease_expire_ms_min=100,
        pid_retention_ms=10_000,
        lease_expiring_window_ms=300,
    )
    store, leaders, clock = FakeStore(), FakeLeaders(), ManualClock()
    store.add_topic("t", 4)
    store.add_server(1, 9001)
    svc = LeaseService(
        settings,
        store,
        PidAllocator(store, 10),
        leaders,
        Metrics(),  # type: ignore[arg-type]
        clock_ms=clock,
    )
    yield svc, store, leaders, clock
    svc.close()


def lease(svc: LeaseService, **kw: Any) -> Any:
    kw.setdefault("topic", "t")
    kw.setdefault("partition", 0)
    kw.setdefault("pid", -1)
    return svc.lease(LeaseRequest(**kw))


def test_new_pid_is_sequence_zero_without_any_leader_call(env: Any) -> None:
    svc, _store, leaders, clock = env
    r = lease(svc)
    assert (r.kind, r.record.pid, r.sequence_number) == (LeaseKind.NEW, 1, 0)
    assert 0 <= r.record.generation < 2**30
    assert leaders.calls == []
    assert (
        verify_token(b"pidlease-dev-secret", r.lease_token, 1, r.record.generation, clock.now)
        == clock.now + 1_000
    )


def test_renew_reads_durable_highwater_and_marks_seen(env: Any) -> None:
    svc, store, leaders, clock = env
    r = lease(svc)
    leaders.state[("t", 0, r.record.pid)] = (r.record.generation, 41)
    clock.now += 500
    again = lease(svc, pid=r.record.pid, generation=r.record.generation)
    assert (again.kind, again.sequence_number) == (LeaseKind.RENEW, 42)
    assert again.record.generation == r.record.generation
    assert again.record.expires_at_ms == clock.now + 1_000
    stored, _ = store.get_pid(r.record.pid)
    assert stored.partitions["t/0"] == {"seen": True, "highwater": 41}


def test_renew_adds_a_partition_with_sequence_zero(env: Any) -> None:
    svc, store, _leaders, _ = env
    r = lease(svc)
    again = lease(svc, pid=r.record.pid, generation=r.record.generation, partition=3)
    assert again.sequence_number == 0
    assert set(store.get_pid(r.record.pid)[0].partitions) == {"t/0", "t/3"}


def test_expired_state_on_a_seen_partition_is_unknown_pid_not_zero(env: Any) -> None:
    svc, store, leaders, _ = env
    r = lease(svc)
    leaders.state[("t", 0, r.record.pid)] = (r.record.generation, 5)
    lease(svc, pid=r.record.pid, generation=r.record.generation)
    before = store.get_pid(r.record.pid)
    del leaders.state[("t", 0, r.record.pid)]  # the server expired it
    with pytest.raises(UnknownPid):
        lease(svc, pid=r.record.pid, generation=r.record.generation)
    assert store.get_pid(r.record.pid) == before, "a refused lease changes nothing"


# Finding 6 (docs/reliability.md): a PID that wrote to a partition and died before its first renewal
# never had it marked seen; if the server then expired the PID, "no state" there must not
# restart the partition at sequence 0. The env's clock skew allowance is the default 60 s.
def test_takeover_of_an_unseen_partition_that_dropped_the_pid_is_unknown_pid(env: Any) -> None:
    svc, _store, leaders, clock = env
    r = lease(svc, producer_name="job")
    pid = r.record.pid
    leaders.state[("t", 0, pid)] = (r.record.generation, 7)  # wrote 0..7, never renewed
    clock.now += 5_000  # within pid_retention_ms: the name still holds the PID
    leaders.expire("t", 0, pid, last_use_ms=r.record.created_ms + 10)
    before = len(leaders.state)
    with pytest.raises(UnknownPid, match="may have been"):
        lease(svc, producer_name="job")
    assert len(leaders.state) == before, "no fresh entry was created on the partition"
    assert leaders.leased_since[-1] == r.record.created_ms - 60_000


def test_renewal_of_an_unseen_partition_that_dropped_the_pid_is_unknown_pid(env: Any) -> None:
    svc, _store, leaders, clock = env
    r = lease(svc)
    pid, gen = r.record.pid, r.record.generation
    again = lease(svc, pid=pid, generation=gen, partition=1)
    assert again.sequence_number == 0  # joins the lease now: nothing of it was dropped there
    leaders.state[("t", 1, pid)] = (gen, 3)
    clock.now += 5_000
    leaders.expire("t", 1, pid, last_use_ms=clock.now - 4_000)
    with pytest.raises(UnknownPid):
        lease(svc, pid=pid, generation=gen, partition=1)


def test_renewing_a_partition_never_written_moves_its_lease_start(env: Any) -> None:
    # The SDK leases every partition of the topic and renews them all, written or not. Each
    # "no state, nothing lost" answer restarts the count, so an idle partition is judged
    # by what it dropped since the last renewal, not since the lease began.
    svc, store, leaders, clock = env
    r = lease(svc)
    pid, gen = r.record.pid, r.record.generation
    clock.now += 500
    checked = clock.now
    assert lease(svc, pid=pid, generation=gen).sequence_number == 0
    assert store.get_pid(pid)[0].partitions["t/0"] == {"seen": False, "added_ms": checked}
    # A PID used after this one's lease began but before the last renewal is dropped.
    leaders.dropped[("t", 0)] = r.record.created_ms - 60_000 + 100
    clock.now += 500
    assert lease(svc, pid=pid, generation=gen).sequence_number == 0
    leaders.dropped[("t", 0)] = clock.now - 60_000  # used since the renewal: it may be ours
    clock.now += 500
    with pytest.raises(UnknownPid):
        lease(svc, pid=pid, generation=gen)


def test_unseen_partition_where_only_older_pids_were_dropped_answers_zero(env: Any) -> None:
    svc, _store, leaders, clock = env
    leaders.dropped[("t", 0)] = clock.now - 61_000  # dropped before this PID's lease began
    r = lease(svc, producer_name="idle")
    clock.now += 500
    t = lease(svc, producer_name="idle")
    assert (t.kind, t.sequence_number) == (LeaseKind.TAKEOVER, 0)
    assert leaders.state[("t", 0, r.record.pid)][0] == t.record.generation, "entry created"
    again = lease(svc, pid=r.record.pid, generation=t.record.generation)
    assert (again.kind, again.sequence_number) == (LeaseKind.RENEW, 0)


def test_record_without_added_ms_counts_from_the_pid_creation(env: Any) -> None:
    svc, store, leaders, clock = env
    r = lease(svc, producer_name="old")
    rec, version = store.get_pid(r.record.pid)
    del rec.partitions["t/0"]["added_ms"]  # as written before the field existed
    assert store.cas_pid(rec, version)
    svc.records.drop(r.record.pid)
    clock.now += 10_000
    t = lease(svc, producer_name="old")
    assert t.sequence_number == 0
    assert leaders.leased_since[-1] == r.record.created_ms - 60_000


def test_takeover_fences_every_partition_before_answering(env: Any) -> None:
    svc, _store, leaders, _ = env
    r = lease(svc)
    pid, gen = r.record.pid, r.record.generation
    lease(svc, pid=pid, generation=gen, partition=1)
    leaders.state[("t", 0, pid)] = (gen, 9)
    lease(svc, pid=pid, generation=gen, partition=0)  # marks t/0 seen
    t = lease(svc, pid=pid, partition=2)
    assert (t.kind, t.record.generation, t.sequence_number) == (LeaseKind.TAKEOVER, gen + 1, 0)
    fences = sorted(c for c in leaders.calls if c[0] == "fence")
    assert [(c[3], c[5], c[6]) for c in fences] == [
        (0, gen + 1, False),
        (1, gen + 1, True),
        (2, gen + 1, True),
    ]
    assert all(leaders.state[("t", p, pid)][0] == gen + 1 for p in range(3))
    # The old generation is now fenced at the coordinator too.
    with pytest.raises(ProducerFenced):
        lease(svc, pid=pid, generation=gen)


def test_takeover_continues_the_sequence(env: Any) -> None:
    svc, store, leaders, _ = env
    r = lease(svc, producer_name="job")
    leaders.state[("t", 0, r.record.pid)] = (r.record.generation, 99)
    t = lease(svc, producer_name="job")
    assert (t.kind, t.record.pid, t.sequence_number) == (LeaseKind.TAKEOVER, r.record.pid, 100)
    assert store.get_pid(r.record.pid)[0].partitions["t/0"]["seen"] is True


def test_takeover_superseded_on_a_partition_is_fenced(env: Any) -> None:
    svc, _store, leaders, _ = env
    r = lease(svc)
    # A concurrent takeover already put a newer generation on the partition.
    leaders.state[("t", 0, r.record.pid)] = (r.record.generation + 5, 3)
    with pytest.raises(ProducerFenced) as exc:
        lease(svc, pid=r.record.pid)
    assert exc.value.extra["generation"] == r.record.generation + 1


def test_leader_down_is_retriable_and_changes_nothing_on_renew(env: Any) -> None:
    svc, store, leaders, _ = env
    r = lease(svc)
    before = store.get_pid(r.record.pid)
    leaders.down.add("127.0.0.1:9001")
    with pytest.raises(CoordinatorUnavailable):
        lease(svc, pid=r.record.pid, generation=r.record.generation)
    assert store.get_pid(r.record.pid) == before


def test_leader_not_live_is_retriable(env: Any) -> None:
    svc, store, _leaders, _ = env
    r = lease(svc)
    del store.nodes[cluster.server_path(1)]
    with pytest.raises(CoordinatorUnavailable, match="not live"):
        lease(svc, pid=r.record.pid, generation=r.record.generation)


def test_unknown_topic_and_partition(env: Any) -> None:
    svc, *_ = env
    with pytest.raises(UnknownTopicOrPartition):
        lease(svc, topic="nope")
    with pytest.raises(UnknownTopicOrPartition):
        lease(svc, partition=4)


def test_name_binding_new_takeover_and_rebind_after_retention(env: Any) -> None:
    svc, store, _leaders, clock = env
    a = lease(svc, producer_name="job")
    b = lease(svc, producer_name="job")
    assert b.record.pid == a.record.pid and b.record.generation == a.record.generation + 1
    other = lease(svc, producer_name="other")
    assert other.record.pid != a.record.pid
    clock.now = b.record.expires_at_ms + 10_000  # past retention
    c = lease(svc, producer_name="job")
    assert c.kind is LeaseKind.NEW and c.record.pid not in (a.record.pid, other.record.pid)
    assert store.get_name("job")[0] == c.record.pid
    with pytest.raises(UnknownPid):
        lease(svc, pid=a.record.pid, generation=b.record.generation)


def test_concurrent_takeovers_get_distinct_generations(env: Any) -> None:
    svc, store, _leaders, _ = env
    first = lease(svc, producer_name="job")
    gens: list[int] = []
    fenced: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            r = lease(svc, producer_name="job")
            with lock:
                gens.append(r.record.generation)
        except ProducerFenced as exc:
            with lock:
                fenced.append(int(exc.extra["generation"]))  # type: ignore[call-overload]

    threads = [threading.Thread(target=one) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = gens + fenced
    assert len(every) == 30
    assert sorted(every) == list(range(first.record.generation + 1, first.record.generation + 31))
    assert store.get_pid(first.record.pid)[0].generation == first.record.generation + 30


def test_sweep_deletes_past_retention_and_the_name(env: Any) -> None:
    svc, store, _leaders, clock = env
    old = lease(svc, producer_name="job")
    clock.now += 5_000
    young = lease(svc)
    clock.now = old.record.expires_at_ms + 10_000
    assert svc.sweep() == 1
    assert store.get_pid(old.record.pid) is None and store.get_name("job") is None
    assert store.get_pid(young.record.pid) is not None


def test_list_pids_states(env: Any) -> None:
    svc, _store, _leaders, clock = env
    a = lease(svc)
    clock.now += 800  # 200 ms left, window 300 -> expiring
    b = lease(svc)
    views = {v["pid"]: v for v in svc.list_pids(None, 100)}
    assert views[a.record.pid]["state"] == "expiring"
    assert views[b.record.pid]["state"] == "active"
    clock.now += 300
    assert [v["pid"] for v in svc.list_pids("lapsed", 100)] == [a.record.pid]
    assert len(svc.list_pids(None, 1)) == 1


def test_batch_answers_each_item_even_when_one_breaks(env: Any) -> None:
    svc, _store, _leaders, _ = env
    real = svc._lease

    def flaky(req: LeaseRequest) -> Any:
        if req.partition == 1:
            raise RuntimeError("bug")
        return real(req)

    svc._lease = flaky
    out = svc.lease_batch([LeaseRequest("t", 0), LeaseRequest("t", 1), LeaseRequest("nope", 0)])
    assert [o["error"] for o in out] == [
        "NONE",
        "COORDINATOR_UNAVAILABLE",
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]


# Issue 30, item 4: a takeover answers OK only when every leased partition holds the new
# generation; one whose state is gone (and may not be created) stays unfenced.
def test_takeover_with_a_leased_partition_left_unfenced_is_unknown_pid(env: Any) -> None:
    svc, _store, leaders, _ = env
    r = lease(svc, producer_name="job")
    pid, gen = r.record.pid, r.record.generation
    lease(svc, pid=pid, generation=gen, partition=1)
    leaders.state[("t", 0, pid)] = (gen, 4)
    leaders.state[("t", 1, pid)] = (gen, 6)
    for p in (0, 1):
        lease(svc, pid=pid, generation=gen, partition=p)  # both seen
    del leaders.state[("t", 1, pid)]  # the server expired the PID on t/1 only
    with pytest.raises(UnknownPid, match="t/1"):
        lease(svc, producer_name="job", partition=0)
    # t/0 was fenced all the same; t/1 holds nothing, so nothing there claims the new one.
    assert leaders.state[("t", 0, pid)] == (gen + 1, 4)
    assert ("t", 1, pid) not in leaders.state


def test_takeover_skips_no_partition_of_a_dedup_off_topic(env: Any) -> None:
    svc, store, leaders, _ = env
    store.add_topic("loose", 1, dedup="off")
    r = lease(svc, producer_name="job")
    pid, gen = r.record.pid, r.record.generation
    lease(svc, topic="loose", pid=pid, generation=gen)
    leaders.state[("t", 0, pid)] = (gen, 4)
    # A dedup=off partition keeps no state, so its FENCE never writes: that is no hole.
    leaders.dropped[("loose", 0)] = 10**12
    real_fence = leaders.fence

    def fence(address: str, topic: str, *a: Any, **kw: Any) -> Response:
        if topic == "loose":
            return Response(1, 0, "", existed=False, durable_highwater=-1)
        return real_fence(address, topic, *a, **kw)

    leaders.fence = fence
    t = lease(svc, producer_name="job")
    assert (t.kind, t.sequence_number) == (LeaseKind.TAKEOVER, 5)


# Issue 23, finding 2 / Build 3: state rebuilt below the highwater the coordinator recorded
# (a fence alone after retention and a cut) must not restart the producer below it.
def test_renewal_below_the_recorded_highwater_is_unknown_pid(env: Any) -> None:
    svc, store, leaders, _ = env
    r = lease(svc)
    pid, gen = r.record.pid, r.record.generation
    leaders.state[("t", 0, pid)] = (gen, 2)
    assert lease(svc, pid=pid, generation=gen).sequence_number == 3  # recorded: highwater 2
    leaders.state[("t", 0, pid)] = (gen, -1)  # rebuilt from a fence alone
    before = store.get_pid(pid)
    with pytest.raises(UnknownPid, match="below the 2"):
        lease(svc, pid=pid, generation=gen)
    assert store.get_pid(pid) == before


def test_takeover_below_the_recorded_highwater_is_unknown_pid(env: Any) -> None:
    svc, store, leaders, _ = env
    r = lease(svc, producer_name="job")
    pid, gen = r.record.pid, r.record.generation
    leaders.state[("t", 0, pid)] = (gen, 2)
    assert lease(svc, pid=pid, generation=gen).sequence_number == 3
    leaders.state[("t", 0, pid)] = (gen, -1)
    with pytest.raises(UnknownPid, match="below the 2"):
        lease(svc, producer_name="job")
    # What the takeover learnt never lowers the recorded highwater: still refused.
    with pytest.raises(UnknownPid, match="below the 2"):
        lease(svc, producer_name="job")
    assert store.get_pid(pid)[0].partitions["t/0"]["highwater"] == 2


# Issue 30, item 6: a renewal round (the lease keeper's batch of every partition) writes the
# PID record once, not once per partition.
def test_a_renewal_round_writes_the_pid_record_once(env: Any) -> None:
    svc, store, leaders, clock = env
    store.add_topic("wide", 50)
    r = lease(svc, topic="wide")
    pid, gen = r.record.pid, r.record.generation
    reqs = [LeaseRequest("wide", p, pid, None, gen) for p in range(50)]
    writes = store.writes
    added = svc.lease_batch(reqs[1:])
    assert [a["sequence_number"] for a in added] == [0] * 49
    assert store.writes - writes == 1, "adding 49 partitions is one write"
    for p in range(50):
        leaders.state[("wide", p, pid)] = (gen, p)
    clock.now += 400
    writes = store.writes
    out = svc.lease_batch(reqs)
    assert store.writes - writes == 1, "one renewal round, one write"
    assert [(o["error"], o["sequence_number"]) for o in out] == [("NONE", p + 1) for p in range(50)]
    assert {o["expires_at_ms"] for o in out} == {clock.now + 1_000}
    stored = store.get_pid(pid)[0]
    assert stored.expires_at_ms == clock.now + 1_000
    assert all(stored.partitions[f"wide/{p}"] == {"seen": True, "highwater": p} for p in range(50))
    assert len({o["lease_token"] for o in out}) == 1


def test_a_renewal_round_answers_each_partition_on_its_own(env: Any) -> None:
    svc, store, leaders, clock = env
    r = lease(svc)
    pid, gen = r.record.pid, r.record.generation
    reqs = [LeaseRequest("t", p, pid, None, gen) for p in range(4)]
    svc.lease_batch(reqs)
    for p in range(4):
        leaders.state[("t", p, pid)] = (gen, 3)
    svc.lease_batch(reqs)  # all seen, highwater 3
    del leaders.state[("t", 1, pid)]  # expired on the server
    leaders.state[("t", 2, pid)] = (gen, 1)  # rebuilt below the recorded highwater
    leaders.down.add("127.0.0.1:9001")
    before = store.get_pid(pid)
    out = svc.lease_batch([*reqs, LeaseRequest("t", 9, pid, None, gen)])
    assert [o["error"] for o in out] == ["COORDINATOR_UNAVAILABLE"] * 4 + [
        "UNKNOWN_TOPIC_OR_PARTITION"
    ]
    assert store.get_pid(pid) == before, "nothing succeeded: nothing written"
    leaders.down.clear()
    svc.addresses.drop("t/0")  # (the down leader's address was forgotten per partition)
    clock.now += 100
    out = svc.lease_batch(reqs)
    assert [o["error"] for o in out] == ["NONE", "UNKNOWN_PID", "UNKNOWN_PID", "NONE"]
    assert [out[0]["sequence_number"], out[3]["sequence_number"]] == [4, 4]
    stored = store.get_pid(pid)[0]
    assert stored.expires_at_ms == clock.now + 1_000
    assert stored.partitions["t/2"]["highwater"] == 3, "the lower report is not recorded"


def test_a_renewal_round_with_a_stale_generation_is_fenced_item_by_item(env: Any) -> None:
    svc, store, _leaders, _ = env
    r = lease(svc, producer_name="job")
    pid, gen = r.record.pid, r.record.generation
    svc.lease_batch([LeaseRequest("t", p, pid, None, gen) for p in range(3)])
    t = lease(svc, producer_name="job")
    assert t.record.generation == gen + 1
    out = svc.lease_batch([LeaseRequest("t", p, pid, None, gen) for p in range(3)])
    assert [o["error"] for o in out] == ["FENCED"] * 3
    # Runs are split where the key changes: a takeover in the middle is its own item, and
    # the renewals after it see its generation.
    out = svc.lease_batch(
        [
            LeaseRequest("t", 0, pid, None, gen + 1),
            LeaseRequest("t", 1, pid, None, None),
            LeaseRequest("t", 2, pid, None, gen + 1),
            LeaseRequest("t", 3, pid, None, gen + 2),
            LeaseRequest("t", 0, pid, None, gen + 2),
        ]
    )
    assert [(o["error"], o.get("kind")) for o in out] == [
        ("NONE", "renew"),
        ("NONE", "takeover"),
        ("FENCED", None),
        ("NONE", "renew"),
        ("NONE", "renew"),
    ]
    assert set(store.get_pid(pid)[0].partitions) == {"t/0", "t/1", "t/2", "t/3"}


def test_a_renewal_round_retries_its_write_on_a_moved_version(env: Any) -> None:
    svc, store, _leaders, _ = env
    r = lease(svc)
    pid, gen = r.record.pid, r.record.generation
    real_cas = store.cas_pid
    moved = []

    def cas_pid(record: Any, version: int) -> bool:
        if not moved:  # another coordinator renewed meanwhile
            moved.append(version)
            got = store.get_pid(pid)
            assert real_cas(got[0], got[1])
            return False
        return bool(real_cas(record, version))

    store.cas_pid = cas_pid
    out = svc.lease_batch([LeaseRequest("t", p, pid, None, gen) for p in range(3)])
    assert [o["error"] for o in out] == ["NONE"] * 3
    assert moved and set(store.get_pid(pid)[0].partitions) == {"t/0", "t/1", "t/2"}


def test_a_fenced_renewal_round_is_recorded_per_item_in_the_event_log() -> None:
    from coordinator.events import EventLog, ObservedLeaseService

    store, leaders, clock = FakeStore(), FakeLeaders(), ManualClock()
    store.add_topic("t", 4)
    store.add_server(1, 9001)
    settings = CoordinatorSettings(zk="x", pid_block_size=10)
    svc = ObservedLeaseService(
        settings,
        store,
        PidAllocator(store, 10),
        leaders,
        Metrics(),
        clock_ms=clock,
        events=EventLog("c1", clock_ms=clock),
    )
    try:
        r = svc.lease(LeaseRequest("t", 0, producer_name="job"))
        svc.lease(LeaseRequest("t", 0, producer_name="job"))  # takeover: generation + 1
        out = svc.lease_batch(
            [LeaseRequest("t", p, r.record.pid, None, r.record.generation) for p in range(3)]
        )
        assert [o["error"] for o in out] == ["FENCED"] * 3
        kinds = sorted(e["kind"] for e in svc.events.recent())
        assert kinds == ["fenced_lease"] * 3 + ["takeover"]
    finally:
        svc.close()


def test_a_renewal_round_with_a_slow_leader_is_bounded_and_frees_the_pool() -> None:
    """One slow leader server (its PRODUCER_STATES takes longer than the round's deadline)
    fails its partitions' items only; the fast leader's items succeed, and the round does
    not wait for the slow call."""
    store, leaders, clock = FakeStore(), FakeLeaders(), ManualClock()
    store.add_topic("t", 10)  # led by server 1
    store.add_topic("u", 10, leader=2)
    store.add_server(1, 9001)
    store.add_server(2, 9002)
    settings = CoordinatorSettings(
        zk="x", pid_block_size=10, leader_request_timeout_ms=100, fence_parallelism_max=2
    )
    svc = LeaseService(settings, store, PidAllocator(store, 10), leaders, Metrics(), clock_ms=clock)
    real = leaders.producer_states

    def slow(address: str, *a: Any) -> list[Response]:
        if address.endswith(":9002"):
            time.sleep(3.0)
        return real(address, *a)

    leaders.producer_states = slow  # type: ignore[method-assign]
    try:
        r = svc.lease(LeaseRequest("t", 0))
        reqs = [LeaseRequest("t", p, r.record.pid, None, r.record.generation) for p in range(10)]
        reqs += [LeaseRequest("u", p, r.record.pid, None, r.record.generation) for p in range(10)]
        started = time.monotonic()
        out = svc.lease_batch(reqs)
        took = time.monotonic() - started
        # The round's deadline is 2 x (100 ms + 10 x 30 ms), once per attempt: 1.6 s.
        assert took < 2.5, took
        assert [o["error"] for o in out[:10]] == ["NONE"] * 10
        assert [o["error"] for o in out[10:]] == ["COORDINATOR_UNAVAILABLE"] * 10
        # The items that succeeded are in the record; the others were not written.
        stored = store.get_pid(r.record.pid)[0]
        assert set(stored.partitions) == {f"t/{p}" for p in range(10)}
        # One request per leader server and attempt, not one per partition.
        assert len(leaders.many_calls) <= 3, leaders.many_calls
    finally:
        svc.close()


# Issue 24: what a lease of many partitions needs from the leaders, one request per server.
@pytest.fixture
def two_servers() -> Any:
    store, leaders, clock = FakeStore(), FakeLeaders(), ManualClock()
    store.add_topic("t", 10)  # led by server 1
    store.add_topic("u", 12, leader=2)
    store.add_server(1, 9001)
    store.add_server(2, 9002)
    svc = LeaseService(
        CoordinatorSettings(zk="x", pid_block_size=10),
        store,
        PidAllocator(store, 10),
        leaders,
        Metrics(),  # type: ignore[arg-type]
        clock_ms=clock,
    )
    yield svc, store, leaders
    svc.close()


def _all(svc: LeaseService, pid: int, gen: int) -> list[dict[str, Any]]:
    reqs = [LeaseRequest("t", p, pid, None, gen) for p in range(10)]
    reqs += [LeaseRequest("u", p, pid, None, gen) for p in range(12)]
    return svc.lease_batch(reqs)


def test_a_renewal_round_and_a_takeover_ask_each_leader_server_once(two_servers: Any) -> None:
    svc, store, leaders = two_servers
    r = svc.lease(LeaseRequest("t", 0, producer_name="wide"))
    pid, gen = r.record.pid, r.record.generation
    out = _all(svc, pid, gen)
    assert [o["error"] for o in out] == ["NONE"] * 22
    assert sorted(leaders.many_calls) == [
        ("states", "127.0.0.1:9001", 10),
        ("states", "127.0.0.1:9002", 12),
    ]
    leaders.many_calls.clear()
    t = svc.lease(LeaseRequest("t", 0, producer_name="wide"))  # takeover: fences all 22
    assert t.kind is LeaseKind.TAKEOVER and t.record.generation == gen + 1
    assert sorted(leaders.many_calls) == [
        ("fences", "127.0.0.1:9001", 10),
        ("fences", "127.0.0.1:9002", 12),
    ]
    fenced = {(c[2], c[3]) for c in leaders.calls if c[0] == "fence" and c[5] == gen + 1}
    assert fenced == {("t", p) for p in range(10)} | {("u", p) for p in range(12)}
    assert len(store.get_pid(pid)[0].partitions) == 22


def test_a_partition_answered_not_leader_is_asked_again_once_alone(two_servers: Any) -> None:
    svc, _store, leaders = two_servers
    r = svc.lease(LeaseRequest("t", 0))
    pid, gen = r.record.pid, r.record.generation
    real = leaders.producer_states
    refused: list[int] = []

    def moving(address: str, pid_: int, partitions: list[tuple[str, int]]) -> list[Response]:
        got = real(address, pid_, partitions)
        if ("u", 5) in partitions and not refused:
            refused.append(1)  # the first time only: the leader was moving
            i = partitions.index(("u", 5))
            got[i] = Response(0, NotLeader.code, "this server does not lead u/5")
        return got

    leaders.producer_states = moving  # type: ignore[method-assign]
    out = _all(svc, pid, gen)
    assert [o["error"] for o in out] == ["NONE"] * 22
    assert ("states", "127.0.0.1:9002", 1) in leaders.many_calls  # u/5 again, alone


def test_a_leader_refusing_a_partition_twice_fails_that_item_only(two_servers: Any) -> None:
    svc, store, leaders = two_servers
    r = svc.lease(LeaseRequest("t", 0))
    pid, gen = r.record.pid, r.record.generation
    real = leaders.producer_states

    def refusing(address: str, pid_: int, partitions: list[tuple[str, int]]) -> list[Response]:
        got = real(address, pid_, partitions)
        return [
            Response(0, NotLeader.code, "not leading u/5") if tp == ("u", 5) else g
            for tp, g in zip(partitions, got, strict=True)
        ]

    leaders.producer_states = refusing  # type: ignore[method-assign]
    out = _all(svc, pid, gen)
    errors_ = [o["error"] for o in out]
    assert errors_[10 + 5] == "COORDINATOR_UNAVAILABLE" and "NOT_LEADER" in out[15]["detail"]
    assert errors_.count("NONE") == 21
    assert "u/5" not in store.get_pid(pid)[0].partitions


def test_zookeeper_failing_the_leader_lookup_fails_each_item_not_the_batch(
    two_servers: Any,
) -> None:
    svc, store, _leaders = two_servers
    r = svc.lease(LeaseRequest("t", 0))
    pid, gen = r.record.pid, r.record.generation
    before = store.get_pid(pid)

    def down(*a: Any) -> Any:
        raise CoordinatorUnavailable("ZooKeeper did not answer")

    store.get_partition_states = down  # type: ignore[method-assign]
    out = _all(svc, pid, gen)
    assert [o["error"] for o in out] == ["COORDINATOR_UNAVAILABLE"] * 22
    assert "ZooKeeper did not answer" in out[0]["detail"]
    assert store.get_pid(pid) == before


def test_leader_addresses_that_expire_during_the_lookup_of_others_are_still_asked(
    two_servers: Any,
) -> None:
    """The cached leaders of t/* are fresh when a renewal round starts; looking up the
    leaders of u/* (not cached) in ZooKeeper outlasts their time to live (a loaded machine,
    3000 partitions): the round must still ask t/*'s leader with the addresses it started
    from. It used to read the cache again after the lookup, find t/* gone, ask nobody for
    them and fail the whole request with KeyError: 't/0' (an HTTP 500; seen at P=3000 in
    bench/bench_partitions.py as KeyError: 'wide/2001')."""
    from coordinator.lease_cache import AddressCache

    svc, store, _leaders = two_servers
    now = [0.0]
    svc.addresses = AddressCache(1_000, clock_s=lambda: now[0])
    r = svc.lease(LeaseRequest("t", 0))
    pid, gen = r.record.pid, r.record.generation
    assert [o["error"] for o in _all(svc, pid, gen)] == ["NONE"] * 22  # caches all 22
    for p in range(12):
        svc.addresses.drop(f"u/{p}")
    real = store.get_partition_states

    def slow(topic: str, parts: list[int]) -> Any:
        now[0] += 2.0  # past the time to live of everything cached before
        return real(topic, parts)

    store.get_partition_states = slow  # type: ignore[method-assign]
    out = _all(svc, pid, gen)
    assert [o["error"] for o in out] == ["NONE"] * 22


# -- partitions added after the topic was cached (issue 25)
def test_a_partition_added_after_the_topic_was_cached_can_be_leased(env: Any) -> None:
    """Issue 25 (CreatePartitions from a Kafka admin client bypasses this coordinator): a
    partition added after the lease service cached its topic can be leased, not refused
    UNKNOWN_TOPIC_OR_PARTITION for good."""

    svc, store, _leaders, _clock = env
    r = lease(svc)  # the topic "t" (4 partitions) is cached now
    pid, gen = r.record.pid, r.record.generation
    with pytest.raises(UnknownTopicOrPartition):
        lease(svc, partition=4, pid=pid, generation=gen)
    store.add_topic("t", 6)  # grown in ZooKeeper by someone else
    got = lease(svc, partition=5, pid=pid, generation=gen)
    assert got.record.pid == pid and got.record.generation == gen
    # A renewal round naming old and new partitions: every item answered with a lease.
    answers = svc.lease_batch(
        [LeaseRequest(topic="t", partition=p, pid=pid, generation=gen) for p in range(6)]
    )
    assert all("lease_token" in a for a in answers), answers
    with pytest.raises(UnknownTopicOrPartition):
        lease(svc, partition=6, pid=pid, generation=gen)  # still beyond: refused


def test_a_renewal_round_without_the_address_cache_answers_every_item() -> None:
    """Issue 25 (CreatePartitions from a Kafka admin client bypasses this coordinator): a
    partition added after the lease service cached its topic can be leased, not refused
    UNKNOWN_TOPIC_OR_PARTITION for good."""

    # The leaders' addresses were read from ZooKeeper, put in the cache and read back from
    # it; with the cache off (leader_address_cache_ms=0), or an entry dropped or expired
    # by another request in between, a partition had no answer at all and the round died
    # on a KeyError (seen once in test_sdk_producer_new_partitions: "internal error
    # (KeyError)" for a renewal, a retriable failure only by luck of the catch-all).
    from coordinator.allocator import PidAllocator
    from coordinator.metrics import Metrics
    from coordinator.service import LeaseService
    from coordinator.settings import CoordinatorSettings
    from coordinator.testing import FakeStore
    from tests.helpers import ManualClock
    from tests.unit.coordinator.test_service import FakeLeaders

    store, leaders, clock = FakeStore(), FakeLeaders(), ManualClock()
    store.add_topic("t", 4)
    store.add_server(1, 9001)
    svc = LeaseService(
        CoordinatorSettings(zk="x", pid_block_size=10, leader_address_cache_ms=0),
        store,
        PidAllocator(store, 10),
        leaders,
        Metrics(),  # type: ignore[arg-type]
        clock_ms=clock,
    )
    try:
        r = lease(svc)
        pid, gen = r.record.pid, r.record.generation
        answers = svc.lease_batch(
            [LeaseRequest(topic="t", partition=p, pid=pid, generation=gen) for p in range(4)]
        )
        assert all("lease_token" in a for a in answers), answers
    finally:
        svc.close()
