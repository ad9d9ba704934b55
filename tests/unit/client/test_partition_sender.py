"""``PartitionSender`` on its own, through ``SenderContext`` fakes: a scripted connection
(the test answers each produce request), fake leaders and lease, and a real
``Accumulator`` (the unit's input). No producer is built: the sender has none to call.

What is checked is the send path's exactly-once rules: batches leave in admission order
with consecutive sequences, at most ``max_in_flight`` at once, on one connection; a
retriable answer stops new sends until every answer is in, then every unresolved batch is
resent, in order, with the same bytes (the same sequences); OUT_OF_ORDER behind an earlier
failure is its consequence, on the earliest batch it is fatal; a fenced producer's
batches say whether they may have been written.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from pidlease import errors
from pidlease.client.accumulator import Accumulator
from pidlease.client.config import ProducerConfig
from pidlease.client.sender import PartitionSender, SenderContext, SenderState
from pidlease.wire import protocol

TOPIC = "t"
P = 0


@dataclass(eq=False)
class Sent:
    """One produce request the sender wrote: its batch's sequences and its answer."""

    conn: ScriptedConnection
    correlation_id: int
    base_sequence: int
    count: int
    batch: bytes
    answer: asyncio.Future[protocol.Response]

    def ok(self, base_offset: int) -> None:
        self.answer.set_result(
            protocol.Response(
                self.correlation_id,
                errors.NONE,
                "",
                base_offset=base_offset,
                last_offset=base_offset + self.count - 1,
            )
        )

    def error(self, exc: type[errors.PidleaseError]) -> None:
        self.answer.set_result(protocol.Response(self.correlation_id, exc.code, "scripted"))


@dataclass(eq=False)
class ScriptedConnection:
    address: str
    sent: list[Sent] = field(default_factory=list)
    closed: bool = False
    _corr: int = 0

    def next_correlation_id(self) -> int:
        self._corr += 1
        return self._corr

    def send(
        self, api_key: int, correlation_id: int, data: bytes, *, timeout_ms: int | None = None
    ) -> asyncio.Future[protocol.Response]:
        assert api_key == protocol.PRODUCE
        req = protocol.decode_request(memoryview(data)[4:])
        assert req.batch is not None
        head = protocol.decode_batch_header(req.batch)
        fut: asyncio.Future[protocol.Response] = asyncio.get_running_loop().create_future()
        self.sent.append(
            Sent(self, correlation_id, head.base_sequence, head.count, bytes(req.batch), fut)
        )
        return fut


class FakeLeaders:
    """One connection per leader 'generation': ``move()`` makes the next lookup give a
    new one (a failover)."""

    def __init__(self) -> None:
        self.conns = [ScriptedConnection("leader-0")]
        self.refreshes = 0
        self._moved = False

    async def connection_for(self, partition: int) -> ScriptedConnection:
        return self.conns[-1]

    async def refresh(self) -> None:
        self.refreshes += 1
        if self._moved:
            self.conns.append(ScriptedConnection(f"leader-{len(self.conns)}"))
            self._moved = False

    def move(self) -> None:
        self._moved = True


@dataclass
class FakeLease:
    pid: int = 7
    generation: int = 1
    token: str = "tok"
    ok: bool = True

    def token_ok(self, now_ms: float) -> bool:
        return self.ok


@dataclass
class Rig:
    acc: Accumulator
    sender: PartitionSender
    leaders: FakeLeaders
    lease: FakeLease
    clock: Callable[[], float]
    fatal: list[errors.PidleaseError]
    retries: list[errors.PidleaseError]

    def send(self, value: bytes, seq: int = -1) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self.acc.lock:
            self.acc.append(P, None, value, fut, seq)
        return fut

    @property
    def sent(self) -> list[Sent]:
        return [s for c in self.leaders.conns for s in c.sent]


def make_rig(**settings: Any) -> Rig:
    cfg = ProducerConfig(**{"linger_ms": 0, "retry_backoff_ms": 1, **settings})

    def clock() -> float:  # the real monotonic clock: the backoff waits are ~1 ms
        return time.monotonic() * 1000

    acc = Accumulator(cfg, 1, lock=threading.Lock(), clock_ms=clock, linked=False)
    leaders, lease = FakeLeaders(), FakeLease()
    fatal: list[errors.PidleaseError] = []
    retries: list[errors.PidleaseError] = []
    sender: PartitionSender

    def on_fatal(exc: errors.PidleaseError) -> None:
        fatal.append(exc)
        sender.fail_all(exc)  # what the producer does: every sender fails its records

    ctx = SenderContext(
        topic=TOPIC,
        config=cfg,
        accumulator=acc,
        leaders=leaders,  # type: ignore[arg-type]  # a ScriptedConnection: the part it uses
        lease=lease,
        clock_ms=clock,
        wall_ms=clock,
        rng=random.Random(1),
        future_condition=None,
        on_fatal=on_fatal,
        on_retry=lambda _p, exc: retries.append(exc),
        on_resent=lambda _n: None,
    )
    sender = PartitionSender(ctx, P, next_sequence=0)
    acc.attach(P, sender.wake)
    return Rig(acc, sender, leaders, lease, clock, fatal, retries)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


async def settle(rounds: int = 20) -> None:
    """Let the sender task run until it waits again."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


def test_batches_leave_in_order_with_consecutive_sequences_within_the_window() -> None:
    async def main() -> None:
        rig = make_rig(batch_records_max=2, max_in_flight=2)
        rig.sender.start()
        futs = [rig.send(b"v%d" % i) for i in range(10)]  # 5 batches of 2
        await settle()
        assert [(s.base_sequence, s.count) for s in rig.sent] == [(0, 2), (2, 2)]
        rig.sent[1].ok(2)  # answered out of order: nothing resolves before the head
        await settle()
        assert not any(f.done() for f in futs)
        assert len(rig.sent) == 2, "the window holds until the head resolves"
        rig.sent[0].ok(0)
        await until(lambda: len(rig.sent) == 4, "two more batches")
        assert [f.result().offset for f in futs[:4]] == [0, 1, 2, 3]
        offset = 4
        while len(rig.sent) < 5 or not rig.sent[-1].answer.done():
            for s in rig.sent:
                if not s.answer.done():
                    s.ok(offset)
                    offset += s.count
            await settle()
        await until(lambda: all(f.done() for f in futs), "every record resolved")
        assert [s.base_sequence for s in rig.sent] == [0, 2, 4, 6, 8]
        assert [f.result().sequence_id for f in futs] == list(range(10))
        assert rig.sender.last_acked == 9
        assert rig.acc.used == 0, "the room of every resolved record was given back"
        assert len({s.conn for s in rig.sent}) == 1
        rig.sender.close()
        await asyncio.wait_for(rig.sender.task, 2)  # type: ignore[arg-type]

    run(main)


def test_a_retriable_answer_resends_every_unresolved_batch_in_order_with_the_same_bytes() -> None:
    async def main() -> None:
        rig = make_rig(batch_records_max=1, max_in_flight=3)
        rig.sender.start()
        futs = [rig.send(b"v%d" % i) for i in range(3)]
        await settle()
        first = list(rig.sent)
        assert [s.base_sequence for s in first] == [0, 1, 2]
        rig.leaders.move()
        first[0].error(errors.NotLeader)
        await settle()
        assert len(rig.sent) == 3, "nothing is resent while answers are still coming"
        first[1].ok(10)  # written before the failover: it must still resolve in order
        first[2].error(errors.NotLeader)
        await until(lambda: len(rig.sent) == 5, "the two unresolved batches resent")
        again = rig.sent[3:]
        assert rig.leaders.refreshes == 1
        assert [s.conn.address for s in again] == ["leader-1", "leader-1"]
        assert [(s.base_sequence, s.batch) for s in again] == [
            (0, first[0].batch),
            (2, first[2].batch),
        ]
        again[0].ok(9)
        again[1].ok(11)
        await until(lambda: all(f.done() for f in futs), "every record resolved")
        assert [f.result().offset for f in futs] == [9, 10, 11]
        assert [type(e) for e in rig.retries] == [errors.NotLeader, errors.NotLeader]
        assert not rig.fatal

    run(main)


def test_out_of_order_behind_an_earlier_failure_is_retried_on_the_earliest_it_is_fatal() -> None:
    async def main() -> None:
        rig = make_rig(batch_records_max=1, max_in_flight=2)
        rig.sender.start()
        futs = [rig.send(b"a"), rig.send(b"b")]
        await settle()
        rig.sent[0].error(errors.ServerUnavailable)
        rig.sent[1].error(errors.OutOfOrderSequence)  # a consequence of the first failure
        await until(lambda: len(rig.sent) == 4, "both resent")
        assert not rig.fatal
        rig.sent[2].error(errors.OutOfOrderSequence)  # the earliest unresolved: real
        await until(lambda: bool(rig.fatal), "the producer failed")
        assert isinstance(rig.fatal[0], errors.OutOfOrderSequence)
        await until(lambda: all(f.done() for f in futs), "both records failed")
        assert rig.sender.state is SenderState.FAILED

    run(main)


def test_fenced_says_per_batch_whether_it_may_have_been_written() -> None:
    async def main() -> None:
        rig = make_rig(batch_records_max=1, max_in_flight=1)
        rig.lease.ok = True
        rig.sender.start()
        sent_fut = rig.send(b"sent")
        await settle()
        held = [rig.send(b"held%d" % i, -1) for i in range(2)]  # the window is full
        await settle()
        assert len(rig.sent) == 1
        cause = errors.ProducerFenced("taken over")
        rig.fatal.append(cause)
        rig.sender.fail_all(cause)
        # never sent: not written, for sure
        for f in held:
            exc = f.exception()
            assert isinstance(exc, errors.ProducerFenced)
            assert exc.extra["indeterminate"] is False
        # in flight when fenced: its answer is waited for, and is final
        assert not sent_fut.done()
        rig.sent[0].error(errors.ServerUnavailable)  # no proof it wrote nothing
        await until(sent_fut.done, "the in-flight batch settled")
        exc = sent_fut.exception()
        assert isinstance(exc, errors.ProducerFenced)
        assert exc.extra["indeterminate"] is True
        assert (exc.extra["first_sequence"], exc.extra["last_sequence"]) == (0, 0)
        assert rig.acc.empty(P) and rig.acc.used == 0

    run(main)


def test_an_open_batch_lingers_unless_full_and_a_closing_sender_sends_it_at_once() -> None:
    async def main() -> None:
        rig = make_rig(linger_ms=50_000, batch_records_max=3)
        rig.sender.start()
        rig.send(b"a")
        await settle()
        assert rig.sent == [], "lingering"
        first_ms = rig.acc.oldest_ms(P)
        assert first_ms is not None
        assert rig.acc.linger_deadline_ms(P) == first_ms + 50_000
        for v in (b"b", b"c", b"d"):  # the third fills the batch, the fourth opens a new one
            rig.send(v)
        await until(lambda: len(rig.sent) == 1, "the full batch")
        assert rig.sent[0].count == 3
        rig.sender.close()  # the open batch of one record goes without lingering
        await until(lambda: len(rig.sent) == 2, "the last batch")
        assert (rig.sent[1].base_sequence, rig.sent[1].count) == (3, 1)
        rig.sent[0].ok(0)
        rig.sent[1].ok(3)
        await asyncio.wait_for(rig.sender.task, 2)  # type: ignore[arg-type]

    run(main)


def test_a_batch_whose_build_fails_stays_queued_and_is_failed_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pidlease.client import producer_batch

    def broken(*_a: Any, **_k: Any) -> bytes:
        raise RuntimeError("boom")

    monkeypatch.setattr(producer_batch.ProducerBatch, "batch", broken)

    async def main() -> None:
        rig = make_rig()
        rig.sender.start()
        fut = rig.send(b"a")
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(rig.sender.task, 2)  # type: ignore[arg-type]
        assert fut.done() and fut.exception() is not None
        assert rig.sender.resolved == 1 and rig.acc.used == 0 and rig.acc.empty(P)

    run(main)
