"""RecordFuture (one shared Condition, batch resolution, lazy metadata) behaves as a
concurrent.futures.Future for every way a user can wait on it; RecordRun keeps batches
within their limits and explicit sequence ids contiguous."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import pytest

from pidlease.protocol import BATCH_HEADER_SIZE, encode_record
from pidlease.record_future import BatchAck, fail_all, future_class, resolve_batch
from pidlease.record_run import RecordRun
from pidlease.sender import RecordMetadata


def make(n: int) -> tuple[threading.Condition, list[cf.Future]]:  # type: ignore[type-arg]
    cond = threading.Condition()
    cls = future_class(cond)
    return cond, [cls() for _ in range(n)]


def test_resolve_gives_each_record_its_metadata() -> None:
    cond, futs = make(3)
    assert all(isinstance(f, cf.Future) and not f.done() for f in futs)
    resolve_batch(cond, futs, BatchAck("t", 2, 100, 7, False))
    assert [f.result(0) for f in futs] == [RecordMetadata("t", 2, 100 + i, 7 + i, False)
                                           for i in range(3)]
    assert futs[0].result() is futs[0].result()  # built once


def test_duplicate_without_offsets_and_failure() -> None:
    cond, futs = make(2)
    resolve_batch(cond, futs[:1], BatchAck("t", 0, -1, 5, True))
    assert futs[0].result() == RecordMetadata("t", 0, -1, 5, True)
    err = RuntimeError("fenced")
    fail_all(cond, futs, err)   # the resolved one keeps its result
    assert futs[0].exception() is None and futs[1].exception() is err
    with pytest.raises(RuntimeError):
        futs[1].result()


def test_timeout_cancel_and_callbacks() -> None:
    cond, futs = make(3)
    with pytest.raises(TimeoutError):
        futs[0].result(timeout=0.01)
    assert futs[1].cancel() and futs[1].cancelled()
    seen = []
    futs[2].add_done_callback(lambda f: seen.append(f.result().offset))
    resolve_batch(cond, futs, BatchAck("t", 0, 10, 0, False))
    assert futs[1].cancelled()  # a cancelled record stays cancelled
    with pytest.raises(cf.CancelledError):
        futs[1].result()
    assert seen == [12]
    late = []
    futs[0].add_done_callback(lambda f: late.append(f.done()))  # already done: called now
    assert late == [True]


def test_waiter_on_one_future_survives_others_resolving() -> None:
    """The shared Condition wakes every waiter; result() must re-check, not time out."""
    cond, futs = make(2)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(futs[1].result(timeout=5)))
    t.start()
    time.sleep(0.05)
    resolve_batch(cond, futs[:1], BatchAck("t", 0, 0, 0, False))  # wakes the waiter early
    time.sleep(0.05)
    assert t.is_alive()
    resolve_batch(cond, futs[1:], BatchAck("t", 0, 1, 1, False))
    t.join(5)
    assert got == [RecordMetadata("t", 0, 1, 1, False)]


def test_module_wait_as_completed_and_asyncio() -> None:
    cond, futs = make(4)
    threading.Timer(0.05, lambda: resolve_batch(cond, futs[:2], BatchAck("t", 0, 0, 0, False))).start()
    done, _not_done = cf.wait(futs, timeout=5, return_when=cf.FIRST_COMPLETED)
    assert set(done) <= set(futs[:2]) and done
    threading.Timer(0.05, lambda: fail_all(cond, futs[2:], ValueError("x"))).start()
    assert len(list(cf.as_completed(futs, timeout=5))) == 4

    async def main() -> RecordMetadata:
        c, fs = make(1)
        asyncio.get_running_loop().call_later(0.02, resolve_batch, c, fs, BatchAck("t", 0, 3, 3, False))
        return await asyncio.wrap_future(fs[0])
    assert asyncio.run(main()).offset == 3


def test_record_run_limits_and_contiguity() -> None:
    rec = encode_record(None, b"x" * 92)          # 100 bytes encoded
    run = RecordRun(0.0, -1, 3, BATCH_HEADER_SIZE + 250)
    assert run.add(rec, 1, -1) and run.add(rec, 2, -1)
    assert not run.add(rec, 3, -1)                # over bytes
    small = encode_record(None, b"")
    assert run.add(small, 3, -1) and not run.add(small, 4, -1)  # over count
    assert run.full(8)
    ex = RecordRun(0.0, 5, 10, 10_000)
    assert ex.add(rec, 1, 5) and ex.add(rec, 2, 6) and not ex.add(rec, 3, 8)  # a hole
    nxt = RecordRun(0.0, 7, 10, 10_000)
    nxt.add(rec, 3, 7)
    assert ex.can_absorb(nxt)
    ex.absorb(nxt)
    assert ex.count == 3 and ex.last_seq == 7 and ex.size == BATCH_HEADER_SIZE + 3 * len(rec)
    gap = RecordRun(0.0, 9, 10, 10_000)
    gap.add(rec, 4, 9)
    assert not ex.can_absorb(gap)
