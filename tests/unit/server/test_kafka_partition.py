"""Kafka batches in a real partition (log files in a temporary directory, no server):
``kafka_produce`` answers with Kafka's codes and offsets, a retry is answered with the first
offsets, acks=all waits for the in-sync followers; a crash-style reopen (no snapshot, no
clean close) and a snapshot + replay rebuild the same state; a follower fed the leader's
bytes answers alike; a log of both formats reads back through the readers' code and
through ``kafka_fetch`` for Kafka consumers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from partition_server.kafka_partition import (
    KafkaProduceResult,
    kafka_fetch,
    kafka_produce,
)
from partition_server.partition import Partition, Role
from partition_server.produce import NotRouted, ProducePath
from partition_server.testing import log_batches, open_part, tear_tail
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P

PID = 77
BYTES_MAX = 1 << 20


def kb(epoch: int, seq: int, n: int = 2, pid: int = PID) -> bytes:
    return K.encode_kafka_batch(
        [(b"k", b"e%d-s%d-%d" % (epoch, seq, i)) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp_ms=1000,
    )


def kp(
    part: Partition, raw: bytes, acks: int = -1
) -> KafkaProduceResult | asyncio.Future[KafkaProduceResult]:
    """``raw`` through the produce path, routed to ``part`` (which must lead)."""
    path = ProducePath(lambda t, p: (part, None) if part.role is Role.LEADER else (None, ""))
    r = kafka_produce(path, "t", 0, raw, acks=acks, batch_bytes_max=BYTES_MAX)
    assert not isinstance(r, NotRouted)
    return r


async def produce(part: Partition, raw: bytes, acks: int = -1) -> KafkaProduceResult:
    r = kp(part, raw, acks)
    if isinstance(r, KafkaProduceResult):
        return r
    return await asyncio.wait_for(r, 10)


async def close(part: Partition) -> None:
    await part.flusher.wait_idle()
    part.close()


def answers(part: Partition, batches: list[bytes]) -> list[tuple[int, int]]:
    """(code, base offset) the partition would answer to each batch now: the rules alone,
    nothing written (to compare two partitions' states)."""
    out = []
    for raw in batches:
        h = P.decode_batch_header(raw)
        d = part.state.check_append(h.pid, h.generation, h.base_sequence, h.count)
        out.append((d.outcome.value, d.base_offset))
    return out


PROBES = [kb(0, 0), kb(0, 4), kb(1, 0), kb(1, 2), kb(1, 4), kb(1, 3), kb(2, 0), kb(2, 1)]


def test_kafka_rules_through_the_partition(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path, hw=None)
        assert (await produce(part, kb(0, 2))).error_code == K.UNKNOWN_PRODUCER_ID
        first = await produce(part, kb(0, 0))
        assert (first.error_code, first.base_offset) == (K.NONE, 0)
        assert (await produce(part, kb(0, 2))).base_offset == 2
        retry = await produce(part, kb(0, 0))
        assert (retry.error_code, retry.base_offset) == (K.NONE, 0)  # the first offsets
        assert (await produce(part, kb(0, 5))).error_code == K.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert (await produce(part, kb(1, 3))).error_code == K.OUT_OF_ORDER_SEQUENCE_NUMBER
        bumped = await produce(part, kb(1, 0))  # the client's own epoch bump
        assert (bumped.error_code, bumped.base_offset) == (K.NONE, 4)
        assert (await produce(part, kb(0, 4))).error_code == K.INVALID_PRODUCER_EPOCH
        bad = bytearray(kb(1, 2))
        bad[-1] ^= 0xFF
        assert (await produce(part, bytes(bad))).error_code == K.CORRUPT_MESSAGE
        assert (await produce(part, kb(1, 2), acks=1)).base_offset == 6
        # refusals wrote nothing: offsets 0..7 are the four appended batches
        assert part.log.next_offset == 8
        assert [P.decode_batch_header(b).base_offset for b in log_batches(tmp_path, "t", 0)] == [
            0,
            2,
            4,
            6,
        ]
        await close(part)

    asyncio.run(go())


def test_acks_all_waits_for_the_followers_and_fails_over_as_not_leader(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path)
        part.become_leader(1, 1, [1, 2], [1, 2])
        fut = kp(part, kb(0, 0), -1)
        assert isinstance(fut, asyncio.Future)
        await part.wait_flushed(2)
        await asyncio.sleep(0.01)
        assert not fut.done()  # fsynced here, not on the follower
        retry = kp(part, kb(0, 0), -1)
        await asyncio.sleep(0.01)
        assert isinstance(retry, asyncio.Future) and not retry.done()  # nor its retry
        one = await produce(part, kb(0, 2), acks=1)  # acks=1: fsynced here is enough
        assert (one.error_code, one.base_offset) == (K.NONE, 2)
        part.record_replica_fetch(2, 2)
        assert (await fut).base_offset == 0 and (await retry).base_offset == 0
        pending = kp(part, kb(0, 4), -1)
        assert isinstance(pending, asyncio.Future)
        part.become_follower(2, 2, "127.0.0.1:1")
        assert (await pending).error_code == K.NOT_LEADER_OR_FOLLOWER
        await close(part)

    asyncio.run(go())


async def fill(part: Partition) -> None:
    """Kafka batches across an epoch bump, with one of ours and a fence in between."""
    for raw in (kb(0, 0), kb(0, 2, 3)):
        assert (await produce(part, raw)).error_code == K.NONE
    ours = bytearray(
        P.encode_batch([(None, b"sdk")], pid=5, generation=1, base_sequence=0, timestamp_ms=1)
    )
    _, fut = part.append(
        memoryview(ours), P.validate_batch(bytes(ours)), lambda *_: None, epoch=part.leader_epoch
    )
    assert fut is not None
    await fut
    await part.fence(5, 2, False, lambda *_: None)[1]
    for raw in (kb(1, 0), kb(1, 2)):
        assert (await produce(part, raw)).error_code == K.NONE


def test_crash_reopen_and_snapshot_replay_rebuild_the_same_state(tmp_path: Path) -> None:
    async def go() -> None:
        live = open_part(tmp_path / "a", hw=None)
        await fill(live)
        want = answers(live, PROBES)
        assert ("DUPLICATE", 9) in want and ("FENCED", -1) in want
        image = await live.capture()
        await live.flusher.wait_idle()
        # SIGKILL-style: no close; the files are what the OS holds; a torn Kafka batch
        # at the tail (a crash mid-write) is cut at recovery
        tear_tail(tmp_path / "a", "t", 0, kb(1, 4)[:55])  # past our header, short of Kafka's
        reopened = open_part(tmp_path / "a", hw=None)
        assert reopened.log.next_offset == live.log.next_offset
        assert answers(reopened, PROBES) == want
        await close(reopened)
        from_snapshot = open_part(tmp_path / "a", hw=None, snapshot=image)
        assert answers(from_snapshot, PROBES) == want
        await close(from_snapshot)
        live.close()

    asyncio.run(go())


def test_recovery_cuts_a_kafka_batch_whose_crc32c_fails(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path, hw=None)
        await fill(part)
        await close(part)
        seg = max((tmp_path / "t-0").glob("*.log"))
        data = bytearray(seg.read_bytes())
        data[-1] ^= 0x55  # inside the last Kafka batch's records: only CRC-32C sees it
        seg.write_bytes(bytes(data))
        again = open_part(tmp_path, hw=None)
        assert again.log.next_offset == 9  # the last batch (offsets 9, 10) is cut
        await close(again)

    asyncio.run(go())


def test_follower_fed_the_leaders_bytes_answers_alike(tmp_path: Path) -> None:
    async def go() -> None:
        leader = open_part(tmp_path / "l", hw=None)
        await fill(leader)
        follower = open_part(tmp_path / "f")
        follower.become_follower(1, 1, "127.0.0.1:1")
        data = b"".join(leader.replica_read(0, BYTES_MAX))
        follower.append_replicated(memoryview(data), [(1, 0)])
        follower.set_high_watermark(leader.high_watermark)
        assert log_batches(tmp_path / "f", "t", 0) == log_batches(tmp_path / "l", "t", 0)
        assert answers(follower, PROBES) == answers(leader, PROBES)
        assert follower.follower_rule_mismatches == 0  # its own rules agreed, batch by batch
        await close(leader)
        await close(follower)

    asyncio.run(go())


def test_mixed_log_reads_for_our_readers_and_for_kafka_consumers(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path, hw=None)
        await fill(part)
        # what pidlease.Reader, verify and the Spark source do with a FETCH's bytes
        got: list[tuple[Any, ...]] = []
        data = b"".join(part.fetch(0, BYTES_MAX))
        for h, pos in P.iter_batches(data):
            for r in P.iter_records(data, h, pos, "t", 0):
                got.append((r.offset, r.pid, r.sequence_id, r.value, r.is_control))
        assert got == [
            (0, PID, 0, b"e0-s0-0", False),
            (1, PID, 1, b"e0-s0-1", False),
            (2, PID, 2, b"e0-s2-0", False),
            (3, PID, 3, b"e0-s2-1", False),
            (4, PID, 4, b"e0-s2-2", False),
            (5, 5, 0, b"sdk", False),
            (6, 5, -1, b"", True),
            (7, PID, 0, b"e1-s0-0", False),
            (8, PID, 1, b"e1-s0-1", False),
            (9, PID, 2, b"e1-s2-0", False),
            (10, PID, 3, b"e1-s2-1", False),
        ]
        # a Kafka consumer: every data record, ours converted, the fence left out
        fetched = kafka_fetch(part, 0, BYTES_MAX)
        assert (fetched.error_code, fetched.high_watermark) == (K.NONE, 11)
        seen = []
        for h, pos in P.iter_batches(fetched.records):
            one = fetched.records[pos : pos + h.size]
            K.validate_kafka_batch(one)  # each one a Kafka batch a client accepts
            seen.extend((r.offset, r.value) for r in P.iter_records(one, h, 0))
        assert [o for o, _ in seen] == [0, 1, 2, 3, 4, 5, 7, 8, 9, 10]
        # a fetch that starts on the fence reads on past it
        assert P.decode_batch_header(kafka_fetch(part, 6, 10).records).base_offset == 7
        assert kafka_fetch(part, 12, BYTES_MAX).error_code == K.OFFSET_OUT_OF_RANGE
        assert kafka_fetch(part, 11, BYTES_MAX).records == b""
        await close(part)

    asyncio.run(go())


def test_time_index_reads_a_kafka_batchs_max_timestamp(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path, hw=None)
        for seq, ts in ((0, 1_000), (1, 2_000), (2, 3_000)):
            raw = K.encode_kafka_batch(
                [(None, b"x")],
                producer_id=PID,
                producer_epoch=0,
                base_sequence=seq,
                base_timestamp_ms=ts,
            )
            assert (await produce(part, raw)).error_code == K.NONE
        # what retention by time reads: the newest batch's maxTimestamp
        assert part.log.segments[-1].max_timestamp_ms == 3_000
        assert part.offset_for_timestamp(2_500) == 2
        assert part.offset_for_timestamp(1_000) == 0
        assert part.offset_for_timestamp(3_001) == 3
        await close(part)
        again = open_part(tmp_path, hw=None)  # the index rebuilt by a scan agrees
        assert again.offset_for_timestamp(2_500) == 2
        await close(again)

    asyncio.run(go())


def test_recovery_above_the_checkpointed_high_watermark_waits_for_it(tmp_path: Path) -> None:
    """A replicated partition reopened with its checkpoint below the last Kafka batches:
    those are in flight again (the durable highwater goes back below them, in positions),
    and a retry of one is answered with its offsets only once the high watermark passes."""

    async def go() -> None:
        part = open_part(tmp_path, hw=None)
        for raw in (kb(0, 0), kb(1, 0), kb(1, 2)):
            assert (await produce(part, raw)).error_code == K.NONE
        await close(part)
        again = open_part(tmp_path, hw=2)  # offsets 2..5 not known to be committed
        e = again.state.get(PID)
        epoch1 = 1 << 40  # the position of epoch 1's sequence 0
        # just below the first batch in flight: its position - 1
        assert e is not None and (e.highwater, e.durable_highwater) == (epoch1 + 3, epoch1 - 1)
        again.become_leader(1, 1, [1, 2], [1, 2])
        retry = kp(again, kb(1, 0), -1)
        assert isinstance(retry, asyncio.Future)
        await asyncio.sleep(0.01)
        assert not retry.done()
        again.record_replica_fetch(2, 6)
        assert (await asyncio.wait_for(retry, 10)).base_offset == 2
        e = again.state.get(PID)
        assert e is not None and e.durable_highwater == epoch1 + 3
        await close(again)

    asyncio.run(go())


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_fetch_of_a_damaged_batch_is_a_storage_error(tmp_path: Path) -> None:
    async def go() -> None:
        part = open_part(tmp_path, hw=None)
        await fill(part)
        flip_byte(max((tmp_path / "t-0").glob("*.log")), 70)  # in the first batch's records
        got = kafka_fetch(part, 0, BYTES_MAX)
        assert (got.error_code, got.records) == (K.KAFKA_STORAGE_ERROR, b"")
        await close(part)

    asyncio.run(go())
