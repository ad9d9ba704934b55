"""The pure lease rules (coordinator/leases.py): examples, then a hypothesis state machine
that drives new / renew / takeover / fenced / unknown / retention against a tiny
reference model written independently of the rules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from coordinator import leases
from coordinator.leases import ExpiryLimits, LeaseKind, LeaseRequest, LeaseState
from pidlease.errors import InvalidRequest, ProducerFenced, UnknownPid
from pidlease.wire.cluster import PidRecord
from pidlease.wire.protocol import MAX_GENERATION

LIMITS = ExpiryLimits(
    default_ms=1_000, min_ms=100, max_ms=10_000, retention_ms=5_000, expiring_window_ms=300
)


def rec(
    pid: int = 7,
    generation: int = 10,
    expires_at_ms: int = 2_000,
    expire_ms: int = 1_000,
    name: str | None = None,
    partitions: dict | None = None,
) -> PidRecord:
    return PidRecord(
        pid=pid,
        generation=generation,
        producer_name=name,
        expire_ms=expire_ms,
        expires_at_ms=expires_at_ms,
        last_use_ms=expires_at_ms - expire_ms,
        partitions=partitions or {},
    )


def req(
    pid: int = 7,
    generation: int | None = None,
    name: str | None = None,
    expire_ms: int | None = None,
    partition: int = 0,
) -> LeaseRequest:
    return LeaseRequest("t", partition, pid, expire_ms, generation, name)


# -- examples: one per row of the contract's table ------------------------------------------
def test_new_pid_without_name() -> None:
    assert leases.classify(req(pid=-1), None, 0, LIMITS) is LeaseKind.NEW


def test_known_name_is_a_takeover_and_new_name_is_new() -> None:
    assert (
        leases.classify(req(pid=-1, name="job"), rec(name="job"), 1_000, LIMITS)
        is LeaseKind.TAKEOVER
    )
    assert leases.classify(req(pid=-1, name="job"), None, 1_000, LIMITS) is LeaseKind.NEW


def test_name_past_retention_gets_a_new_pid() -> None:
    r = rec(name="job", expires_at_ms=2_000)
    assert leases.classify(req(pid=-1, name="job"), r, 2_000 + 5_000, LIMITS) is LeaseKind.NEW
    assert leases.classify(req(pid=-1, name="job"), r, 2_000 + 4_999, LIMITS) is LeaseKind.TAKEOVER


def test_renew_takeover_fenced_and_never_issued() -> None:
    r = rec(generation=10)
    assert leases.classify(req(generation=10), r, 0, LIMITS) is LeaseKind.RENEW
    assert leases.classify(req(generation=None), r, 0, LIMITS) is LeaseKind.TAKEOVER
    with pytest.raises(ProducerFenced) as fenced:
        leases.classify(req(generation=9), r, 0, LIMITS)
    assert fenced.value.extra["current_generation"] == 10
    with pytest.raises(InvalidRequest):
        leases.classify(req(generation=11), r, 0, LIMITS)


def test_unknown_and_past_retention_pid() -> None:
    with pytest.raises(UnknownPid):
        leases.classify(req(generation=1), None, 0, LIMITS)
    with pytest.raises(UnknownPid):
        leases.classify(req(generation=10), rec(expires_at_ms=2_000), 7_000, LIMITS)


def test_a_lapsed_lease_within_retention_can_still_be_renewed() -> None:
    assert (
        leases.classify(req(generation=10), rec(expires_at_ms=2_000), 3_000, LIMITS)
        is LeaseKind.RENEW
    )


def test_name_mismatch_and_generation_with_new_pid_are_invalid() -> None:
    with pytest.raises(InvalidRequest):
        leases.classify(req(name="other"), rec(name="job"), 0, LIMITS)
    with pytest.raises(InvalidRequest):
        leases.classify(req(pid=-1, generation=3), None, 0, LIMITS)


def test_takeover_raises_generation_and_adds_partition() -> None:
    r = rec(generation=10, partitions={"t/0": {"seen": True, "highwater": 4}})
    out = leases.taken_over(r, req(partition=3, expire_ms=50), 5_000, LIMITS)
    assert out.generation == 11
    assert out.expire_ms == 100  # clamped up to the minimum
    assert out.expires_at_ms == 5_100
    assert out.partitions == {
        "t/0": {"seen": True, "highwater": 4},
        "t/3": {"seen": False, "added_ms": 5_000},
    }
    assert r.partitions == {"t/0": {"seen": True, "highwater": 4}}, "input record untouched"


def test_takeover_at_the_last_generation_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        leases.taken_over(rec(generation=MAX_GENERATION), req(), 0, LIMITS)


def test_renew_keeps_generation_and_pushes_expiry() -> None:
    out = leases.renewed(
        rec(generation=10, expires_at_ms=2_000), req(expire_ms=10**18), 1_500, LIMITS
    )
    assert (out.generation, out.expire_ms, out.expires_at_ms, out.last_use_ms) == (
        10,
        10_000,
        11_500,
        1_500,
    )


@given(st.one_of(st.none(), st.integers(min_value=1, max_value=2**63 - 1)))
def test_clamp_stays_in_range(expire_ms: int | None) -> None:
    got = LIMITS.clamp(expire_ms)
    assert LIMITS.min_ms <= got <= LIMITS.max_ms
    if expire_ms is not None and LIMITS.min_ms <= expire_ms <= LIMITS.max_ms:
        assert got == expire_ms


def test_next_sequence_rules() -> None:
    assert leases.next_sequence(7, "t/0", seen=False, found=True, durable_highwater=41) == 42
    assert leases.next_sequence(7, "t/0", seen=True, found=True, durable_highwater=41) == 42
    assert leases.next_sequence(7, "t/0", seen=False, found=False, durable_highwater=-1) == 0
    with pytest.raises(UnknownPid):
        leases.next_sequence(7, "t/0", seen=True, found=False, durable_highwater=-1)


def test_unseen_partition_that_may_have_lost_the_state_is_unknown_pid() -> None:
    # Issue 12, finding 6: the partition dropped a PID used at 5_000; this PID's lease of it
    # began at 4_000 (by the server's clock), so the dropped state may have been its own.
    with pytest.raises(UnknownPid):
        leases.next_sequence(
            7,
            "t/0",
            seen=False,
            found=False,
            durable_highwater=-1,
            dropped_last_use_max_ms=5_000,
            leased_since_ms=4_000,
        )
    with pytest.raises(UnknownPid):
        leases.next_sequence(
            7,
            "t/0",
            seen=False,
            found=False,
            durable_highwater=-1,
            dropped_last_use_max_ms=5_000,
            leased_since_ms=5_000,
        )
    assert (
        leases.next_sequence(
            7,
            "t/0",
            seen=False,
            found=False,
            durable_highwater=-1,
            dropped_last_use_max_ms=5_000,
            leased_since_ms=5_001,
        )
        == 0
    )
    assert (
        leases.next_sequence(
            7,
            "t/0",
            seen=False,
            found=False,
            durable_highwater=-1,
            dropped_last_use_max_ms=5_000,
            leased_since_ms=0,
        )
        == 0
    )
    assert (
        leases.next_sequence(
            7,
            "t/0",
            seen=False,
            found=True,
            durable_highwater=3,
            dropped_last_use_max_ms=5_000,
            leased_since_ms=4_000,
        )
        == 4
    )


def test_next_sequence_is_never_at_or_below_the_recorded_highwater() -> None:
    # Issue 23, finding 2: a partition rebuilt the PID from a fence alone (highwater -1)
    # although its leader had reported durable highwater 2 before.
    with pytest.raises(UnknownPid, match="below the 2"):
        leases.next_sequence(
            7, "t/0", seen=True, found=True, durable_highwater=-1, recorded_highwater=2
        )
    with pytest.raises(UnknownPid):
        leases.next_sequence(
            7, "t/0", seen=True, found=True, durable_highwater=1, recorded_highwater=2
        )
    assert (
        leases.next_sequence(
            7, "t/0", seen=True, found=True, durable_highwater=2, recorded_highwater=2
        )
        == 3
    )
    r = rec(partitions={"t/0": {"seen": True, "highwater": 2}, "t/1": {"seen": False}})
    assert leases.recorded_highwater(r, "t/0") == 2
    assert leases.recorded_highwater(r, "t/1") == -1
    assert leases.recorded_highwater(r, "t/9") == -1
    assert leases.mark_seen(r, "t/0", -1).partitions["t/0"]["highwater"] == 2, "never lowered"
    assert leases.mark_seen(r, "t/0", 5).partitions["t/0"]["highwater"] == 5
    assert leases.mark_seen(r, "t/1", 0).partitions["t/1"] == {"seen": True, "highwater": 0}


def test_takeover_with_a_partition_left_unfenced_is_unknown_pid() -> None:
    r = rec(
        partitions={"t/0": {"seen": True, "highwater": 4}, "t/1": {"seen": True, "highwater": 9}}
    )
    fenced0 = leases.FenceAnswer(existed=True, created=False, durable_highwater=4)
    since = {"t/0": 1, "t/1": 1}
    with pytest.raises(UnknownPid, match="t/1"):
        leases.takeover_sequence(r, "t/0", {"t/0": fenced0, "t/1": leases.NOT_FENCED}, since)
    with pytest.raises(UnknownPid, match="t/1"):
        leases.takeover_sequence(r, "t/0", {"t/0": fenced0}, since)  # no answer: not fenced
    assert leases.takeover_sequence(r, "t/0", {"t/0": fenced0}, since, untracked=["t/1"]) == 5
    created = leases.FenceAnswer(existed=False, created=True)
    fresh = rec(partitions={"t/0": {"seen": False, "added_ms": 5}})
    assert leases.takeover_sequence(fresh, "t/0", {"t/0": created}, {"t/0": 1}) == 0


def test_leased_since_comes_from_added_ms_or_the_pid_creation() -> None:
    r = rec(partitions={"t/0": {"seen": False, "added_ms": 90_000}, "t/1": {"seen": False}})
    assert leases.leased_since(r, "t/0", 60_000) == 30_000
    assert leases.leased_since(r, "t/1", 60_000) == max(1, r.created_ms - 60_000)
    assert leases.leased_since(r, "t/2", 60_000) == 0, "joins the lease now"
    assert leases.leased_since(None, "t/0", 60_000) == 0
    assert leases.leased_since(r, "t/0", 10**9) == 1, "never 0 (= unknown) for a known one"
    assert leases.renewed(r, req(partition=2), 7_000, LIMITS).partitions["t/2"] == {
        "seen": False,
        "added_ms": 7_000,
    }


def test_mark_nothing_lost_moves_added_ms_of_an_unseen_partition_only_forward() -> None:
    r = rec(
        partitions={
            "t/0": {"seen": False, "added_ms": 1_000},
            "t/1": {"seen": True, "highwater": 4},
        }
    )
    out = leases.mark_nothing_lost(r, "t/0", 9_000)
    assert out.partitions["t/0"] == {"seen": False, "added_ms": 9_000}
    assert r.partitions["t/0"]["added_ms"] == 1_000, "input record untouched"
    assert leases.mark_nothing_lost(out, "t/0", 5_000) is out, "never backwards"
    assert leases.mark_nothing_lost(r, "t/1", 9_000) is r, "a seen partition keeps its form"
    assert leases.mark_nothing_lost(r, "t/7", 9_000) is r


@pytest.mark.parametrize(
    ("left_ms", "expire_ms", "window_ms", "state"),
    [
        (1_000, 1_000, 30_000, LeaseState.ACTIVE),
        (501, 1_000, 30_000, LeaseState.ACTIVE),
        (500, 1_000, 30_000, LeaseState.EXPIRING),  # half the lease is below the window
        (1, 1_000, 30_000, LeaseState.EXPIRING),
        (0, 1_000, 30_000, LeaseState.LAPSED),
        (-5, 1_000, 30_000, LeaseState.LAPSED),
        (30_000, 60_000, 30_000, LeaseState.EXPIRING),  # the window is the smaller bound
        (30_001, 60_000, 30_000, LeaseState.ACTIVE),
        (300, 1_000, 300, LeaseState.EXPIRING),
        (301, 1_000, 300, LeaseState.ACTIVE),
    ],
)
def test_lease_state(left_ms: int, expire_ms: int, window_ms: int, state: LeaseState) -> None:
    r = rec(expires_at_ms=10_000, expire_ms=expire_ms)
    assert leases.lease_state(r, 10_000 - left_ms, window_ms) is state


# -- state machine against a reference model ------------------------------------------------
NAMES = ("a", "b")


class LeaseMachine(RuleBasedStateMachine):
    """The system under test is leases.* applied to a dict of records (what ZooKeeper
    would hold); the model is a few dicts and the contract's table in plain ifs."""

    @initialize()
    def setup(self) -> None:
        self.now = 1_000
        self.next_pid = 1
        self.records: dict[int, PidRecord] = {}
        self.bindings: dict[str, int] = {}
        # model: pid -> [generation, expires_at_ms, name]
        self.model: dict[int, list] = {}
        self.model_names: dict[str, int] = {}

    def _alive(self, pid: int) -> bool:
        m = self.model.get(pid)
        return m is not None and self.now < m[1] + LIMITS.retention_ms

    def _sut(
        self, r: LeaseRequest, record: PidRecord | None, gen0: int
    ) -> tuple[str, PidRecord | None]:
        try:
            kind = leases.classify(r, record, self.now, LIMITS)
        except ProducerFenced:
            return "fenced", None
        except UnknownPid:
            return "unknown", None
        except InvalidRequest:
            return "invalid", None
        if kind is LeaseKind.NEW:
            out = leases.new_record(r, self.next_pid, gen0, self.now, LIMITS)
            self.next_pid += 1
        else:
            assert record is not None
            out = leases.apply(kind, record, r, self.now, LIMITS)
        self.records[out.pid] = out
        if r.producer_name is not None:
            self.bindings[r.producer_name] = out.pid
        return kind.value, out

    @rule(
        name=st.one_of(st.none(), st.sampled_from(NAMES)),
        gen0=st.integers(0, 2**30 - 1),
        expire_ms=st.one_of(st.none(), st.integers(1, 20_000)),
    )
    def lease_new(self, name: str | None, gen0: int, expire_ms: int | None) -> None:
        r = LeaseRequest("t", 0, -1, expire_ms, None, name)
        bound = self.bindings.get(name) if name else None
        got, out = self._sut(r, self.records.get(bound) if bound else None, gen0)
        exp = LIMITS.clamp(expire_ms)
        mpid = self.model_names.get(name) if name else None
        if mpid is not None and self._alive(mpid):
            assert got == "takeover"
            self.model[mpid][0] += 1
            self.model[mpid][1] = self.now + exp
            assert out is not None and out.pid == mpid
        else:
            assert got == "new"
            assert out is not None and out.generation == gen0 and out.pid not in self.model
            self.model[out.pid] = [gen0, self.now + exp, name]
            if name:
                self.model_names[name] = out.pid
        assert out.generation == self.model[out.pid][0]
        assert out.expires_at_ms == self.model[out.pid][1]

    @precondition(lambda self: bool(self.model))
    @rule(
        data=st.data(),
        delta=st.sampled_from([None, -1, 0, 1]),
        expire_ms=st.one_of(st.none(), st.integers(1, 20_000)),
    )
    def lease_pid(self, data: st.DataObject, delta: int | None, expire_ms: int | None) -> None:
        pid = data.draw(st.sampled_from(sorted(self.model)))
        m = self.model[pid]
        gen = None if delta is None else max(0, m[0] + delta)
        r = LeaseRequest("t", 0, pid, expire_ms, gen, None)
        got, out = self._sut(r, self.records.get(pid), 0)
        if not self._alive(pid):
            assert got == "unknown"
        elif gen is None:
            assert got == "takeover"
            m[0] += 1
        elif gen < m[0]:
            assert got == "fenced"
        elif gen > m[0]:
            assert got == "invalid"
        else:
            assert got == "renew"
        if out is not None:
            m[1] = self.now + LIMITS.clamp(expire_ms)
            assert (out.generation, out.expires_at_ms) == (m[0], m[1])

    @precondition(lambda self: bool(self.model))
    @rule()
    def unknown_pid(self) -> None:
        got, _ = self._sut(LeaseRequest("t", 0, self.next_pid + 100, None, 1, None), None, 0)
        assert got == "unknown"

    @rule(ms=st.sampled_from([1, 99, 500, 1_000, 4_999, 5_000, 20_000]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def states_follow_time(self) -> None:
        for pid, record in self.records.items():
            state = leases.lease_state(record, self.now, LIMITS.expiring_window_ms)
            left = self.model[pid][1] - self.now
            assert (state is LeaseState.LAPSED) == (left <= 0)

    @invariant()
    def generations_only_grow(self) -> None:
        for pid, record in self.records.items():
            assert record.generation == self.model[pid][0]


TestLeaseMachine = LeaseMachine.TestCase
TestLeaseMachine.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- takeover fences against the contract ----------------------------------------------------
# The contract: "A takeover returns only after every partition the PID has written to has
# recorded the new generation" (dedup=off partitions keep no state and need none), and the
# sequence it answers continues after the partition's durable highwater, never at or below
# the highwater the coordinator recorded for it (issue 23, Build 3); otherwise UNKNOWN_PID.
FENCE_ANSWERS = st.one_of(
    st.builds(
        leases.FenceAnswer,
        existed=st.just(True),
        created=st.just(False),
        durable_highwater=st.integers(-1, 6),
    ),
    st.just(leases.FenceAnswer(existed=False, created=True)),
    st.just(leases.NOT_FENCED),
)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.dictionaries(
        st.sampled_from(["t/0", "t/1", "t/2", "u/0"]),
        st.tuples(FENCE_ANSWERS, st.integers(-1, 6), st.booleans()),
        min_size=1,
    ),
    data=st.data(),
)
def test_takeover_sequence_follows_the_contract(
    parts: dict[str, tuple[leases.FenceAnswer, int, bool]], data: st.DataObject
) -> None:
    tp = data.draw(st.sampled_from(sorted(parts)))
    # parts: partition -> (its FENCE answer, the highwater recorded for it, dedup off?)
    partitions: dict[str, dict[str, object]] = {}
    for t, (_, recorded, off) in parts.items():
        partitions[t] = (
            {"seen": True, "highwater": recorded}
            if recorded >= 0 and not off
            else {"seen": False, "added_ms": 1}
        )
    record = rec(partitions=partitions)
    # A dedup=off partition keeps no state: its FENCE writes nothing and finds nothing.
    answers = {
        t: leases.NOT_FENCED if off else a
        for t, (a, _, off) in parts.items()
        if data.draw(st.integers(0, 9)) > 0
    }
    untracked = [t for t, (_, _, off) in parts.items() if off]

    # The reference, from the contract's words only.
    expected: int | str
    if any(
        not off and not (t in answers and (answers[t].existed or answers[t].created))
        for t, (_, _, off) in parts.items()
    ):
        expected = "UNKNOWN_PID"
    else:
        _, recorded, off = parts[tp]
        if off:
            expected = 0
        else:
            hw = answers[tp].durable_highwater if answers[tp].existed else -1
            expected = "UNKNOWN_PID" if hw < recorded else hw + 1

    try:
        got: int | str = leases.takeover_sequence(
            record, tp, answers, dict.fromkeys(parts, 1), untracked
        )
    except UnknownPid:
        got = "UNKNOWN_PID"
    assert got == expected, (tp, parts, answers)


class RecordedHighwaterMachine(RuleBasedStateMachine):
    """One partition's life under renewals and takeovers. The system under test is the
    lease rules as service.py applies them (next_sequence / takeover_sequence, then
    mark_seen); the model knows the truth: what is durable in the log (``acked``), what
    the server's producer state says (``server``, lower after a rebuild that lost
    batches), and the highwaters the coordinator was told in OK answers."""

    @initialize()
    def setup(self) -> None:
        self.record = rec(partitions={"t/0": {"seen": False, "added_ms": 1}})
        self.acked = -1
        self.server: int | None = -1  # None: no state (not written yet counts as -1 here)
        self.written = False
        self.reported = -1  # the largest durable highwater told to the coordinator

    @precondition(lambda self: self.server == self.acked)
    @rule(n=st.integers(1, 3))
    def append(self, n: int) -> None:
        self.acked += n
        self.server = self.acked
        self.written = True

    @precondition(lambda self: self.acked >= 0)
    @rule(data=st.data())
    def rebuild_losing_batches(self, data: st.DataObject) -> None:
        # e.g. retention deleted the data batches, a fence and a cut rebuilt it from the
        # fence alone (highwater -1), or a start-over adopted an older row.
        assert self.server is not None
        if self.server >= 0:
            self.server = data.draw(st.integers(-1, self.server - 1))

    def _answer(self, takeover: bool) -> int | str:
        assert self.server is not None
        found = self.written or self.server >= 0
        try:
            if takeover:
                answer = leases.FenceAnswer(
                    existed=found, created=not found, durable_highwater=self.server
                )
                return leases.takeover_sequence(self.record, "t/0", {"t/0": answer}, {})
            return leases.next_sequence(
                7,
                "t/0",
                bool(self.record.partitions["t/0"].get("seen")),
                found,
                self.server,
                recorded_highwater=leases.recorded_highwater(self.record, "t/0"),
            )
        except UnknownPid:
            return "UNKNOWN_PID"

    @rule(takeover=st.booleans())
    def lease(self, takeover: bool) -> None:
        got = self._answer(takeover)
        assert self.server is not None
        if self.server == self.acked:
            assert got == self.acked + 1, "an intact partition continues where the log ends"
        elif self.server < self.reported:
            assert got == "UNKNOWN_PID", "below what the coordinator was told: state lost"
        if got != "UNKNOWN_PID":
            assert isinstance(got, int) and got > self.reported
            if self.server >= 0:
                self.record = leases.mark_seen(self.record, "t/0", self.server)
                self.reported = max(self.reported, self.server)

    @invariant()
    def recorded_never_goes_down(self) -> None:
        assert leases.recorded_highwater(self.record, "t/0") == self.reported


TestRecordedHighwater = RecordedHighwaterMachine.TestCase
TestRecordedHighwater.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
