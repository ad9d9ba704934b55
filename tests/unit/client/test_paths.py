"""The producer's fast path against its readable path (``READABLE_PATH``, see
pidlease/client/producer.py): the same random workload, sent by a producer on each path to
a fresh fake server, gives the same outcome for every send (its ``RecordMetadata``, or the
error its future or the call raised) and the same batches in the log (which records, in
which batches, with which sequences).

``linger_ms`` is a minute, so no batch is cut by time: boundaries come from the batch
limits, explicit-id holes and the workload's flushes alone, and both runs must agree on
every one of them.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from pidlease import errors
from pidlease.client import producer as producer_module
from pidlease.client.producer import AsyncProducer, Producer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer
from pidlease.wire import protocol as P

TOPICS = {"t": (3, "strict"), "mono": (1, "monotonic")}
SEEDS = range(8)


def _settings(rng: random.Random) -> dict[str, Any]:
    return {
        "batch_records_max": rng.choice([5, 37, 1000]),
        "batch_bytes_max": rng.choice([2048, 9000, 64 * 1024]),
        "linger_ms": 60_000,
        "rng": random.Random(rng.random()),
    }


def _value(rng: random.Random) -> Any:
    size = 100 if rng.random() < 0.8 else rng.choice([0, 1, 99, 101, 700])
    v = rng.randbytes(size)
    kind = rng.random()
    return v if kind < 0.9 else v.hex()[:size] if kind < 0.95 else bytearray(v)


def own_numbering_ops(seed: int) -> list[tuple[Any, ...]]:
    """Sends (mostly the inline case; keys, partitions, other lengths and types), bad
    input, flushes."""
    rng = random.Random(seed)
    ops: list[tuple[Any, ...]] = []
    for _ in range(rng.randrange(300, 1500)):
        r = rng.random()
        if r < 0.01:
            ops.append(("flush",))
        elif r < 0.02:
            ops.append(("send", rng.choice([123, None, "x" * 70_000]), None, None, None))
        elif r < 0.03:
            ops.append(("send", b"v", None, rng.choice([3, -1, True, "0"]), None))
        elif r < 0.035:
            ops.append(("send", b"v", None, None, 5))  # an explicit id: the wrong mode
        else:
            key = rng.randbytes(rng.randrange(1, 9)) if rng.random() < 0.1 else None
            part = rng.randrange(3) if rng.random() < 0.05 else None
            ops.append(("send", _value(rng), key, part, None))
    return ops


def explicit_ops(seed: int) -> list[tuple[Any, ...]]:
    """Explicit sequence ids on a monotonic topic: runs, holes, replays of acked ids
    (resolved as duplicates), flushes. (Reusing an id not acked yet is refused, but
    whether it is acked by then depends on timing: not here.)"""
    rng = random.Random(seed)
    ops: list[tuple[Any, ...]] = []
    nxt = 0
    acked = -1
    for _ in range(rng.randrange(200, 800)):
        r = rng.random()
        if r < 0.03:
            ops.append(("flush",))
            acked = nxt - 1
        elif r < 0.06 and acked >= 0:
            ops.append(("send", b"again", None, None, rng.randrange(acked + 1)))
        else:
            nxt += rng.randrange(2, 5) if r < 0.12 else 1  # a hole now and then
            ops.append(("send", _value(rng), None, None, nxt - 1))
    return ops


def _outcome(fut_or_exc: Any) -> Any:
    if isinstance(fut_or_exc, BaseException):
        return ("raised", type(fut_or_exc).__name__, str(fut_or_exc))
    exc = fut_or_exc.exception(10)
    return ("failed", type(exc).__name__) if exc is not None else fut_or_exc.result(0)


def _log(srv: FakePartitionServer, topic: str) -> list[list[tuple[Any, ...]]]:
    """Per partition: each batch as (base sequence, [(key, value), ...])."""
    out = []
    for p in range(TOPICS[topic][0]):
        batches = []
        for b in srv.parts[(topic, p)].batches:
            h = P.decode_batch_header(b)
            recs = [(r.key, r.value) for r in P.iter_records(b, h, 0, topic, p)]
            batches.append((h.base_sequence, recs))
        out.append(batches)
    return out


def _run_blocking(
    readable: bool,
    topic: str,
    ops: list[tuple[Any, ...]],
    settings: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[Any], list[Any], bool]:
    monkeypatch.setattr(producer_module, "READABLE_PATH", readable)
    srv = FakePartitionServer(TOPICS).start()
    try:
        coord = FakeCoordinator(srv, TOPICS)
        results: list[Any] = []
        with Producer(
            "http://fake", topic=topic, http_transport=coord.transport(), **settings
        ) as p:
            for op in ops:
                if op[0] == "flush":
                    p.flush()
                    continue
                try:
                    results.append(p.send(*op[1:]))
                except errors.PidleaseError as exc:
                    results.append(exc)
            p.flush()
            inline = p._fast  # the inline case was open to sends (never on the readable path)
        return [_outcome(r) for r in results], _log(srv, topic), inline
    finally:
        srv.stop()


def _run_async(
    readable: bool,
    topic: str,
    ops: list[tuple[Any, ...]],
    settings: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[Any], list[Any]]:
    monkeypatch.setattr(producer_module, "READABLE_PATH", readable)
    srv = FakePartitionServer(TOPICS).start()

    async def main() -> list[Any]:
        coord = FakeCoordinator(srv, TOPICS)
        out: list[Any] = []
        async with AsyncProducer(
            "http://fake", topic=topic, http_transport=coord.transport(), **settings
        ) as p:
            for op in ops:
                if op[0] == "flush":
                    await p.flush()
                    continue
                try:
                    out.append(await p.send(*op[1:]))
                except errors.PidleaseError as exc:
                    out.append(exc)
            await p.flush()
        return [
            ("raised", type(r).__name__, str(r))
            if isinstance(r, BaseException)
            else ("failed", type(r.exception()).__name__)
            if r.exception() is not None
            else r.result()
            for r in out
        ]

    try:
        return asyncio.run(main()), _log(srv, topic)
    finally:
        srv.stop()


@pytest.mark.parametrize("seed", SEEDS)
def test_blocking_producer_fast_and_readable_paths_agree(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = own_numbering_ops(seed)
    fast = _run_blocking(False, "t", ops, _settings(random.Random(seed)), monkeypatch)
    readable = _run_blocking(True, "t", ops, _settings(random.Random(seed)), monkeypatch)
    assert fast[0] == readable[0]  # every send: its metadata or its error
    assert fast[1] == readable[1]  # the log: the same batches
    assert fast[2] and not readable[2]  # and the two runs did take different paths
    assert sum(1 for o in fast[0] if not isinstance(o, tuple)) > 250


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_blocking_producer_paths_agree_with_explicit_ids(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = explicit_ops(seed)
    fast = _run_blocking(False, "mono", ops, _settings(random.Random(seed)), monkeypatch)
    readable = _run_blocking(True, "mono", ops, _settings(random.Random(seed)), monkeypatch)
    assert fast[:2] == readable[:2]
    assert any(not isinstance(o, tuple) and o.duplicate for o in fast[0])


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_async_producer_fast_and_readable_paths_agree(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for topic, ops in (("t", own_numbering_ops(seed)), ("mono", explicit_ops(seed))):
        fast = _run_async(False, topic, ops, _settings(random.Random(seed)), monkeypatch)
        readable = _run_async(True, topic, ops, _settings(random.Random(seed)), monkeypatch)
        assert fast == readable
