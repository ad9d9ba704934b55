"""Retention over Kafka batches: segments holding only a Kafka producer's batches go by age
like ours, and its state (epoch, last sequence, last batches) survives in the snapshot's
rows, so after a reopen it still answers by Kafka's rules rather than UNKNOWN_PRODUCER_ID."""

from __future__ import annotations

import asyncio
from pathlib import Path

from partition_server.partition import Partition
from partition_server.producer_state import Outcome
from partition_server.retention import LogPolicy
from partition_server.testing import open_part
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P
from tests.helpers import ManualClock
from tests.unit.server.test_retention import (
    HOUR_MS,
    OLD_TS,
    SEG,
    fill,
    make_log_manager,
    reopen,
    retain,
    shut,
)

KPID = 7


def kafka(epoch: int, seq: int, ts: int) -> bytes:
    return K.encode_kafka_batch(
        [(None, b"x" * 600)],
        producer_id=KPID,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp_ms=ts,
    )


def decide(part: Partition, raw: bytes) -> tuple[Outcome, int]:
    h = P.decode_batch_header(raw)
    d = part.state.check_append(h.pid, h.generation, h.base_sequence, h.count)
    return d.outcome, d.base_offset


def test_a_kafka_pid_whose_segments_all_went_keeps_its_state(tmp_path: Path) -> None:
    clock = ManualClock(100 * HOUR_MS)
    policy = LogPolicy(retention_ms=HOUR_MS, segment_bytes=SEG)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        b = make_log_manager(tmp_path, clock, part)
        for seq in range(5):
            raw = kafka(3, seq, OLD_TS)
            h = K.validate_kafka_batch(raw)
            d, _ = part.append(memoryview(raw), h, lambda *_: None, epoch=part.leader_epoch)
            assert d.outcome is Outcome.APPEND
        await fill(part, 8, range(20), OLD_TS)  # ours, old too
        await fill(part, 8, range(20, 30), clock.now)
        await b.snapshot_now()
        assert await retain(b, clock.now) > 0
        first = part.log.segments[0].base_offset
        assert first > 5, "the Kafka producer's batches are all deleted"
        await shut(part)
        again = reopen(tmp_path, clock, b, policy=policy)
        assert again.log.log_start_offset == first
        assert decide(again, kafka(3, 5, 1)) == (Outcome.APPEND, -1)  # not UNKNOWN_PID
        assert decide(again, kafka(3, 4, 1)) == (Outcome.DUPLICATE, 4)  # its first offset
        assert decide(again, kafka(2, 5, 1))[0] is Outcome.FENCED
        assert decide(again, kafka(4, 0, 1))[0] is Outcome.APPEND
        await shut(again)

    asyncio.run(go())
