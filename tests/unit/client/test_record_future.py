"""RecordFuture (one shared Condition, resolution per run, lazy metadata) behaves as a
concurrent.futures.Future for every way a user can wait on it; ProducerBatch keeps batches
within their limits and explicit sequence ids contiguous, and builds the same bytes as
``protocol.encode_batch``."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import pytest

from pidlease.client.producer_batch import ProducerBatch
from pidlease.client.record_future import (
    BatchAck,
    fail_all,
    fail_outcome,
    future_class,
    resolve_outcome,
)
from pidlease.client.sender import RecordMetadata
from pidlease.wire import protocol
from pidlease.wire.protocol import BATCH_HEADER_SIZE

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True


def make_runs(*sizes: int) -> tuple[threading.Condition, list[ProducerBatch], list[cf.Future]]:  # type: ignore[type-arg]
    """Linked runs (the blocking Producer's) of ``sizes`` records, and all their futures."""
    cond = threading.Condition()
    cls = future_class(cond)
    runs, futs = [], []
    for n in sizes:
        run = ProducerBatch(0.0, -1, 1000, 1 << 20, linked=True)
        for _ in range(n):
            f = cls()
            assert run.add(None, b"v", f, -1)
            futs.append(f)
        runs.append(run)
    return cond, runs, futs


def test_resolve_gives_each_record_its_metadata() -> None:
    cond, (run,), futs = make_runs(3)
    assert all(isinstance(f, cf.Future) and not f.done() for f in futs)
    resolve_outcome(cond, run, BatchAck("t", 2, 100, 7, False))
    assert all(f.done() for f in futs)
    assert [f.result(0) for f in futs] == [
        RecordMetadata("t", 2, 100 + i, 7 + i, False) for i in range(3)
    ]
    assert futs[0].result() is futs[0].result()  # built once


def test_duplicate_without_offsets_and_failure() -> None:
    cond, (first, second), futs = make_runs(1, 1)
    resolve_outcome(cond, first, BatchAck("t", 0, -1, 5, True))
    assert futs[0].result() == RecordMetadata("t", 0, -1, 5, True)
    err = RuntimeError("fenced")
    fail_all(cond, [first, second], err)  # the resolved one keeps its result
    assert futs[0].exception() is None and futs[1].exception() is err
    with pytest.raises(RuntimeError):
        futs[1].result()
    resolve_outcome(cond, second, BatchAck("t", 0, 0, 0, False))  # failed stays failed
    assert futs[1].exception() is err


def test_timeout_cancel_and_callbacks() -> None:
    cond, (run,), futs = make_runs(3)
    with pytest.raises(TimeoutError):
        futs[0].result(timeout=0.01)
    assert futs[1].cancel() and futs[1].cancelled()
    seen = []
    futs[2].add_done_callback(lambda f: seen.append(f.result().offset))
    resolve_outcome(cond, run, BatchAck("t", 0, 10, 0, False))
    assert futs[1].cancelled()  # a cancelled record stays cancelled
    assert not futs[0].cancel()  # a resolved one cannot be cancelled
    with pytest.raises(cf.CancelledError):
        futs[1].result()
    assert seen == [12]
    late = []
    futs[0].add_done_callback(lambda f: late.append(f.done()))  # already done: called now
    assert late == [True]


def test_callback_on_failure() -> None:
    cond, (run,), futs = make_runs(2)
    seen: list[object] = []
    futs[1].add_done_callback(lambda f: seen.append(f.exception()))
    err = ValueError("x")
    fail_outcome(cond, run, err)
    assert seen == [err]


def test_waiter_on_one_future_survives_others_resolving() -> None:
    """The shared Condition wakes every waiter; result() must re-check, not time out."""
    cond, (first, second), futs = make_runs(1, 1)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(futs[1].result(timeout=5)))
    t.start()
    time.sleep(0.05)
    resolve_outcome(cond, first, BatchAck("t", 0, 0, 0, False))  # wakes the waiter early
    time.sleep(0.05)
    assert t.is_alive()
    resolve_outcome(cond, second, BatchAck("t", 0, 1, 1, False))
    t.join(5)
    assert got == [RecordMetadata("t", 0, 1, 1, False)]


def test_module_wait_as_completed_and_asyncio() -> None:
    cond, (first, second), futs = make_runs(2, 2)
    threading.Timer(
        0.05, lambda: resolve_outcome(cond, first, BatchAck("t", 0, 0, 0, False))
    ).start()
    done, _not_done = cf.wait(futs, timeout=5, return_when=cf.FIRST_COMPLETED)
    assert set(done) == set(futs[:2])
    threading.Timer(0.05, lambda: fail_outcome(cond, second, ValueError("x"))).start()
    assert len(list(cf.as_completed(futs, timeout=5))) == 4
    assert cf.wait(futs, timeout=5).not_done == set()

    async def main() -> RecordMetadata:
        c, (r,), fs = make_runs(1)
        asyncio.get_running_loop().call_later(
            0.02, resolve_outcome, c, r, BatchAck("t", 0, 3, 3, False)
        )
        return await asyncio.wrap_future(fs[0])

    assert asyncio.run(main()).offset == 3


def test_producer_batch_limits_and_contiguity() -> None:
    value = b"x" * 92  # 100 bytes encoded
    run = ProducerBatch(0.0, -1, 3, BATCH_HEADER_SIZE + 250)
    assert run.add(None, value, 1, -1) and run.add(None, value, 2, -1)
    assert not run.add(None, value, 3, -1)  # over bytes
    assert run.add(None, b"", 3, -1) and not run.add(None, b"", 4, -1)  # over count
    assert run.full(8) and run.count == 3 and run.futures == [1, 2, 3]
    ex = ProducerBatch(0.0, 5, 10, 10_000)
    assert (
        ex.add(None, value, 1, 5) and ex.add(None, value, 2, 6) and not ex.add(None, value, 3, 8)
    )  # a hole
    assert ex.last_seq == 6 and ex.size == BATCH_HEADER_SIZE + 2 * 100
    keyed = ProducerBatch(0.0, -1, 10, 10_000)
    assert keyed.add(b"key", value, 1, -1) and keyed.size == BATCH_HEADER_SIZE + 103


@pytest.mark.parametrize(
    "records",
    [
        [(None, b"a" * 100)] * 7,  # uniform: one head, joined
        [(None, b"a" * n) for n in (0, 5, 100, 3, 3)],  # lengths vary
        [(None, b"v1"), (b"k", b"v2"), (b"", b""), (None, b"")],  # keys, empty key and value
        [(None, b"ab"), (None, b""), (None, b"abcd")],  # total as if uniform, lengths not
        [(None, b"ab"), (None, b"ab"), (None, b"a")],  # uniform until the last
    ],
)
def test_producer_batch_batch_is_encode_batch(records: list[tuple[bytes | None, bytes]]) -> None:
    run = ProducerBatch(0.0, -1, 1000, 1 << 20)
    for k, v in records:
        assert run.add(k, v, None, -1)
    kw = {"pid": 77, "generation": 3, "base_sequence": 40, "timestamp_ms": 1234}
    got = run.batch(**kw)
    assert got == protocol.encode_batch(records, **kw)
    h = protocol.validate_batch(got)
    assert h.count == len(records) and h.size == len(got) == run.size
    parts = [protocol.encode_record(k, v) for k, v in records]
    assert protocol.batch_from_parts(parts, len(parts), **kw) == protocol.batch_from_records(
        b"".join(parts), len(parts), **kw
    )


def test_the_future_internals_this_module_uses_are_there() -> None:
    """RecordFuture speaks concurrent.futures.Future's private protocol (the note in
    record_future.py says why): a Python whose Future changed it fails here, by name."""
    import concurrent.futures._base as base

    assert (base.PENDING, base.FINISHED, base.CANCELLED, base.CANCELLED_AND_NOTIFIED) == (
        "PENDING",
        "FINISHED",
        "CANCELLED",
        "CANCELLED_AND_NOTIFIED",
    )
    plain = cf.Future()  # type: ignore[var-annotated]
    assert {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"} <= set(
        vars(plain)
    )
    assert callable(cf.Future._invoke_callbacks)  # type: ignore[attr-defined]
    for waiter in (
        base._AsCompletedWaiter(),
        base._FirstCompletedWaiter(),
        base._AllCompletedWaiter(1, stop_on_exception=False),
    ):
        assert callable(waiter.add_result) and callable(waiter.add_exception)
