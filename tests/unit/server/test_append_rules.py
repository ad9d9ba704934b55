"""``ProducerStateTable.check_append`` (the fast twin, inline over the columns) against
``append_rules.check_append`` (the readable rules) on the same table, after random appends,
refusals, fences, durability, expiry and the tracked-PID limit (the table's
``check_fence`` is the rules' own: fences are not on the per-batch path). The property test
checks both against the contract's model; this one covers what it leaves out (``now_ms``:
TOO_MANY_PIDS and eviction; PID 0; expiry; Kafka batches and ours on one PID)."""

from __future__ import annotations

from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from partition_server import append_rules
from partition_server.producer_state import FenceOutcome, Outcome, ProducerStateTable
from pidlease.wire import protocol as P

PIDS = st.sampled_from((0, 1, 2, 3, 4))
KAFKA = P.KAFKA_GENERATION_BASE  # Kafka epochs 0..2 (Kafka's rules), mixed with ours
op = st.one_of(
    st.tuples(
        st.just("send"),
        PIDS,
        st.sampled_from((1, 2, 3, KAFKA, KAFKA + 1, KAFKA + 2)),
        st.integers(0, 12),
        st.integers(1, 3),
        st.booleans(),
        st.booleans(),
    ),
    st.tuples(st.just("fence"), PIDS, st.integers(1, 3), st.booleans()),
    st.tuples(st.just("durable"), st.integers(0, 40)),
    st.tuples(st.just("expire"), st.integers(0, 1)),
    st.tuples(st.just("tick"), st.integers(1, 50)),
)


@settings(max_examples=1000, deadline=None)
@given(
    mode=st.sampled_from(("strict", "monotonic", "off")),
    pids_max=st.integers(1, 4),
    ops=st.lists(op, max_size=50),
)
def test_fast_twin_answers_as_the_rules(
    mode: str, pids_max: int, ops: list[tuple[Any, ...]]
) -> None:
    t = ProducerStateTable(
        mode=mode, batches_kept=3, pids_max=pids_max, evict_idle_min_ms=30, expire_ms=60
    )
    now = 0
    offset = 0
    for o in ops:
        kind = o[0]
        if kind == "send":
            _, pid, gen, base, count, durable, refuse = o
            readable = append_rules.check_append(t, pid, gen, base, count, now)
            fast = t.check_append(pid, gen, base, count, now)
            assert fast == readable, (o, fast, readable)
            event(fast.outcome.name)
            if fast.outcome is Outcome.APPEND:
                if refuse:
                    t.note_refused(pid, gen, base, count)
                else:
                    t.apply_append(pid, gen, base, count, offset, now, durable=durable)
                    offset += count
        elif kind == "fence":
            _, pid, gen, create = o
            if t.check_fence(pid, gen, create) is FenceOutcome.APPEND:
                t.apply_fence(pid, gen, now)
                offset += 1
        elif kind == "durable":
            t.mark_durable(min(o[1], offset))
        elif kind == "expire" and t.expire_ms is not None:
            t.expire(now, t.expire_ms)
        elif kind == "tick":
            now += o[1]
