"""The SDK follows a leader that moved (issue 16 item 5): a leader that went silent (cut
off: no reset, no answer) is given up as soon as the coordinator names another leader,
not after request_timeout_ms; and after a lost leader the retry backoff stops at 100 ms,
so the new leader is reached soon after its election."""

from __future__ import annotations

import asyncio
import time

from pidlease import errors
from pidlease.client.leader_pool import SILENT_CHECK_MS
from pidlease.client.producer import AsyncProducer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer
from tests.helpers import wait_until

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"s": (1, "monotonic")}


def aborts_of(p: AsyncProducer) -> int:
    assert p._pool is not None
    return p._pool.moved_aborts


def test_a_silent_leader_is_given_up_once_another_leads() -> None:
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
    """After a failover the new leader may answer SEQUENCE_UNKNOWN for a batch it holds
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
