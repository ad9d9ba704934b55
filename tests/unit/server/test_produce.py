"""The one produce path (partition_server/produce.py, docs/replication.md "The produce
path"): a batch is appended only where this replica leads at the epoch the request was
routed for, whichever protocol sent it, and every ack waiting at a role change or above a
cut is failed, retriable. Issue 23 item 1: a Kafka produce with SASL routed while leading,
awaited the PID-owner lookup while the partition stepped down, and was then appended to a
follower's log with an ack nothing failed. A real partition and broker, the real Kafka
record APIs; the owner lookup is a function run in an executor, as in the server."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.serial import entity_reader

from partition_server.kafka import codec as C
from partition_server.kafka.records import RecordApis
from partition_server.kafka_partition import KafkaProduceResult, kafka_produce
from partition_server.log_manager import LogManager
from partition_server.metrics import ServerMetrics
from partition_server.partition import Partition, Role
from partition_server.produce import ProducePath
from partition_server.producer_state import Outcome
from partition_server.settings import ServerSettings
from partition_server.testing import b, open_part, stored
from pidlease import errors
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState
from tests.helpers import ManualClock

PID = 77


def kb(seq: int, n: int = 2) -> bytes:
    return K.encode_kafka_batch(
        [(b"k", b"s%d-%d" % (seq, i)) for i in range(n)],
        producer_id=PID,
        producer_epoch=0,
        base_sequence=seq,
        base_timestamp_ms=1000,
    )


def produce_request(records: bytes, acks: int = -1) -> Any:
    """A decoded Produce request as the listener hands it to the APIs (the fields read)."""
    return SimpleNamespace(
        acks=acks,
        timeout=timedelta(seconds=1),
        topic_data=[
            SimpleNamespace(name="t", partition_data=[SimpleNamespace(index=0, records=records)])
        ],
    )


def leader(tmp_path: Path, clock: ManualClock) -> tuple[Partition, LogManager]:
    part = open_part(tmp_path / "p", clock_ms=clock)
    part.hosted = True
    part.become_leader(1, 1, [1, 2], [1, 2])
    log_manager = LogManager(ServerSettings(data_dir=str(tmp_path / "s")), None, clock_ms=clock)  # type: ignore[arg-type]
    log_manager.partitions[("t", 0)] = part
    # ZooKeeper's view after the step-down: server 2 leads (its address unknown here).
    log_manager.assignment.partitions[("t", 0)] = PartitionState([1, 2], 2, 2, [1, 2])
    return part, log_manager


def produce_code(reply: bytes) -> tuple[int, int]:
    """(error code, base offset) of the one partition of a Produce v8 answer."""
    resp, _ = entity_reader(C.response_type(C.PRODUCE, 8))(reply, 8)  # after size, corr
    p = resp.responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


def test_a_kafka_produce_whose_partition_steps_down_during_the_owner_lookup_is_not_appended(
    tmp_path: Path,
) -> None:
    """Bug 1 of issue 23: with SASL the PID-owner lookup is awaited in an executor; the
    partition stepped down meanwhile (a ZooKeeper blip). The batch must not reach the
    follower's log, and the producer hears a retriable NOT_LEADER_OR_FOLLOWER."""
    clock = ManualClock(1_000)

    async def go() -> None:
        part, log_manager = leader(tmp_path, clock)
        asked, release = threading.Event(), threading.Event()

        def owner(pid: int) -> str | None:
            asked.set()
            assert release.wait(5)
            return "alice"

        apis = RecordApis(log_manager.s, log_manager, _no_refresh, owner, stopping=lambda: False)
        h = C.Header(C.PRODUCE, 8, 9, "test", 0)
        task = asyncio.ensure_future(apis.produce(h, produce_request(kb(0)), "alice"))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, asked.wait, 5)
        part.become_follower(2, 2, "127.0.0.1:1")  # the lease ended; server 2 leads
        release.set()
        reply = await asyncio.wait_for(task, 5)
        if isinstance(reply, asyncio.Future):
            reply = await asyncio.wait_for(reply, 5)
        assert isinstance(reply, bytes)
        assert part.log.next_offset == 0, (
            f"the batch was appended to a follower's log (log end {part.log.next_offset})"
        )
        assert not part._waiters, "an ack waits on a follower"
        assert produce_code(reply)[0] == K.NOT_LEADER_OR_FOLLOWER
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


async def _no_refresh() -> None:
    return None


def test_partition_append_refuses_unless_it_leads_at_the_routed_epoch(tmp_path: Path) -> None:
    clock = ManualClock(1_000)

    async def go() -> None:
        part, _ = leader(tmp_path, clock)
        raw = bytearray(b(7, 0))
        h = P.validate_batch(bytes(raw))
        with pytest.raises(errors.NotLeader):
            part.append(memoryview(raw), h, lambda *_: None, epoch=0)  # routed at an old epoch
        part.become_follower(2, 2, "127.0.0.1:1")
        with pytest.raises(errors.NotLeader):
            part.append(memoryview(raw), h, lambda *_: None, epoch=1)
        with pytest.raises(errors.NotLeader):
            part.append(memoryview(raw), h, lambda *_: None, epoch=2)  # follows epoch 2
        assert part.log.next_offset == 0 and 7 not in part.state
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


def test_every_ack_waiter_above_a_cut_is_failed_retriable(tmp_path: Path) -> None:
    """A cut takes out batches whose acks may wait (a leader that stepped down keeps its
    log; the cut comes when it follows): each waiter above the cut is answered NOT_LEADER,
    never left to be resolved by a later high watermark over other batches."""
    clock = ManualClock(1_000)

    async def go() -> None:
        part, _ = leader(tmp_path, clock)
        raw = bytearray(b(7, 0))
        _, first = part.append(
            memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=1
        )
        raw = bytearray(b(7, 1))
        _, second = part.append(
            memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=1
        )
        assert first is not None and second is not None
        # An ack left waiting when the role changed: the one mechanism fails it too.
        waits = part.wait_durable(2)
        part.become_follower(2, 2, "127.0.0.1:1")
        await asyncio.sleep(0)
        for f in (first, second, waits):
            assert f.done() and isinstance(f.exception(), errors.NotLeader)
        # A durable wait taken as follower (a fetch waiting to report) above a cut.
        flushed = part.wait_flushed(2)
        later = part.wait_durable(2)
        part.truncate_to(1)
        await asyncio.sleep(0)
        assert later.done() and isinstance(later.exception(), errors.PidleaseError)
        assert later.exception().retriable  # type: ignore[union-attr]
        assert flushed.done() and isinstance(flushed.exception(), errors.PidleaseError)
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


def test_the_follower_append_is_a_partition_method_with_its_origin(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    part = open_part(tmp_path / "f", clock_ms=clock)
    part.become_follower(2, 1, "127.0.0.1:1")
    assert part.append_replicated(stored([b(7, 0, 3)]), [(1, 0)]) == 1
    e = part.state.get(7)
    assert e is not None and e.highwater == 2
    part.close()


def kafka_path(part: Partition, notes: list[int]) -> ProducePath:
    return ProducePath(lambda t, p: (part, None), notes.append)


def test_a_kafka_batch_never_takes_over_a_pid_leased_over_http(tmp_path: Path) -> None:
    """Issue 23 item 7: without SASL, a Kafka batch at sequence 0 naming a PID that our
    protocol leased (generation 3 here) adopted generation 2**31 + epoch and fenced that
    producer for good. It is refused UNKNOWN_PRODUCER_ID (a Kafka client then asks
    InitProducerId for a PID of its own), and the leased producer goes on."""
    clock = ManualClock(1_000)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock)
        raw = bytearray(b(PID, 0, gen=3))
        _, fut = part.append(
            memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=-1
        )
        assert fut is not None
        r = kafka_produce(kafka_path(part, []), "t", 0, kb(0), acks=1, batch_bytes_max=1 << 20)
        assert isinstance(r, KafkaProduceResult), r
        assert r.error_code == K.UNKNOWN_PRODUCER_ID, r
        assert "leased over the pidlease protocol" in (r.error_message or "")
        e = part.state.get(PID)
        assert e is not None and e.generation == 3
        raw = bytearray(b(PID, 1, gen=3))
        d, fut = part.append(
            memoryview(raw), P.validate_batch(bytes(raw)), lambda *_: None, epoch=-1
        )
        assert d.outcome is Outcome.APPEND and fut is not None
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


def test_kafka_too_many_pids_is_a_code_kafka_producers_retry(tmp_path: Path) -> None:
    clock = ManualClock(1_000)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, pids_max=1)
        notes: list[int] = []
        path = kafka_path(part, notes)
        first = kafka_produce(path, "t", 0, kb(0), acks=1, batch_bytes_max=1 << 20)
        assert isinstance(first, asyncio.Future)
        assert (await first).error_code == K.NONE
        other = K.encode_kafka_batch(
            [(b"k", b"v")], producer_id=PID + 1, producer_epoch=0, base_sequence=0
        )
        r = kafka_produce(path, "t", 0, other, acks=1, batch_bytes_max=1 << 20)
        assert isinstance(r, KafkaProduceResult)
        assert r.error_code == K.NOT_ENOUGH_REPLICAS, r  # retriable; nothing written
        assert "TOO_MANY_PIDS" in (r.error_message or "")
        assert part.log.next_offset == 2
        assert notes == [1], "a Kafka append counts toward the next snapshot"
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


def test_kafka_appends_reach_the_server_metrics(tmp_path: Path) -> None:
    clock = ManualClock(1_000)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock)
        path = kafka_path(part, [])
        m = ServerMetrics(1, clock_ms=clock)
        path.metrics = m
        fut = kafka_produce(path, "t", 0, kb(0), acks=-1, batch_bytes_max=1 << 20)
        assert isinstance(fut, asyncio.Future) and (await fut).error_code == K.NONE
        dup = kafka_produce(path, "t", 0, kb(0), acks=-1, batch_bytes_max=1 << 20)
        assert isinstance(dup, asyncio.Future) and (await dup).base_offset == 0
        assert (m.appended_batches, m.appended_records, m.duplicates) == (1, 2, 1)
        assert m.append_latency.count == 1
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


def test_the_role_is_a_checked_enum(tmp_path: Path) -> None:
    part = open_part(tmp_path, clock_ms=ManualClock(1_000))
    with pytest.raises(TypeError, match="Role"):
        part.role = "leader"  # type: ignore[assignment]
    part.role = Role.FOLLOWER
    assert part.role is Role.FOLLOWER and part.metadata()["role"] == "follower"
    part.close()
