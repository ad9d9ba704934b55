"""The SDK's ``Consumer`` in a consumer group (issue 25, item 2): a pidlease ``Consumer`` and
a confluent-kafka consumer (``range`` assignor) share one group on a 4-partition topic
and each reads its half; the SDK consumer commits, closes, and a new one resumes at its
commits; ``committed`` and ``seek``."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer as KafkaConsumer

from pidlease.client.consumer import Consumer
from pidlease.client.producer import Producer as SdkProducer
from tests.helpers import wait_for


def test_sdk_consumer_and_a_kafka_consumer_in_one_group(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=2)
    c.create_topic("shared", partitions=4, replication_factor=2)
    kafka_got: list[tuple[int, int, bytes]] = []
    kafka_assigned: list[list[int]] = []
    stop = threading.Event()

    def kafka_member() -> None:
        k = KafkaConsumer(
            {
                "bootstrap.servers": c.kafka_bootstrap,
                "group.id": "mixed",
                "partition.assignment.strategy": "range",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
            }
        )

        def on_assign(_: Any, parts: Any) -> None:
            kafka_assigned.append(sorted(p.partition for p in parts))

        k.subscribe(["shared"], on_assign=on_assign)
        try:
            while not stop.is_set():
                m = k.poll(0.2)
                if m is not None and m.error() is None:
                    kafka_got.append((m.partition(), m.offset(), m.value()))
                    k.commit(m, asynchronous=False)
        finally:
            k.close()

    t = threading.Thread(target=kafka_member, daemon=True)
    t.start()
    wait_for(lambda: kafka_assigned, 60, "the Kafka consumer in the group")
    sdk = Consumer(c.coordinator_url, ["shared"], "mixed", session_timeout_ms=6000)
    sdk_got: list[tuple[int, int, bytes]] = []
    try:
        deadline = time.monotonic() + 60
        while not (len(sdk.assignment) == 2 and len(kafka_assigned[-1]) == 2):
            sdk.poll(0.2)
            assert time.monotonic() < deadline, (sdk.assignment, kafka_assigned)
        mine = {p for _, p in sdk.assignment}
        assert not mine & set(kafka_assigned[-1]), "disjoint shares"
        values = [b"v%04d" % i for i in range(400)]
        with SdkProducer(c.coordinator_url, topic="shared") as p:
            for i, v in enumerate(values):
                p.send(v, partition=i % 4)
            p.flush()
        deadline = time.monotonic() + 60
        while {v for *_, v in sdk_got} | {v for *_, v in kafka_got} != set(values):
            sdk_got += [(r.partition, r.offset, r.value) for r in sdk.poll(0.2)]
            sdk.commit()
            assert time.monotonic() < deadline, f"read {len(sdk_got)} + {len(kafka_got)}"
        assert {p for p, _, _ in sdk_got} == mine
        assert {p for p, _, _ in kafka_got} == set(kafka_assigned[-1])
        assert len(sdk_got) == len(kafka_got) == 200, "each record read once"
        assert sdk.committed(min(mine)) == 100
    finally:
        stop.set()
        t.join(30)
        sdk.close()
    # A new SDK consumer alone: every partition, each from its commit.
    with SdkProducer(c.coordinator_url, topic="shared") as p:
        for i in range(4):
            p.send(b"late%d" % i, partition=i)
        p.flush()
    again = Consumer(c.coordinator_url, ["shared"], "mixed", session_timeout_ms=6000)
    late: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while len(late) < 4 and time.monotonic() < deadline:
            late += [r.value for r in again.poll(0.5)]
        late += [r.value for r in again.poll(1.0)]  # anything older would come now
        assert sorted(late) == [b"late0", b"late1", b"late2", b"late3"], late
        again.seek(0, 0)
        first = again.poll(5.0)[0]
        assert (first.partition, first.offset) == (0, 0)
    finally:
        again.close()
