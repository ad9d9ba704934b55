"""The SDK treats TOO_MANY_PIDS (a partition at its tracked-PID limit, issue 6) and
NOT_ENOUGH_REPLICAS (an in-sync set below min_insync_replicas, issue 16) as
retriable: it backs off and resends, with nothing lost or duplicated (pidlease/client/sender.py
retries every error whose class says ``retriable``)."""

from __future__ import annotations

from pidlease import errors
from pidlease.client.producer import Producer

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"one": (1, "strict")}


def test_too_many_pids_is_retried_with_backoff(fake) -> None:  # type: ignore[no-untyped-def]
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
    """NOT_ENOUGH_REPLICAS (issue 16: the in-sync set below min_insync_replicas) is resent
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
