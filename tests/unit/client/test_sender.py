"""``PartitionSender`` (pidlease/client/sender.py) through a producer against the fake partition
server (``pidlease.testing.fakes``): the send loop's rules end to end: fencing and the
delivery timeout per batch, no batch on two connections across a leader change, a silent
leader given up once another leads, a refused batch resent first, which errors are
retried, and what the sender waits for. ``PartitionSender`` alone, through
``SenderContext`` fakes, is in test_partition_sender.py."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from pidlease import errors
from pidlease.client import sender as sender_module
from pidlease.client.leader_pool import SILENT_CHECK_MS
from pidlease.client.producer import AsyncProducer, Producer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer
from tests.helpers import wait_until

SDK_BOTH_PATHS = True  # every test runs on the fast and the readable path (conftest)
TOPICS = {"t": (3, "strict"), "one": (1, "strict"), "mono": (1, "monotonic"), "s": (1, "monotonic")}


# -- a fenced producer's records
# A fenced producer waits for the answers of batches in flight, up to request_timeout_ms
# (then its connection is cut): short here, where the fake holds answers back.
HELD_MS = 1500


# one record per batch, one batch in flight per partition: a second record waits
ONE_AT_A_TIME: dict[str, object] = {"batch_records_max": 1, "max_in_flight": 1, "linger_ms": 0}


def make(coord: FakeCoordinator, **kw: object) -> Producer:
    return Producer("http://fake", topic="t", http_transport=coord.transport(), **kw)  # type: ignore[arg-type]


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def fenced(fut: Future[object]) -> errors.ProducerFenced:
    exc = fut.exception(5)
    assert isinstance(exc, errors.ProducerFenced), exc
    return exc


def outcome(
    e: errors.ProducerFenced | errors.DeliveryTimeout,
) -> tuple[int | None, int | None, int | None, bool]:
    return e.partition, e.first_sequence, e.last_sequence, e.indeterminate


def logged(srv: FakePartitionServer, partition: int, pid: int) -> list[int]:
    return [r.sequence_id for r in srv.records("t", partition) if r.pid == pid]


def test_a_takeover_fails_each_batch_saying_whether_it_may_have_been_written(fake) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake
    a = make(coord, producer_name="X", request_timeout_ms=HELD_MS, **ONE_AT_A_TIME)
    try:
        for p in range(3):
            for _ in range(3):
                a.send(b"acked", partition=p)
        a.flush()
        srv.hold_after_append.add(("t", 0))  # written, never answered
        srv.hold_before_append.add(("t", 1))  # not written, never answered
        before = srv.produce_requests
        written = a.send(b"held-written", partition=0)
        queued0 = a.send(b"queued", partition=0)
        lost = a.send(b"held-unwritten", partition=1)
        queued1 = a.send(b"queued", partition=1)
        wait_for(lambda: srv.produce_requests >= before + 2)
        # those two answers stay unsent; what comes next is answered again
        srv.hold_after_append.clear()
        srv.hold_before_append.clear()
        b = make(coord, producer_name="X")
        try:
            assert (b.pid, b.generation) == (a.pid, a.generation + 1)
            # The new holder resumes after everything in the log, the unanswered batch too.
            resume = [b.last_sequence_id(p) for p in range(3)]
            assert resume == [max(logged(srv, p, a.pid)) for p in range(3)] == [3, 2, 2]
            refused = a.send(b"after-takeover", partition=2)  # answered FENCED
            assert outcome(fenced(refused)) == (2, 3, 3, False)
            assert outcome(fenced(written)) == (0, 3, 3, True)
            assert outcome(fenced(lost)) == (1, 3, 3, True)
            # never left the producer: not written, and never numbered
            assert outcome(fenced(queued0)) == (0, None, None, False)
            assert outcome(fenced(queued1)) == (1, None, None, False)
            assert 3 in logged(srv, 0, a.pid) and 3 not in logged(srv, 1, a.pid)
            # the message says what to do
            assert "may have been written" in str(fenced(written))
            assert "last_sequence_id(0) with 3" in str(fenced(written))
            assert "never left the producer" in str(fenced(queued0))
            # the new holder resends what was not written, from where the log is
            assert b.send(b"again", partition=1).result(5).sequence_id == 3
        finally:
            b.close(2000)
    finally:
        srv.hold_after_append.clear()
        srv.hold_before_append.clear()
        a.close(2000)
    assert logged(srv, 1, a.pid) == [0, 1, 2, 3]


def test_a_takeover_seen_by_the_lease_renewal_fails_batches_in_flight_as_indeterminate(
    fake,
) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake
    # expire_ms 600: renewed every 300 ms, so the takeover is seen by the lease, with no
    # partition answering FENCED
    a = make(coord, producer_name="Y", expire_ms=600, request_timeout_ms=HELD_MS, **ONE_AT_A_TIME)
    try:
        srv.hold_after_append.add(("t", 0))
        written = a.send(b"x", partition=0)
        queued = a.send(b"y", partition=0)
        wait_for(lambda: srv.produce_requests >= 1)
        b = make(coord, producer_name="Y")
        try:
            assert outcome(fenced(written)) == (0, 0, 0, True)
            assert outcome(fenced(queued)) == (0, None, None, False)
            assert b.last_sequence_id(0) == 0 == max(logged(srv, 0, a.pid))
            with pytest.raises(errors.ProducerFenced) as refused:
                a.send(b"z", partition=1)
            # refused at send: nothing of it was sent
            assert refused.value.indeterminate is False
            assert refused.value.partition is None
        finally:
            b.close(2000)
    finally:
        srv.hold_after_append.clear()
        a.close(2000)


def test_fenced_on_a_resend_after_an_unanswered_attempt_is_indeterminate(fake) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake
    # the first attempt is written and its answer lost; the resend waits out a long backoff
    a = make(coord, producer_name="Z", retry_backoff_ms=1500, retry_backoff_max_ms=1500)
    try:
        srv.drop_after_append = 1
        fut = a.send(b"x", partition=0)
        wait_for(lambda: srv.produce_requests >= 1)
        b = make(coord, producer_name="Z")
        try:
            # the resend itself was refused FENCED, yet the first attempt wrote the batch
            assert outcome(fenced(fut)) == (0, 0, 0, True)
            assert srv.answers[-1] == (0, errors.ProducerFenced.code)
            assert logged(srv, 0, a.pid) == [0] and b.last_sequence_id(0) == 0
        finally:
            b.close(2000)
    finally:
        a.close(2000)


def test_a_batch_answered_ok_behind_an_unanswered_one_is_acknowledged_not_failed(fake) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake
    a = make(
        coord,
        producer_name="W",
        request_timeout_ms=HELD_MS,
        batch_records_max=1,
        max_in_flight=2,
        linger_ms=0,
    )
    try:
        srv.hold_after_append.add(("t", 0))
        first = a.send(b"1", partition=0)
        wait_for(lambda: srv.produce_requests >= 1)
        srv.hold_after_append.clear()
        second = a.send(b"2", partition=0)
        wait_for(lambda: len(srv.answers) >= 1)  # answered OK, waiting behind `first`
        b = make(coord, producer_name="W")
        try:
            fenced(a.send(b"3", partition=1))  # answered FENCED: the producer fails
            md = second.result(5)
            assert (md.partition, md.offset, md.sequence_id) == (0, 1, 1)
            assert outcome(fenced(first)) == (0, 0, 0, True)
            assert a.last_sequence_id(0) == 1 == b.last_sequence_id(0)
        finally:
            b.close(2000)
    finally:
        a.close(2000)


def test_unsent_records_with_explicit_sequence_ids_carry_their_ids(fake) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake
    a = make(
        coord,
        producer_name="V",
        request_timeout_ms=HELD_MS,
        batch_records_max=2,
        max_in_flight=1,
        linger_ms=0,
    )
    try:
        srv.hold_before_append.add(("t", 0))
        sent = [a.send(b"s", partition=0, sequence_id=i) for i in range(2)]
        wait_for(lambda: srv.produce_requests >= 1)
        waiting = [a.send(b"w", partition=0, sequence_id=i) for i in range(2, 4)]
        b = make(coord, producer_name="V")
        try:
            fenced(a.send(b"x", partition=1, sequence_id=0))
            assert {outcome(fenced(f)) for f in sent} == {(0, 0, 1, True)}
            assert {outcome(fenced(f)) for f in waiting} == {(0, 2, 3, False)}
            assert b.last_sequence_id(0) == -1 and logged(srv, 0, a.pid) == []
        finally:
            b.close(2000)
    finally:
        srv.hold_before_append.clear()
        a.close(2000)


def test_the_async_producer_classifies_the_same_way(fake) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake

    async def main() -> None:
        a = await AsyncProducer.create(
            "http://fake",
            "t",
            producer_name="U",
            http_transport=coord.transport(),
            request_timeout_ms=HELD_MS,
            **ONE_AT_A_TIME,
        )
        try:
            srv.hold_after_append.add(("t", 0))
            written = await a.send(b"x", partition=0)
            queued = await a.send(b"y", partition=0)  # waits in the sender's queue
            for _ in range(500):
                if srv.produce_requests >= 1:
                    break
                await asyncio.sleep(0.01)
            srv.hold_after_append.clear()
            b = await AsyncProducer.create(
                "http://fake", "t", producer_name="U", http_transport=coord.transport()
            )
            try:
                refused = await a.send(b"z", partition=1)
                for fut, want in (
                    (refused, (1, 0, 0, False)),
                    (written, (0, 0, 0, True)),
                    (queued, (0, None, None, False)),
                ):
                    with pytest.raises(errors.ProducerFenced) as info:
                        await asyncio.wait_for(fut, 5)
                    assert outcome(info.value) == want
                assert b.last_sequence_id(0) == 0
            finally:
                await b.close(2000)
        finally:
            await a.close(2000)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("first_answer", "indeterminate"),
    [
        # a deposed leader answers NOT_LEADER for a batch it appended but cannot ack (the
        # fake appends nothing here, yet the SDK cannot tell the two apart)
        (errors.NotLeader.code, True),
        (errors.ServerUnavailable.code, True),
        # refused by the append rules: nothing was written by that attempt
        (errors.SequenceUnknown.code, False),
    ],
)
def test_whether_a_retriable_answer_rules_a_write_out(
    fake, first_answer: int, indeterminate: bool
) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake
    a = make(coord, producer_name="R", retry_backoff_ms=800, retry_backoff_max_ms=800)
    try:
        srv.fail_next.append(first_answer)
        fut = a.send(b"x", partition=0)
        wait_for(lambda: len(srv.answers) >= 1)
        b = make(coord, producer_name="R")
        try:
            # the resend (after the backoff) is answered FENCED
            assert outcome(fenced(fut)) == (0, 0, 0, indeterminate)
            assert srv.answers == [(0, first_answer), (0, errors.ProducerFenced.code)]
        finally:
            b.close(2000)
    finally:
        a.close(2000)


def test_a_batch_in_flight_when_fenced_waits_for_its_answer(fake) -> None:  # type: ignore[no-untyped-def]
    """Fencing (a fenced producer's records): each unresolved batch fails with its own
    ProducerFenced saying whether it may have been written, its partition and sequences."""

    srv, coord = fake
    a = make(coord, producer_name="Q", **ONE_AT_A_TIME)
    try:
        srv.hold_after_append.add(("t", 0))
        in_flight = a.send(b"x", partition=0)
        queued = a.send(b"y", partition=0)
        wait_for(lambda: srv.produce_requests >= 1)
        srv.hold_after_append.clear()
        b = make(coord, producer_name="Q")
        try:
            fenced(a.send(b"z", partition=1))  # answered FENCED: the producer failed
            assert outcome(fenced(queued)) == (0, None, None, False)
            assert not in_flight.done()  # its answer is still to come: final either way
            srv.release_held()
            md = in_flight.result(5)  # written before the fence: acknowledged
            assert (md.partition, md.offset, md.sequence_id) == (0, 0, 0)
            assert a.last_sequence_id(0) == 0 == b.last_sequence_id(0)
        finally:
            b.close(2000)
    finally:
        a.close(2000)


# -- no batch on two connections when the leader map changes (review 2b, issue 12's fixes)
def test_no_batch_goes_to_a_new_leader_while_an_earlier_one_is_unanswered() -> None:
    """docs/reliability.md finding 2b (review of issue 12's fixes): a partition's batches are
    never on two connections at once, even when the leader map changes under a sender with
    batches in flight."""

    old, new = FakePartitionServer(TOPICS).start(), FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(old, TOPICS)

    async def main() -> list:
        async with AsyncProducer(
            "http://fake",
            "mono",
            http_transport=coord.transport(),  # type: ignore[arg-type]
            linger_ms=0,
            max_in_flight=5,
            batch_records_max=1,
            retry_backoff_ms=1,
            retry_backoff_max_ms=5,
            metadata_refresh_min_ms=0,
        ) as p:
            old.silent = True  # the old leader reads batch 0 and never answers it
            futs = [await p.send(b"r0")]
            await wait_until(lambda: old.produce_requests >= 1)
            # Leadership moved; another partition's sender refreshed the shared map.
            coord.leader_override = new.address
            await p.refresh_metadata()
            futs += [await p.send(b"r%d" % i) for i in range(1, 10)]
            # The sender has reached for the new leader (and, before the fix, sent there).
            await wait_until(lambda: new.connections() >= 1)
            old.drop_all()  # batch 0's connection is lost: it is resent to the new leader
            await p.flush()
            return [await f for f in futs]

    try:
        metas = asyncio.run(main())
    finally:
        old.stop()
        new.stop()
    values = [b"r%d" % i for i in range(10)]
    assert [r.value for r in new.records("mono", 0)] == values  # every record once, in order
    assert not any(m.duplicate for m in metas)  # nothing answered as written that was not
    assert [m.offset for m in metas] == list(range(10))


# -- a refusal leaves no hole, the SDK's side (issue 12 finding 2, CONTRACT "Append rules")
def _plan(rng: random.Random, batches: int) -> list[list[int]]:
    """Sequence ids per batch: 1 to 60 contiguous ids, a hole of 1..9 after each."""
    out, seq = [], rng.randrange(100)
    for _ in range(batches):
        n = rng.choice((1, 3, rng.randint(1, 60)))
        out.append(list(range(seq, seq + n)))
        seq += n + rng.randint(1, 9)
    return out


@pytest.mark.parametrize(
    "code", [errors.ServerUnavailable.code, errors.TooManyPids.code, errors.NotLeader.code]
)
def test_refused_batch_is_resent_first_and_nothing_is_lost(fake, code: int) -> None:  # type: ignore[no-untyped-def]
    """Issue 12 finding 2 (docs/reliability.md finding 2; CONTRACT "Append rules"): on a
    monotonic topic a batch refused while later ones are in flight is resent first, and
    nothing is resolved as written that the server did not write."""

    srv, coord = fake
    plan = _plan(random.Random(code), 120)
    refused_at = (3, 17, 18, 40)  # the 3rd request is the first batch's third: a full window
    srv.fail_at = dict.fromkeys(refused_at, code)
    with Producer(
        "http://fake",
        topic="mono",
        http_transport=coord.transport(),  # type: ignore[arg-type]
        max_in_flight=5,
        linger_ms=0,
        retry_backoff_ms=1,
        retry_backoff_max_ms=5,
    ) as p:
        futs = [p.send(b"s%d" % s, sequence_id=s) for batch in plan for s in batch]
        p.flush()
        metas = [f.result(5) for f in futs]
        assert p.stats["retries"] >= len(refused_at)
    ids = [s for batch in plan for s in batch]
    recs = srv.records("mono", 0)
    assert [r.sequence_id for r in recs] == ids  # every record once, in order
    assert [m.sequence_id for m in metas] == ids
    assert not any(m.duplicate for m in metas)  # nothing was resent after being written
    assert [recs[m.offset].sequence_id for m in metas] == ids
    # After each refusal of a batch from sequence N, the later batches already in flight
    # were refused too (SEQUENCE_UNKNOWN, or the next injected refusal), and the next batch
    # the server took was the resend of the lowest refused one.
    assert sum(c == code for _, c in srv.answers) == len(refused_at)
    blocked = None
    for base, c in srv.answers:
        if c == code:
            blocked = base if blocked is None else min(blocked, base)
        elif c == errors.SequenceUnknown.code:
            assert blocked is not None and base > blocked, srv.answers
        else:
            assert c == errors.NONE, srv.answers
            assert blocked is None or base == blocked, srv.answers
            blocked = None


def test_a_later_batch_answered_duplicate_is_resolved_only_when_written(fake) -> None:  # type: ignore[no-untyped-def]
    """Issue 12 finding 2 (docs/reliability.md finding 2; CONTRACT "Append rules"): on a
    monotonic topic a batch refused while later ones are in flight is resent first, and
    nothing is resolved as written that the server did not write.

    A resend after a lost connection: the batches the server has are DUPLICATE with their
    original offsets, the refused one in between is written, none is resolved twice."""
    srv, coord = fake
    plan = _plan(random.Random(7), 40)
    srv.drop_after_append = 2
    srv.fail_at = {6: errors.ServerUnavailable.code}
    with Producer(
        "http://fake",
        topic="mono",
        http_transport=coord.transport(),  # type: ignore[arg-type]
        max_in_flight=5,
        linger_ms=0,
        retry_backoff_ms=1,
        retry_backoff_max_ms=5,
    ) as p:
        futs = [p.send(b"s%d" % s, sequence_id=s) for batch in plan for s in batch]
        p.flush()
        metas = [f.result(5) for f in futs]
    ids = [s for batch in plan for s in batch]
    recs = srv.records("mono", 0)
    assert [r.sequence_id for r in recs] == ids
    assert [recs[m.offset].sequence_id for m in metas] == ids
    assert any(m.duplicate for m in metas)  # the appended-but-unanswered batches
    assert any(c == errors.SequenceUnknown.code for _, c in srv.answers)


# -- TOO_MANY_PIDS and NOT_ENOUGH_REPLICAS are retriable (issues 6 and 16)
def test_too_many_pids_is_retried_with_backoff(fake) -> None:  # type: ignore[no-untyped-def]
    """Issue 6 (the tracked-PID limit): TOO_MANY_PIDS is retriable: the sender backs off and
    resends, nothing lost or duplicated."""

    srv, coord = fake
    assert errors.TooManyPids.retriable and errors.TooManyPids.code == 24
    with Producer(
        "http://fake",
        topic="one",
        http_transport=coord.transport(),  # type: ignore[arg-type]
        batch_records_max=20,
    ) as p:
        srv.fail_next.extend([errors.TooManyPids.code] * 3)
        futs = [p.send(b"r%d" % i) for i in range(100)]
        p.flush()
        metas = [f.result(5) for f in futs]
        assert p.stats["retries"] >= 3
    assert [r.value for r in srv.records("one", 0)] == [b"r%d" % i for i in range(100)]
    assert [m.sequence_id for m in metas] == list(range(100))


def test_not_enough_replicas_is_retried_and_the_leader_kept(fake) -> None:  # type: ignore[no-untyped-def]
    """Issue 16 (min_insync_replicas): NOT_ENOUGH_REPLICAS is retriable: the sender backs off
    and resends to the same leader.

    NOT_ENOUGH_REPLICAS (issue 16: the in-sync set below min_insync_replicas) is resent
    to the same leader, with nothing lost or duplicated."""
    srv, coord = fake
    assert errors.NotEnoughReplicas.retriable and not errors.NotEnoughReplicas.invalid_metadata
    with Producer(
        "http://fake",
        topic="one",
        http_transport=coord.transport(),  # type: ignore[arg-type]
        batch_records_max=20,
    ) as p:
        srv.fail_next.extend([errors.NotEnoughReplicas.code] * 3)
        futs = [p.send(b"r%d" % i) for i in range(100)]
        p.flush()
        metas = [f.result(5) for f in futs]
        assert p.stats["retries"] >= 3
    assert [r.value for r in srv.records("one", 0)] == [b"r%d" % i for i in range(100)]
    assert [m.sequence_id for m in metas] == list(range(100))


# -- the sender's waits (review 2c; docs/operations.md, the hung flush() of bench_rebalance.py)
def test_waiting_for_answers_before_a_resend_does_not_spin(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/reliability.md finding 2c (review of issue 12's fixes): a sender waiting for
    answers before a resend sleeps until one arrives; it spun once its backoff had passed."""

    turns = [0]
    collect = sender_module.PartitionSender._collect

    def counted(self, now: float) -> None:  # type: ignore[no-untyped-def]
        turns[0] += 1
        collect(self, now)

    monkeypatch.setattr(sender_module.PartitionSender, "_collect", counted)
    srv = FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(srv, TOPICS)
    srv.fail_at = {1: errors.ServerUnavailable.code}  # the first batch is refused at once
    srv.silent_from = 2  # the next ones wait for their answers

    async def main() -> list:
        async with AsyncProducer(
            "http://fake",
            "mono",
            http_transport=coord.transport(),  # type: ignore[arg-type]
            linger_ms=0,
            max_in_flight=5,
            batch_records_max=1,
            retry_backoff_ms=1,
            retry_backoff_max_ms=5,
        ) as p:
            futs = [await p.send(b"r%d" % i) for i in range(5)]
            await wait_until(lambda: srv.produce_requests >= 5)
            before = turns[0]
            await asyncio.sleep(0.2)  # nothing happens meanwhile: the sender should sleep
            idle_turns = turns[0] - before
            srv.silent_from = 0
            srv.drop_all()  # the held answers are lost; everything is resent in order
            await p.flush()
            return [idle_turns] + [await f for f in futs]

    try:
        idle_turns, *metas = asyncio.run(main())
    finally:
        srv.stop()
    # Nothing arrives in that window, so the sender has nothing to do: a few turns at most.
    assert idle_turns <= 5, f"the sender ran {idle_turns} times while nothing happened"
    assert [r.value for r in srv.records("mono", 0)] == [b"r%d" % i for i in range(5)]
    assert [m.offset for m in metas] == list(range(5))


def test_a_lapsed_token_does_not_spin_the_sender(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/operations.md (the spin under load, commit 9656874): a sender whose lease token has
    lapsed waits for the renewal's wake-up instead of spinning.

    A sender whose lease token has lapsed (a renewal late under load) waits for the
    renewal's wake-up: it used to wait for deadlines already past (the linger of its
    pending run, a passed retry time), so it woke at once, again and again, until the
    renewal came: 38,194 turns in one loaded CI run of the test above."""
    turns = [0]
    collect = sender_module.PartitionSender._collect

    def counted(self, now: float) -> None:  # type: ignore[no-untyped-def]
        turns[0] += 1
        collect(self, now)

    monkeypatch.setattr(sender_module.PartitionSender, "_collect", counted)
    srv = FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(srv, TOPICS)

    async def main() -> tuple[int, list]:
        async with AsyncProducer(
            "http://fake",
            "mono",
            http_transport=coord.transport(),  # type: ignore[arg-type]
            linger_ms=0,
            retry_backoff_ms=1,
            retry_backoff_max_ms=5,
        ) as p:
            keeper = p._lease
            assert keeper is not None
            good_until = keeper._good_until
            keeper._good_until = 0.0  # the token lapses: nothing may be sent
            futs = [await p.send(b"r%d" % i) for i in range(3)]
            await asyncio.sleep(0.05)
            before = turns[0]
            await asyncio.sleep(0.2)  # the renewal has not come: the sender should sleep
            idle_turns = turns[0] - before
            assert srv.produce_requests == 0, "sent with a lapsed token"
            keeper._good_until = good_until
            p._wake_senders()  # what a renewal does
            await p.flush()
            return idle_turns, [await f for f in futs]

    try:
        idle_turns, metas = asyncio.run(main())
    finally:
        srv.stop()
    assert idle_turns <= 5, f"the sender ran {idle_turns} times while its token had lapsed"
    assert [m.offset for m in metas] == [0, 1, 2]


def test_a_crashed_lease_renewal_fails_the_producer_instead_of_starving_flush(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """docs/operations.md (the hung flush() of bench_rebalance.py, fix 1): a crashed lease
    renewal fails the producer instead of starving flush().

    The renewal task dying of an error that is not a PidleaseError (a bug, an
    unexpected exception from the HTTP stack) used to end it silently: the token then
    lapsed, every sender waited for a renewal's wake-up that never came, and flush()
    waited for ever with the event loop idle and no request sent (the symptom of the
    open finding in docs/operations.md). It must fail the producer instead."""
    srv = FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(srv, TOPICS)

    async def broken_lease_batch(self, requests):  # type: ignore[no-untyped-def]
        raise RuntimeError("unexpected error in the HTTP stack")

    async def main() -> tuple[bool, BaseException | None]:
        p = await AsyncProducer(
            "http://fake",
            "mono",
            http_transport=coord.transport(),  # type: ignore[arg-type]
            linger_ms=0,
            retry_backoff_ms=1,
            retry_backoff_max_ms=5,
        ).start()
        try:
            keeper = p._lease
            assert keeper is not None
            monkeypatch.setattr(type(keeper.client), "lease_batch", broken_lease_batch)
            keeper._good_until = 0.0  # the token lapsed: only a renewal lets records go
            keeper._renew_at = 0.0  # the renewal is due now
            keeper._wake.set()
            fut = await p.send(b"r0")
            try:
                await asyncio.wait_for(p.flush(), 2.0)
            except TimeoutError:
                return False, None
            return True, fut.exception()
        finally:
            await p.close(timeout_ms=500)  # bounded: a starved sender would hold it too

    try:
        flushed, exc = asyncio.run(main())
    finally:
        srv.stop()
    assert flushed, "flush() still waiting 2 s after the lease renewal task died"
    assert isinstance(exc, errors.PidleaseError) and "lease renewal crashed" in str(exc), exc
    assert srv.produce_requests == 0, "sent with a lapsed token"


def test_a_sender_crashing_while_it_builds_a_batch_fails_its_records(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/operations.md (the hung flush() of bench_rebalance.py, fix 3): a sender crashing
    while it builds a batch fails and counts its records.

    A sender that crashes fails the producer (``_run``'s handler), and ``fail_all``
    fails what is in its window and pending. A batch being built was in neither: its run
    had left ``pending`` before ``ProducerBatch.batch`` ran, so a build that raised left its
    records unresolved and uncounted, and flush() waited for ever on a failed producer."""
    srv = FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(srv, TOPICS)

    def broken_batch(self, **_kw):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug while building the batch")

    async def main() -> tuple[bool, BaseException | None]:
        p = await AsyncProducer(
            "http://fake",
            "mono",
            http_transport=coord.transport(),  # type: ignore[arg-type]
            linger_ms=0,
        ).start()
        try:
            # Connected before the crash, and the server's side of it seen: a connection
            # cut before the fake server took it up leaks its socket there.
            assert p._pool is not None
            await p._pool.connection_for(0)
            await wait_until(lambda: srv.connections() == 1)
            monkeypatch.setattr(sender_module.ProducerBatch, "batch", broken_batch)
            fut = await p.send(b"r0")
            try:
                await asyncio.wait_for(p.flush(), 2.0)
            except TimeoutError:
                return False, None
            return True, fut.exception() if fut.done() else None
        finally:
            await p.close(timeout_ms=500)
            await wait_until(lambda: srv.connections() == 0)

    try:
        flushed, exc = asyncio.run(main())
    finally:
        srv.stop()
    assert flushed, "flush() still waiting 2 s after the sender crashed building a batch"
    assert isinstance(exc, errors.PidleaseError) and "crashed" in str(exc), exc
    assert srv.produce_requests == 0


# -- a delivery timeout says per batch what may have been written (issue 30 item 5)
def timed_out(fut: Future[object]) -> errors.DeliveryTimeout:
    exc = fut.exception(10)
    assert isinstance(exc, errors.DeliveryTimeout), exc
    return exc


def test_delivery_timeout_says_per_batch_what_may_have_been_written(fake) -> None:  # type: ignore[no-untyped-def]
    """Issue 30 item 5: a producer closed by delivery_timeout_ms fails each unresolved batch
    with its own DeliveryTimeout saying what ProducerFenced says (partition, sequences,
    whether it may have been written)."""

    srv, coord = fake
    # request_timeout_ms far above the delivery timeout: the held answers are still awaited
    # when the delivery timeout closes the producer.
    a = make(
        coord,
        producer_name="D",
        delivery_timeout_ms=1000,
        request_timeout_ms=60_000,
        **ONE_AT_A_TIME,
    )
    try:
        for p in range(3):
            for _ in range(3):
                a.send(b"acked", partition=p)
        a.flush()
        srv.hold_after_append.add(("t", 0))  # written, never answered
        srv.hold_before_append.add(("t", 1))  # not written, never answered
        before = srv.produce_requests
        written = a.send(b"held-written", partition=0)
        queued0 = a.send(b"queued", partition=0)
        lost = a.send(b"held-unwritten", partition=1)
        wait_for(lambda: srv.produce_requests >= before + 2)
        assert outcome(timed_out(written)) == (0, 3, 3, True)
        assert outcome(timed_out(lost)) == (1, 3, 3, True)
        # never left the producer: not written, and never numbered
        assert outcome(timed_out(queued0)) == (0, None, None, False)
        assert "may have been written" in str(timed_out(written))
        assert "last_sequence_id(0) with 3" in str(timed_out(written))
        assert "never left the producer" in str(timed_out(queued0))
        with pytest.raises(errors.DeliveryTimeout) as refused:
            a.send(b"after", partition=2)
        # refused at send: nothing of it was sent
        assert (refused.value.partition, refused.value.indeterminate) == (None, False)
    finally:
        srv.hold_after_append.clear()
        srv.hold_before_append.clear()
        a.close(2000)

    # docs/sdk.md's steps: take the name over, compare, resend what did not land.
    b = make(coord, producer_name="D")
    try:
        w, lo = timed_out(written), timed_out(lost)
        assert w.last_sequence is not None and lo.first_sequence is not None
        assert b.last_sequence_id(0) >= w.last_sequence, "the held batch landed"
        assert b.last_sequence_id(1) < lo.first_sequence, "the other one did not"
        assert b.send(b"again", partition=1).result(5).sequence_id == 3
    finally:
        b.close(2000)
    assert logged(srv, 0, a.pid) == [0, 1, 2, 3]
    assert logged(srv, 1, a.pid) == [0, 1, 2, 3]


# -- the SDK follows a leader that moved (issue 16 item 5)
def aborts_of(p: AsyncProducer) -> int:
    assert p._pool is not None
    return p._pool.moved_aborts


def test_a_silent_leader_is_given_up_once_another_leads() -> None:
    """Issue 16 item 5 (the SDK follows a leader that moved): a silent leader is given up once
    the coordinator names another, and the backoff after a lost leader stops at 100 ms."""

    old, new = FakePartitionServer(TOPICS).start(), FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(old, TOPICS)

    async def main() -> tuple[float, int]:
        async with AsyncProducer(
            "http://fake",
            "s",
            http_transport=coord.transport(),
            linger_ms=0,
            request_timeout_ms=60_000,  # waiting it out would fail the bound below
            metadata_refresh_min_ms=0,
        ) as p:
            await (await p.send(b"before"))
            old.silent = True  # cut off: reads requests, answers nothing
            t0 = time.monotonic()
            fut = await p.send(b"during")
            await wait_until(lambda: old.produce_requests >= 2)
            coord.leader_override = new.address  # elected elsewhere; nobody told the SDK
            await asyncio.wait_for(fut, 20)
            return time.monotonic() - t0, aborts_of(p)

    try:
        took, aborts = asyncio.run(main())
    finally:
        old.stop()
        new.stop()
    assert [r.value for r in new.records("s", 0)] == [b"during"]
    assert aborts == 1
    assert took < 3 * SILENT_CHECK_MS / 1000 + 2, took


def test_a_silent_leader_that_still_leads_is_left_alone() -> None:
    """Issue 16 item 5 (the SDK follows a leader that moved): a silent leader is given up once
    the coordinator names another, and the backoff after a lost leader stops at 100 ms."""

    old = FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(old, TOPICS)

    async def main() -> int:
        async with AsyncProducer(
            "http://fake",
            "s",
            http_transport=coord.transport(),
            linger_ms=0,
            request_timeout_ms=60_000,
            metadata_refresh_min_ms=0,
        ) as p:
            old.silent = True
            await p.send(b"held")
            await asyncio.sleep(3 * SILENT_CHECK_MS / 1000)
            aborts: int = aborts_of(p)
            old.silent = False
            old.drop_all()  # let the producer finish: the resend is answered
            await p.flush()
            return aborts

    try:
        assert asyncio.run(main()) == 0
    finally:
        old.stop()


def test_the_backoff_after_a_lost_leader_stops_at_100_ms() -> None:
    """Issue 16 item 5 (the SDK follows a leader that moved): a silent leader is given up once
    the coordinator names another, and the backoff after a lost leader stops at 100 ms."""

    server = FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(server, TOPICS)

    async def main() -> dict[str, float]:
        async with AsyncProducer(
            "http://fake",
            "s",
            http_transport=coord.transport(),
            retry_backoff_ms=50,
            retry_backoff_max_ms=1_000,
        ) as p:
            sender = p._senders[0]
            delays: dict[str, float] = {}
            # SEQUENCE_UNKNOWN first: no leader was lost before it, so nothing restarts
            # its backoff (after a lost leader it would: the next test).
            for exc in (
                errors.SequenceUnknown("in flight"),
                errors.NotLeader("moved"),
                errors.ServerUnavailable("connection refused"),
            ):
                sender._backoff.failures = 10  # a long outage: the doubling is at its cap
                sender._retry_at = None
                now = p.clock_ms()
                sender._schedule_retry(exc, now)
                assert sender._retry_at is not None
                delays[exc.name] = sender._retry_at - now
            sender._retry_at = None
            return delays

    try:
        delays = asyncio.run(main())
    finally:
        server.stop()
    # A short poll for the new leader (it was 250 ms: up to 300 ms of a failover's pause
    # came after the election).
    assert delays["NOT_LEADER"] <= 100 and delays["SERVER_UNAVAILABLE"] <= 100, delays
    assert delays["SEQUENCE_UNKNOWN"] > 100, delays  # other retries keep the full backoff


def test_the_first_other_answer_after_a_lost_leader_starts_the_backoff_over() -> None:
    """Issue 16 item 5 (the SDK follows a leader that moved): a silent leader is given up once
    the coordinator names another, and the backoff after a lost leader stops at 100 ms.

    After a failover the new leader may answer SEQUENCE_UNKNOWN for a batch it holds
    above its high watermark (settled by its followers' next fetch): that retry must not
    wait the backoff the outage built up (up to retry_backoff_max_ms)."""
    server = FakePartitionServer(TOPICS).start()
    coord = FakeCoordinator(server, TOPICS)

    async def main() -> list[float]:
        async with AsyncProducer(
            "http://fake",
            "s",
            http_transport=coord.transport(),
            retry_backoff_ms=50,
            retry_backoff_max_ms=1_000,
        ) as p:
            sender = p._senders[0]
            delays: list[float] = []
            for exc in (
                *[errors.ServerUnavailable("connection refused")] * 8,  # the outage
                errors.SequenceUnknown("appended but not yet durable"),  # the new leader
                errors.SequenceUnknown("appended but not yet durable"),
                errors.SequenceUnknown("appended but not yet durable"),
            ):
                sender._retry_at = None
                now = p.clock_ms()
                sender._schedule_retry(exc, now)
                assert sender._retry_at is not None
                delays.append(sender._retry_at - now)
            sender._retry_at = None
            return delays

    try:
        delays = asyncio.run(main())
    finally:
        server.stop()
    assert all(d <= 100 for d in delays[:8]), delays
    assert delays[8] <= 60, delays  # the base backoff, jittered (+-20%)
    assert delays[9] > delays[8] and delays[10] > delays[9], delays  # then it doubles again
