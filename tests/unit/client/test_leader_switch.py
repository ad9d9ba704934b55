"""A partition's batches are never on two connections at once, even when the leader map
changes under a sender with batches in flight (review of issue 12's fixes).

The map is shared by every partition sender of a producer: one sender's refresh after a
NOT_LEADER or a lost connection also moves the others' leaders. A sender with batch N
still unanswered on the old leader's connection (a paused or cut-off server answers
nothing until the request times out) must not send N+1 to the new leader: on a monotonic
topic N+1 would be appended there first, and N's resend, then older than every batch the
partition keeps for the PID, answered DUPLICATE although it was never written (an acked
record missing); on a strict topic N+1 is refused and N's resend lands, but only after a
needless round of OUT_OF_ORDER answers."""

from __future__ import annotations

import asyncio

from pidlease.client.producer import AsyncProducer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer
from tests.helpers import wait_until

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"mono": (1, "monotonic")}


def test_no_batch_goes_to_a_new_leader_while_an_earlier_one_is_unanswered() -> None:
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
