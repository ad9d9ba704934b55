"""``Attempt`` (pidlease/spark/attempt.py): a micro-batch's renewals (issue 26): which first
lease of a micro-batch's producer goes out as a renewal at its current generation (no
takeover, no fence record), and which attempts take over instead. On fakes, with replays and
retries: ``tests/unit/spark/test_columnar.py``; the real thing, with the fence records
counted, ``tests/integration/test_spark_stream_source.py``."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from pidlease.client.lease_client import lease_request
from pidlease.spark.options import WriteSettings

pytest.importorskip("pyspark")
from pidlease.spark.attempt import Attempt, SharedTransport, TaskInfo, resumed_lease

RUN = {"job:0/2": (7, 41), "job:1/2": (8, 12)}


def test_a_producers_first_lease_by_name_becomes_a_renewal_at_the_runs_generation() -> None:
    """Issue 26 (a micro-batch's renewals): a micro-batch's producer's first lease goes out as
    a renewal at its current generation, no takeover, no fence record."""

    todo = dict(RUN)
    body = json.dumps(lease_request("t", 0, -1, producer_name="job:1/2", expire_ms=5000))
    renewed = resumed_lease(body.encode(), todo)
    assert renewed is not None
    assert json.loads(renewed) == {
        "topic": "t",
        "partition": 0,
        "pid": 8,
        "generation": 12,
        "producer_name": "job:1/2",
        "expire_ms": 5000,
    }
    # once per name: a second start of that producer (after a refused renewal) takes over
    assert resumed_lease(body.encode(), todo) is None
    assert todo == {"job:0/2": (7, 41)}


@pytest.mark.parametrize(
    "req",
    [
        lease_request("t", 0, -1, producer_name="other:0/2"),  # not one of the run's
        lease_request("t", 1, 7, generation=41),  # already a renewal (a later partition)
        lease_request("t", 0, -1),  # an unnamed producer
    ],
)
def test_other_leases_go_out_unchanged(req: dict[str, object]) -> None:
    """Issue 26 (a micro-batch's renewals): a micro-batch's producer's first lease goes out as
    a renewal at its current generation, no takeover, no fence record."""

    todo = dict(RUN)
    assert resumed_lease(json.dumps(req).encode(), todo) is None
    assert todo == RUN
    assert resumed_lease(b"not json", todo) is None


def _attempt(attempt: int, batch_id: int | None, speculative: bool = False) -> Attempt:
    settings = WriteSettings(coordinator="http://127.0.0.1:1", topic="t", job_name="job")
    return Attempt(settings, TaskInfo(0, attempt, batch_id, "q", speculative))


def test_only_the_first_attempt_of_a_micro_batch_renews() -> None:
    """Issue 26 (a micro-batch's renewals): a micro-batch's producer's first lease goes out as
    a renewal at its current generation, no takeover, no fence record."""

    assert _attempt(0, 5).renews()
    # a retry or a speculative copy must fence the attempts before it: a takeover
    assert not _attempt(1, 5).renews()
    assert not _attempt(0, 5, speculative=True).renews()
    # a batch write has no earlier micro-batch to share a generation with
    assert not _attempt(0, None).renews()


def test_the_shared_transport_sends_the_rewritten_lease() -> None:
    """Issue 26 (a micro-batch's renewals): a micro-batch's producer's first lease goes out as
    a renewal at its current generation, no takeover, no fence record.

    The view in front of the real transport: the coordinator receives the renewal."""
    seen: list[dict[str, object]] = []

    def coordinator(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"error": "NONE"})

    async def go() -> None:
        shared = SharedTransport("http://127.0.0.1:1", RUN)
        shared.real = httpx.MockTransport(coordinator)  # the real one, never opened
        async with httpx.AsyncClient(transport=shared.view, base_url="http://c") as client:
            for name in ("job:0/2", "job:0/2", "other"):
                await client.post(
                    "/v1/lease_pid", json=lease_request("t", 0, -1, producer_name=name)
                )
        assert shared.resumed == {"job:0/2"}

    asyncio.run(go())
    assert [(r["pid"], r.get("generation")) for r in seen] == [(7, 41), (-1, None), (-1, None)]
