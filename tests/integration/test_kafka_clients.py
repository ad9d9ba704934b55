"""Unmodified Kafka clients against real partition servers (issue 14): confluent-kafka
(librdkafka) and aiokafka idempotent producers and assign()-style consumers, Debian's kcat,
and the pidlease SDK on the same topic; every topic then passes ``pidlease verify``."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pidlease.client.producer import Producer as SdkProducer
from pidlease.client.reader import Reader
from tests.helpers import cli

KCAT = "/usr/bin/kcat"


def kafka_produce(
    bootstrap: str, topic: str, values: list[bytes], **conf: Any
) -> list[tuple[int, int]]:
    """(partition, offset) of every value, in send order; fails on any delivery error."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            **conf,
        }
    )
    got: dict[int, tuple[int, int]] = {}
    errs: list[KafkaError] = []

    def done(err: KafkaError | None, msg: Any, i: int) -> None:
        if err is not None:
            errs.append(err)
        else:
            got[i] = (msg.partition(), msg.offset())

    for i, v in enumerate(values):
        while True:
            try:
                p.produce(
                    topic, v, key=b"k%d" % (i % 17), on_delivery=lambda e, m, i=i: done(e, m, i)
                )
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    assert p.flush(120) == 0, "undelivered records after 120 s"
    assert not errs, errs[:3]
    return [got[i] for i in range(len(values))]


def kafka_consume(
    bootstrap: str, topic: str, partitions: int, expected: int
) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of the topic from offset 0 with assign(): partition -> [(offset, value)]."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tests",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    n = 0
    deadline = time.monotonic() + 120
    try:
        while n < expected and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            assert m.error() is None, m.error()
            out[m.partition()].append((m.offset(), m.value()))
            n += 1
    finally:
        c.close()
    assert n == expected, f"consumed {n} of {expected}"
    return out


def verify(c: Any, topic: str) -> str:
    r = cli("verify", topic, url=c.coordinator_url)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def check_exactly_once(
    values: list[bytes], acked: list[tuple[int, int]], read: dict[int, list[tuple[int, bytes]]]
) -> None:
    flat = [v for recs in read.values() for _, v in recs]
    assert sorted(flat) == sorted(values), "every acked record exactly once"
    for recs in read.values():
        offsets = [o for o, _ in recs]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    at = {(p, o): v for p, recs in read.items() for o, v in recs}
    for v, (p, o) in zip(values, acked, strict=True):
        assert at[(p, o)] == v, "a record is where its delivery report said"
    # Per partition, one producer's records are in send order.
    order = {v: i for i, v in enumerate(values)}
    for recs in read.values():
        idx = [order[v] for _, v in recs]
        assert idx == sorted(idx)


def test_confluent_idempotent_producer_and_assign_consumer(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=3)
    admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
    fut = admin.create_topics([NewTopic("orders", 3, 3)])["orders"]
    assert fut.result(30) is None
    values = [b"order-%06d" % i for i in range(6000)]
    acked = kafka_produce(c.kafka_bootstrap, "orders", values)
    read = kafka_consume(c.kafka_bootstrap, "orders", 3, len(values))
    check_exactly_once(values, acked, read)
    out = verify(c, "orders")
    assert "6000" in out
    # The pidlease Reader reads the Kafka-written records too.
    sdk = [r.value for p in range(3) for r in Reader(c.coordinator_url, "orders", partition=p)]
    assert sorted(sdk) == sorted(values)


def test_aiokafka_idempotent_round_trip(make_cluster) -> None:  # type: ignore[no-untyped-def]
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioTopicPartition

    c = make_cluster(servers=2)
    c.create_topic("events", partitions=2, replication_factor=2)
    values = [b"event-%05d" % i for i in range(3000)]

    async def main() -> tuple[list[tuple[int, int]], dict[int, list[tuple[int, bytes]]]]:
        p = AIOKafkaProducer(bootstrap_servers=c.kafka_bootstrap, enable_idempotence=True)
        await p.start()
        try:
            futs = [
                await p.send(t := "events", v, key=b"k%d" % (i % 5)) for i, v in enumerate(values)
            ]
            metas = [await f for f in futs]
        finally:
            await p.stop()
        acked = [(m.partition, m.offset) for m in metas]
        cons = AIOKafkaConsumer(
            bootstrap_servers=c.kafka_bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await cons.start()
        out: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
        try:
            cons.assign([AioTopicPartition(t, 0), AioTopicPartition(t, 1)])
            n = 0
            deadline = time.monotonic() + 120
            while n < len(values) and time.monotonic() < deadline:
                got = await cons.getmany(timeout_ms=1000)
                for tp, msgs in got.items():
                    for m in msgs:
                        out[tp.partition].append((m.offset, m.value))
                        n += 1
        finally:
            await cons.stop()
        return acked, out

    acked, read = asyncio.run(main())
    check_exactly_once(values, acked, read)
    verify(c, "events")


def test_kcat_produce_and_consume(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("lines", partitions=1)
    lines = [f"line {i}" for i in range(500)]
    p = subprocess.run(
        [
            KCAT,
            "-P",
            "-b",
            c.kafka_bootstrap,
            "-t",
            "lines",
            "-p",
            "0",
            "-X",
            "enable.idempotence=true",
            "-X",
            "acks=all",
        ],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    r = subprocess.run(
        [
            KCAT,
            "-C",
            "-b",
            c.kafka_bootstrap,
            "-t",
            "lines",
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%o %s\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    got = [ln.split(" ", 1) for ln in r.stdout.splitlines() if ln]
    assert [int(o) for o, _ in got] == list(range(500))
    assert [v for _, v in got] == lines
    verify(c, "lines")


def test_sdk_and_kafka_producers_on_one_topic(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=2)
    c.create_topic("mixed", partitions=2, replication_factor=2)
    sdk_values = [b"sdk-%05d" % i for i in range(2000)]
    kafka_values = [b"kafka-%05d" % i for i in range(2000)]
    with SdkProducer(c.coordinator_url, topic="mixed") as p:
        futs = [p.send(v) for v in sdk_values[:1000]]
        p.flush()
        kafka_produce(c.kafka_bootstrap, "mixed", kafka_values)
        futs += [p.send(v) for v in sdk_values[1000:]]
        p.flush()
        for f in futs:
            f.result(30)
    everything = sorted(sdk_values + kafka_values)
    read = kafka_consume(c.kafka_bootstrap, "mixed", 2, len(everything))
    assert sorted(v for recs in read.values() for _, v in recs) == everything
    sdk_read = {
        q: [(r.offset, r.value) for r in Reader(c.coordinator_url, "mixed", partition=q)]
        for q in range(2)
    }
    assert sdk_read == read, "the Kafka consumer and the Reader see the same log"
    verify(c, "mixed")


@pytest.mark.parametrize("acks", ["0", "1"])
def test_acks_0_and_1(make_cluster, acks: str) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("acks", partitions=1)
    values = [b"v%d" % i for i in range(300)]
    p = Producer({"bootstrap.servers": c.kafka_bootstrap, "acks": acks, "linger.ms": 5})
    for v in values:
        p.produce("acks", v, partition=0)
    assert p.flush(60) == 0
    read = kafka_consume(c.kafka_bootstrap, "acks", 1, len(values))
    assert [v for _, v in read[0]] == values
