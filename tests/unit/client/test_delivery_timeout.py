"""A producer closed by ``delivery_timeout_ms`` fails each unresolved batch with its own
``DeliveryTimeout`` saying what ``ProducerFenced`` says (issue 30, item 5): partition,
sequences and whether it may have been written, so an application follows docs/sdk.md's
recovery steps (take the name over, compare ``last_sequence_id``, resend what is missing)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"t": (3, "strict")}
ONE_AT_A_TIME: dict[str, object] = {"batch_records_max": 1, "max_in_flight": 1, "linger_ms": 0}


def make(coord: FakeCoordinator, **kw: object) -> Producer:
    return Producer("http://fake", topic="t", http_transport=coord.transport(), **kw)  # type: ignore[arg-type]


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def timed_out(fut: Future[object]) -> errors.DeliveryTimeout:
    exc = fut.exception(10)
    assert isinstance(exc, errors.DeliveryTimeout), exc
    return exc


def outcome(e: errors.DeliveryTimeout) -> tuple[int | None, int | None, int | None, bool]:
    return e.partition, e.first_sequence, e.last_sequence, e.indeterminate


def logged(srv: FakePartitionServer, partition: int, pid: int) -> list[int]:
    return [r.sequence_id for r in srv.records("t", partition) if r.pid == pid]


def test_delivery_timeout_says_per_batch_what_may_have_been_written(fake) -> None:  # type: ignore[no-untyped-def]
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
