"""The producer's and the partition senders' lifecycles are checked state enums
(``ProducerState``, ``SenderState``): the states a producer goes through when it starts,
closes and fails, and a move that is not a transition is refused (a bug, not a state)."""

from __future__ import annotations

import asyncio

import pytest
from sdk_fakes import FakeCoordinator, FakePartitionServer

from pidlease import errors
from pidlease.client.producer import AsyncProducer, Producer, ProducerClosed, ProducerState
from pidlease.client.sender import SenderState

TOPICS = {"t": (2, "strict")}


@pytest.fixture
def fake():  # type: ignore[no-untyped-def]
    srv = FakePartitionServer(TOPICS).start()
    yield srv, FakeCoordinator(srv, TOPICS)
    srv.stop()


def test_async_producer_new_open_closing_closed(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake

    async def main() -> None:
        p = AsyncProducer("http://fake", topic="t", http_transport=coord.transport())
        assert p.state is ProducerState.NEW
        with pytest.raises(ProducerClosed, match="not started"):
            await p.send(b"early")
        await p.start()
        assert p.state is ProducerState.OPEN
        assert {s.state for s in p._senders} == {SenderState.RUNNING}
        assert (await (await p.send(b"x"))).sequence_id == 0
        closing = asyncio.ensure_future(p.close())
        await asyncio.sleep(0)
        assert p.state is ProducerState.CLOSING
        assert {s.state for s in p._senders} == {SenderState.CLOSING}
        await closing
        assert p.state is ProducerState.CLOSED
        await p.close()   # idempotent
        with pytest.raises(ProducerClosed, match="closed"):
            await p.send(b"late")
        with pytest.raises(RuntimeError, match="closed -> open is not a transition"):
            p._move_to(ProducerState.OPEN)

    asyncio.run(main())


def test_a_fatal_error_fails_the_producer_and_every_sender_then_close_closes(fake) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    p = Producer("http://fake", topic="t", http_transport=coord.transport())
    eng = p._engine
    try:
        assert p._state is ProducerState.OPEN and eng.state is ProducerState.OPEN
        srv.fail_next.append(errors.ProducerFenced.code)
        fut = p.send(b"x", partition=0)
        with pytest.raises(errors.ProducerFenced):
            fut.result(5)
        assert eng.state is ProducerState.FAILED
        assert {s.state for s in eng._senders} == {SenderState.FAILED}
        with pytest.raises(errors.ProducerFenced):
            p.send(b"later")
    finally:
        p.close()
    assert p._state is ProducerState.CLOSED and eng.state is ProducerState.CLOSED
    with pytest.raises(ProducerClosed):
        p.send(b"after close")


def test_a_sender_moves_only_along_its_transitions(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake
    with Producer("http://fake", topic="t", http_transport=coord.transport()) as p:
        s = p._engine._senders[0]
        assert s.state is SenderState.RUNNING
        with pytest.raises(RuntimeError, match="running -> running is not a transition"):
            s._move_to(SenderState.RUNNING)
    assert s.state is SenderState.CLOSING   # closed, its task ended
    assert s.task is not None and s.task.done()
    s.fail_all(errors.ProducerClosed("late"))
    assert s.state is SenderState.FAILED
    s.close()   # a failed sender stays failed
    assert s.state is SenderState.FAILED
    with pytest.raises(RuntimeError, match="failed -> closing is not a transition"):
        s._move_to(SenderState.CLOSING)
