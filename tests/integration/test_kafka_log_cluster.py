"""One log, two formats, real processes: Kafka RecordBatch v2 batches stored in a partition's
segment between our SDK's batches (as the Kafka listener will store them) survive a
SIGKILL and recovery, are read by ``pidlease.Reader`` and audited by ``pidlease verify``
together with ours; the producer state recovery rebuilt from them follows Kafka's rules.
The Kafka listener itself (issue 14) is tested with it; this test needs none."""

from __future__ import annotations

from pathlib import Path

from partition_server.testing import log_batches, tear_tail
from pidlease import errors
from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, token
from pidlease.wire import kafka_batch as K
from pidlease.wire import protocol as P

KAFKA_PID = 9_000_001


def kafka_stored(epoch: int, seq: int, values: list[bytes], offset: int) -> bytes:
    raw = bytearray(
        K.encode_kafka_batch(
            [(None, v) for v in values],
            producer_id=KAFKA_PID,
            producer_epoch=epoch,
            base_sequence=seq,
            base_timestamp_ms=1_700_000_000_000,
        )
    )
    P.set_base_offset(raw, offset)
    return bytes(raw)


def test_reader_and_verify_over_a_log_of_both_formats(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("mixed", partitions=1)
    with Producer(c.coordinator_url, topic="mixed") as p:
        for f in [p.send(b"sdk-%d" % i) for i in range(5)]:
            f.result(30)
    svc = c.servers[0]
    c.kill(svc)
    data_dir = Path(c.data_dir) / "server-1" / "data"
    heads = [P.decode_batch_header(b) for b in log_batches(data_dir, "mixed", 0)]
    end = heads[-1].base_offset + heads[-1].count
    kafka = [
        kafka_stored(0, 0, [b"kafka-0", b"kafka-1"], end),
        kafka_stored(0, 2, [b"kafka-2"], end + 2),
        kafka_stored(1, 0, [b"kafka-3"], end + 3),  # after the client's own epoch bump
    ]
    # appended whole, as the listener writes them, and a torn one after them
    tear_tail(data_dir, "mixed", 0, b"".join(kafka) + kafka_stored(1, 1, [b"torn"], end + 4)[:55])
    c.start_service(svc)
    with Producer(c.coordinator_url, topic="mixed") as p:
        for f in [p.send(b"sdk-after-%d" % i) for i in range(3)]:
            f.result(30)
    recs = [r for r in Reader(c.coordinator_url, "mixed", 0) if not r.is_control]
    kafka_values = [b"kafka-0", b"kafka-1", b"kafka-2", b"kafka-3"]
    assert [r.value for r in recs if r.pid == KAFKA_PID] == kafka_values
    assert [r.sequence_id for r in recs if r.pid == KAFKA_PID] == [0, 1, 2, 0]
    assert [r.value for r in recs if r.pid != KAFKA_PID] == [b"sdk-%d" % i for i in range(5)] + [
        b"sdk-after-%d" % i for i in range(3)
    ]
    offsets = [r.offset for r in recs]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    report = verify_topic(c.coordinator_url, "mixed")
    assert report.ok, report.summary()
    # our PRODUCE refuses a Kafka batch (byte 16 is not a flag of ours), and a batch of
    # ours with the Kafka PID is from an older generation: FENCED
    with WireClient(svc.address) as w:
        bad = w.produce("mixed", 0, kafka[0], token(DEV_SECRET, KAFKA_PID, 1))
        assert bad.error_code == errors.CorruptRecord.code
        ours = P.encode_batch(
            [(None, b"zombie")], pid=KAFKA_PID, generation=5, base_sequence=2, timestamp_ms=1
        )
        fenced = w.produce("mixed", 0, ours, token(DEV_SECRET, KAFKA_PID, 5))
        assert fenced.error_code == errors.ProducerFenced.code, fenced.detail
