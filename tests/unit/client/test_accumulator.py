"""``Accumulator`` on its own: admission order per partition, the one buffer counter (room
reserved by linked open batches, given back on close and on release), what a sender may
take and when, and the wake-ups (direct, or coalesced through the loop)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pidlease.client.accumulator import Accumulator
from pidlease.client.config import RECORD_OVERHEAD, ProducerConfig
from pidlease.client.producer_batch import ProducerBatch
from pidlease.wire.protocol import BATCH_HEADER_SIZE


def make(
    *, linked: bool = False, threaded: bool = False, partitions: int = 2, **settings: Any
) -> tuple[Accumulator, list[int], list[Callable[[], None]]]:
    """An accumulator, the partitions whose sender was woken (in order), and the calls
    scheduled on the 'loop' (run them to deliver coalesced wake-ups)."""
    cfg = ProducerConfig(**{"linger_ms": 5, **settings})
    scheduled: list[Callable[[], None]] = []
    acc = Accumulator(
        cfg,
        partitions,
        lock=threading.Lock(),
        clock_ms=lambda: 100.0,
        linked=linked,
        call_soon_threadsafe=scheduled.append if threaded else None,
    )
    woken: list[int] = []
    for p in range(partitions):
        acc.attach(p, lambda p=p: woken.append(p))  # type: ignore[misc]
    return acc, woken, scheduled


def values_of(batch: ProducerBatch | None) -> list[bytes]:
    assert batch is not None
    return list(batch.values)


def test_batches_close_in_admission_order_and_send_batch_goes_after_earlier_sends() -> None:
    acc, woken, _ = make(batch_records_max=2)
    with acc.lock:
        for v in (b"a", b"b", b"c"):  # a, b fill one batch; c opens the next
            acc.append(0, None, v, object(), -1)
        call = ProducerBatch(100.0, -1, 2, 1 << 20)
        call.add(None, b"x", object(), -1)
        acc.append_closed(0, [call])  # the open [c] closes first
    assert [values_of(b) for b in acc.closed[0]] == [[b"a", b"b"], [b"c"], [b"x"]]
    assert acc.open[0] is None and acc.closed_records == [4, 0]
    assert woken == [0, 0, 0, 0], "new open batches and closes wake the sender"
    for expected in ([b"a", b"b"], [b"c"], [b"x"]):
        batch = acc.next_batch(0)
        assert values_of(batch) == expected
        assert batch is not None
        acc.pop(0, batch)
    assert acc.next_batch(0) is None and acc.empty(0)


def test_next_batch_closes_the_open_one_and_leaves_it_queued_until_popped() -> None:
    acc, _, _ = make()
    with acc.lock:
        acc.append(1, None, b"a", object(), -1)
    batch = acc.next_batch(1)
    assert batch is not None and acc.open[1] is None
    assert acc.next_batch(1) is batch, "still queued: a build that fails leaves it here"
    assert acc.take_all(1) == [batch] and acc.empty(1)


def test_sendable_when_closed_full_lingered_or_forced() -> None:
    acc, _, _ = make(batch_records_max=2)
    assert not acc.sendable(0, 1000.0, force=True), "nothing to send"
    with acc.lock:
        acc.append(0, None, b"a", object(), -1)
    assert acc.linger_deadline_ms(0) == 105.0 and acc.oldest_ms(0) == 100.0
    assert not acc.sendable(0, 104.9, force=False)
    assert acc.sendable(0, 105.0, force=False)
    assert acc.sendable(0, 100.0, force=True)
    with acc.lock:
        acc.append(0, None, b"b", object(), -1)  # full by count
    assert acc.sendable(0, 100.0, force=False)


def test_linked_batches_reserve_room_and_the_counter_comes_back_to_zero() -> None:
    acc, _, _ = make(linked=True, batch_records_max=100, buffer_records_max=150)
    value = b"v" * 10
    with acc.lock:
        acc.append(0, None, value, _future(), -1)
    first = acc.open[0]
    assert first is not None
    assert first.cap == 100, "room for a batch of records as long as the first"
    assert acc.used == 100 and acc.unresolved() == 1
    with acc.lock:
        acc.append(1, None, value, _future(), -1)
    second = acc.open[1]
    assert second is not None
    assert second.cap == 50, "only what is left of buffer_records_max"
    assert acc.used == 150 and not acc.has_room(None)
    assert acc.has_room(1), "its own open batch has room reserved"
    with acc.lock:
        acc.close_all()
    assert acc.used == 2 and acc.unresolved() == 2, "closing gives the unused room back"
    acc.release(2)
    assert acc.used == 0 and acc.has_room(None)


def test_an_unlinked_batch_counts_each_record() -> None:
    acc, _, _ = make(buffer_records_max=1000, batch_records_max=1000)
    with acc.lock:
        for _ in range(3):
            acc.append(0, None, b"v", object(), -1)
    assert acc.used == 3 and acc.unresolved() == 3
    batch = acc.open[0]
    assert batch is not None and batch.total() == BATCH_HEADER_SIZE + 3 * (1 + RECORD_OVERHEAD)


def test_a_hole_in_explicit_ids_starts_a_new_batch() -> None:
    acc, _, _ = make()
    with acc.lock:
        for seq in (5, 6, 9):
            acc.append(0, None, b"v", object(), seq)
    assert [(b.first_seq, b.last_seq) for b in acc.closed[0]] == [(5, 6)]
    open_batch = acc.open[0]
    assert open_batch is not None and (open_batch.first_seq, open_batch.last_seq) == (9, 9)


def test_wake_ups_from_callers_threads_are_coalesced_through_the_loop() -> None:
    acc, woken, scheduled = make(threaded=True, batch_records_max=1)
    with acc.lock:
        for p in (0, 1, 0, 1):
            acc.append(p, None, b"v", object(), -1)
    assert woken == [] and len(scheduled) == 1, "one call to the loop for the burst"
    scheduled.pop()()
    assert sorted(woken) == [0, 1]


def test_space_waiters_are_woken_by_release() -> None:
    acc, _, _ = make(buffer_records_max=1000, batch_records_max=1000)
    with acc.lock:
        for _ in range(1000):
            acc.append(0, None, b"v", object(), -1)
    got: list[bool] = []

    def waiter() -> None:
        with acc.lock:
            got.append(acc.space.wait_for(lambda: acc.has_room(None), timeout=5))

    t = threading.Thread(target=waiter)
    t.start()
    acc.release(10)
    t.join(5)
    assert got == [True]


def _future() -> Any:
    from pidlease.client.record_future import future_class

    return future_class(threading.Condition())()
