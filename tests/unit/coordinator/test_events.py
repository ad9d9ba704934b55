"""The coordinator's event feed: bounded, newest first, server feeds merged once however
often they are re-read, and the lease service recording takeovers and FENCED refusals
(batched requests included) without changing what the caller gets."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.events import EventLog, ObservedLeaseService
from coordinator.leases import LeaseKind, LeaseRequest
from coordinator.service import LeaseResult, LeaseService
from pidlease.errors import ProducerFenced, UnknownPid
from pidlease.wire.cluster import PidRecord


def server_event(server: int, seq: int, t: int, kind: str = "duplicate") -> dict[str, Any]:
    return {
        "id": f"{server}:100:{seq}",
        "kind": kind,
        "time_ms": t,
        "server_id": server,
        "topic": "t",
        "partition": 0,
        "pid": 9,
        "generation": 1,
    }


def test_ring_is_bounded_and_newest_first() -> None:
    clock = iter(range(1000, 2000))
    log = EventLog("c1", kept=4, clock_ms=lambda: next(clock))
    for pid in range(10):
        log.add("takeover", pid=pid)
    got = log.recent()
    assert [e["pid"] for e in got] == [9, 8, 7, 6]
    assert len({e["id"] for e in got}) == 4 and log.added == 10
    assert got[0]["source"] == "coordinator c1"
    assert [e["pid"] for e in log.recent(limit=2)] == [9, 8]


def test_server_feeds_merge_once_and_interleave_by_time() -> None:
    log = EventLog("c1", clock_ms=lambda: 150)
    feed1 = [server_event(1, i, 100 + i * 100) for i in range(3)]  # 100, 200, 300
    assert log.merge(feed1) == 3
    assert log.merge([*feed1, server_event(1, 3, 400)]) == 1  # re-read: only the new one
    assert log.merge([server_event(2, 0, 50)]) == 1  # same seq, other server
    log.add("takeover", pid=9)  # at 150
    got = log.recent()
    assert [e["time_ms"] for e in got] == [400, 300, 200, 150, 100, 50]
    assert got[-1]["source"] == "server 2" and got[-1]["id"] == "s:2:100:0"
    assert log.merge([{"kind": "duplicate"}]) == 0  # no id: not trusted


def record(pid: int, generation: int) -> PidRecord:
    return PidRecord(
        pid=pid,
        generation=generation,
        expire_ms=1000,
        expires_at_ms=5000,
        last_use_ms=4000,
        created_ms=1,
        producer_name="job:0",
        partitions={"t/0": {"seen": True}, "t/1": {"seen": False}},
    )


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> ObservedLeaseService:
    """The observed service over a stand-in for the real lease flows."""

    def fake_lease(self: LeaseService, req: LeaseRequest) -> LeaseResult:
        if req.generation is not None and req.generation < 7:
            raise ProducerFenced(f"generation {req.generation} < 7")
        if req.pid == 404:
            raise UnknownPid("never leased")
        kind = LeaseKind.TAKEOVER if req.generation is None else LeaseKind.RENEW
        return LeaseResult(kind, record(req.pid, 8 if kind is LeaseKind.TAKEOVER else 7), 0, "tok")

    monkeypatch.setattr(LeaseService, "lease", fake_lease)
    svc = ObservedLeaseService.__new__(ObservedLeaseService)
    svc.events = EventLog("c1", clock_ms=lambda: 1)
    return svc


def test_takeovers_and_fenced_leases_are_recorded(service: ObservedLeaseService) -> None:
    assert service.lease(LeaseRequest("t", 0, 5, generation=7)).kind is LeaseKind.RENEW
    taken = service.lease(LeaseRequest("t", 1, 5, producer_name="job:0"))
    assert taken.kind is LeaseKind.TAKEOVER and taken.record.generation == 8
    with pytest.raises(ProducerFenced):
        service.lease(LeaseRequest("t", 0, 5, generation=6))
    with pytest.raises(UnknownPid):
        service.lease(LeaseRequest("t", 0, 404))
    got = {e["kind"]: e for e in service.events.recent()}
    assert set(got) == {"takeover", "fenced_lease"}
    assert got["takeover"]["fenced_generation"] == 7 and got["takeover"]["generation"] == 8
    assert got["takeover"]["partitions_fenced"] == 2 and got["takeover"]["producer_name"] == "job:0"
    assert got["fenced_lease"]["generation"] == 6 and "< 7" in got["fenced_lease"]["detail"]


def test_batched_leases_are_observed_too(service: ObservedLeaseService) -> None:
    out = service.lease_batch(
        [
            LeaseRequest("t", 0, 5),
            LeaseRequest("t", 0, 5, generation=1),
            LeaseRequest("t", 0, 5, generation=7),
        ]
    )
    assert [r["error"] for r in out] == ["NONE", "FENCED", "NONE"]
    assert sorted(e["kind"] for e in service.events.recent()) == ["fenced_lease", "takeover"]
