"""The SDK's side of "a refusal leaves no hole" (CONTRACT "Append rules", issue 12 finding
2): on a monotonic topic with explicit sequence ids (holes between batches) and
``max_in_flight`` 5, a batch refused with a retriable error while later ones are in flight
is resent first, the later ones after it in order, and nothing is resolved as written that
the server did not write. The fake partition server (pidlease.testing.fakes) follows the rule: after
an injected refusal, the PID's later batches are answered SEQUENCE_UNKNOWN until the
refused one is resent."""

from __future__ import annotations

import random

import pytest

from pidlease import errors
from pidlease.client.producer import Producer

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True

TOPICS = {"mono": (1, "monotonic")}


def _plan(rng: random.Random, batches: int) -> list[list[int]]:
    """Sequence ids per batch: 1 to 60 contiguous ids, a hole of 1..9 after each."""
    out, seq = [], rng.randrange(100)
    for _ in range(batches):
        n = rng.choice((1, 3, rng.randint(1, 60)))
        out.append(list(range(seq, seq + n)))
        seq += n + rng.randint(1, 9)
    return out


@pytest.mark.parametrize(
    "code", [errors.ServerUnavailable.code, errors.TooManyPids.code, errors.NotLeader.code]
)
def test_refused_batch_is_resent_first_and_nothing_is_lost(fake, code: int) -> None:  # type: ignore[no-untyped-def]
    srv, coord = fake
    plan = _plan(random.Random(code), 120)
    refused_at = (3, 17, 18, 40)  # the 3rd request is the first batch's third: a full window
    srv.fail_at = dict.fromkeys(refused_at, code)
    with Producer(
        "http://fake",
        topic="mono",
        http_transport=coord.transport(),  # type: ignore[arg-type]
        max_in_flight=5,
        linger_ms=0,
        retry_backoff_ms=1,
        retry_backoff_max_ms=5,
    ) as p:
        futs = [p.send(b"s%d" % s, sequence_id=s) for batch in plan for s in batch]
        p.flush()
        metas = [f.result(5) for f in futs]
        assert p.stats["retries"] >= len(refused_at)
    ids = [s for batch in plan for s in batch]
    recs = srv.records("mono", 0)
    assert [r.sequence_id for r in recs] == ids  # every record once, in order
    assert [m.sequence_id for m in metas] == ids
    assert not any(m.duplicate for m in metas)  # nothing was resent after being written
    assert [recs[m.offset].sequence_id for m in metas] == ids
    # After each refusal of a batch from sequence N, the later batches already in flight
    # were refused too (SEQUENCE_UNKNOWN, or the next injected refusal), and the next batch
    # the server took was the resend of the lowest refused one.
    assert sum(c == code for _, c in srv.answers) == len(refused_at)
    blocked = None
    for base, c in srv.answers:
        if c == code:
            blocked = base if blocked is None else min(blocked, base)
        elif c == errors.SequenceUnknown.code:
            assert blocked is not None and base > blocked, srv.answers
        else:
            assert c == errors.NONE, srv.answers
            assert blocked is None or base == blocked, srv.answers
            blocked = None


def test_a_later_batch_answered_duplicate_is_resolved_only_when_written(fake) -> None:  # type: ignore[no-untyped-def]
    """A resend after a lost connection: the batches the server has are DUPLICATE with their
    original offsets, the refused one in between is written, none is resolved twice."""
    srv, coord = fake
    plan = _plan(random.Random(7), 40)
    srv.drop_after_append = 2
    srv.fail_at = {6: errors.ServerUnavailable.code}
    with Producer(
        "http://fake",
        topic="mono",
        http_transport=coord.transport(),  # type: ignore[arg-type]
        max_in_flight=5,
        linger_ms=0,
        retry_backoff_ms=1,
        retry_backoff_max_ms=5,
    ) as p:
        futs = [p.send(b"s%d" % s, sequence_id=s) for batch in plan for s in batch]
        p.flush()
        metas = [f.result(5) for f in futs]
    ids = [s for batch in plan for s in batch]
    recs = srv.records("mono", 0)
    assert [r.sequence_id for r in recs] == ids
    assert [recs[m.offset].sequence_id for m in metas] == ids
    assert any(m.duplicate for m in metas)  # the appended-but-unanswered batches
    assert any(c == errors.SequenceUnknown.code for _, c in srv.answers)
