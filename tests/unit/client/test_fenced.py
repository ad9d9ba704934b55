"""A fenced producer's records: each unresolved batch fails with its own ``ProducerFenced``
saying whether it may have been written (``indeterminate``), its partition and sequences;
the new holder's ``last_sequence_id`` counts everything the fenced one wrote."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from pidlease import errors
from pidlease.client.producer import AsyncProducer, Producer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"t": (3, "strict")}
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


def outcome(e: errors.ProducerFenced) -> tuple[int | None, int | None, int | None, bool]:
    return e.partition, e.first_sequence, e.last_sequence, e.indeterminate


def logged(srv: FakePartitionServer, partition: int, pid: int) -> list[int]:
    return [r.sequence_id for r in srv.records("t", partition) if r.pid == pid]


def test_a_takeover_fails_each_batch_saying_whether_it_may_have_been_written(fake) -> None:  # type: ignore[no-untyped-def]
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
