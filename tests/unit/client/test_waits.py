"""A sender waiting for answers before a resend sleeps until one arrives (review of issue
12's fixes): it used to wake at once, again and again, once the backoff had passed, so a
batch refused while later ones waited long for theirs (a slow fsync, a paused leader, the
new wait for an old leader's answers after a leader change) kept the producer's event
loop busy for as long as they waited."""

from __future__ import annotations

import asyncio

from pidlease import errors
from pidlease.client import sender as sender_module
from pidlease.client.producer import AsyncProducer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer
from tests.helpers import wait_until

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"mono": (1, "monotonic")}


def test_waiting_for_answers_before_a_resend_does_not_spin(monkeypatch) -> None:  # type: ignore[no-untyped-def]
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
    """A sender whose lease token has lapsed (a renewal late under load) waits for the
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
    """The renewal task dying of an error that is not a PidleaseError (a bug, an
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
    """A sender that crashes fails the producer (``_run``'s handler), and ``fail_all``
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
