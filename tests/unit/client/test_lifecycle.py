"""The producer's and the partition senders' lifecycles are checked state enums
(``ProducerState``, ``SenderState``): the states a producer goes through when it starts,
closes and fails, and a move that is not a transition is refused (a bug, not a state)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pidlease import errors
from pidlease.client.producer import AsyncProducer, Producer, ProducerClosed, ProducerState
from pidlease.client.sender import SenderState
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"t": (2, "strict")}


def state(obj: Any) -> Any:
    """``obj.state`` read afresh (a type checker would narrow it across the steps that
    change it)."""
    return obj.state


def front(p: Producer) -> Any:
    """The blocking Producer's own side: closed for sends from close() on."""
    return p._state


@pytest.fixture
def fake():  # type: ignore[no-untyped-def]
    srv = FakePartitionServer(TOPICS).start()
    yield srv, FakeCoordinator(srv, TOPICS)
    srv.stop()


def test_async_producer_new_open_closing_closed(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake

    async def main() -> None:
        p = AsyncProducer("http://fake", topic="t", http_transport=coord.transport())
        assert state(p) is ProducerState.NEW
        with pytest.raises(ProducerClosed, match="not started"):
            await p.send(b"early")
        await p.start()
        assert state(p) is ProducerState.OPEN
        assert {state(s) for s in p._senders} == {SenderState.RUNNING}
        assert (await (await p.send(b"x"))).sequence_id == 0
        closing = asyncio.ensure_future(p.close())
        await asyncio.sleep(0)
        assert state(p) is ProducerState.CLOSING
        assert {state(s) for s in p._senders} == {SenderState.CLOSING}
        await closing
        assert state(p) is ProducerState.CLOSED
        await p.close()  # idempotent
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
        assert front(p) is ProducerState.OPEN and state(eng) is ProducerState.OPEN
        srv.fail_next.append(errors.ProducerFenced.code)
        fut = p.send(b"x", partition=0)
        with pytest.raises(errors.ProducerFenced):
            fut.result(5)
        assert state(eng) is ProducerState.FAILED
        assert {state(s) for s in eng._senders} == {SenderState.FAILED}
        with pytest.raises(errors.ProducerFenced):
            p.send(b"later")
    finally:
        p.close()
    assert front(p) is ProducerState.CLOSED and state(eng) is ProducerState.CLOSED
    with pytest.raises(ProducerClosed):
        p.send(b"after close")


def test_a_sender_moves_only_along_its_transitions(fake) -> None:  # type: ignore[no-untyped-def]
    _srv, coord = fake
    with Producer("http://fake", topic="t", http_transport=coord.transport()) as p:
        s = p._engine._senders[0]
        assert state(s) is SenderState.RUNNING
        with pytest.raises(RuntimeError, match="running -> running is not a transition"):
            s._move_to(SenderState.RUNNING)
    assert state(s) is SenderState.CLOSING  # closed, its task ended
    assert s.task is not None and s.task.done()
    s.fail_all(errors.ProducerClosed("late"))
    assert state(s) is SenderState.FAILED
    s.close()  # a failed sender stays failed
    assert state(s) is SenderState.FAILED
    with pytest.raises(RuntimeError, match="failed -> closing is not a transition"):
        s._move_to(SenderState.CLOSING)
