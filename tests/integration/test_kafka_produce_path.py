"""The Kafka listener on the server's one produce path (partition_server/produce.py), real
processes, no SASL: a Kafka batch naming a PID leased over HTTP is refused and never takes
that PID over (issue 23 item 7: it adopted generation 2**31 + epoch and fenced the leased
producer for good), and Kafka appends reach the server's counters as ours do."""

from __future__ import annotations

from partition_server.kafka import codec as C
from pidlease.client.producer import Producer
from pidlease.testing.wire import WireClient
from pidlease.wire import kafka_batch as K
from tests.kafka_wire import KafkaWire, produce_values, record_batch

TOPIC = "leased"


def counters(address: str) -> dict[str, int]:
    w = WireClient(address)
    try:
        ops = w.metadata()["ops"]
    finally:
        w.close()
    return {k: int(v) for k, v in ops.items() if k in ("appended_batches", "appended_records")}


def test_a_kafka_batch_never_takes_over_a_leased_pid_and_kafka_appends_are_counted(
    make_cluster,  # type: ignore[no-untyped-def]
) -> None:
    c = make_cluster(servers=1)
    c.create_topic(TOPIC, partitions=1)
    svc = c.servers[0]
    with Producer(c.coordinator_url, topic=TOPIC) as p:
        p.send(b"leased-0").result(30)
        pid = p.pid
        assert pid > 0
        before = counters(svc.address)
        with KafkaWire(svc.kafka_address) as w:
            batch = record_batch([b"kafka-0"], pid=pid, epoch=0, base_sequence=0)
            r = w.request(C.PRODUCE, 9, produce_values(TOPIC, 0, batch))
            part = r.responses[0].partition_responses[0]
            assert int(part.error_code) == K.UNKNOWN_PRODUCER_ID, part
            assert "leased over the pidlease protocol" in (part.error_message or "")
            # The leased producer goes on: it was not fenced.
            p.send(b"leased-1").result(30)
            # A Kafka producer of its own, without a PID: appended and counted.
            plain = record_batch([b"kafka-a", b"kafka-b"])
            r = w.request(C.PRODUCE, 9, produce_values(TOPIC, 0, plain))
            assert int(r.responses[0].partition_responses[0].error_code) == 0
        after = counters(svc.address)
    # leased-1 and the Kafka batch of two records; the refused one is not counted.
    assert after["appended_batches"] - before["appended_batches"] == 2
    assert after["appended_records"] - before["appended_records"] == 3
