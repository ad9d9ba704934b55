"""Compressed batches from real Kafka clients against real partition servers (issue 25,
item 4): each codec from confluent-kafka (librdkafka), aiokafka and kcat is produced, read
back by a Kafka consumer and by ``pidlease.Reader``, passes ``pidlease verify``, and the
batches on disk carry the codec the client sent (stored as sent: not silently
uncompressed by anyone)."""

from __future__ import annotations

import asyncio
import struct
import subprocess
from collections import Counter
from typing import Any

import pytest

from partition_server.kafka import codec as C
from partition_server.testing import log_batches
from pidlease.client.reader import Reader
from pidlease.testing.devcluster import LocalCluster
from pidlease.wire import kafka_codecs as KC
from tests.integration.test_kafka_clients import KCAT, kafka_consume, kafka_produce, verify

CODECS = ["gzip", "snappy", "lz4", "zstd"]
FIND_COORDINATOR = 10


def librdkafka_sends(codec: str, *, old: bool) -> str:
    """What librdkafka puts on the wire for ``compression.type=codec`` against our
    ApiVersions (rdkafka_msgset_writer.c; docs/kafka.md "Compression"): lz4 only when the
    broker advertises FindCoordinator (its feature flag for lz4); up to 2.11 (``old``: kcat's
    2.0) gzip, snappy and lz4 only when it advertises Produce v0, which Kafka 4 and we do
    not. Anything else it sends uncompressed, without a word. Tied to C.SUPPORTED, so it
    changes when the group APIs are advertised."""
    produce_v0 = C.SUPPORTED[C.PRODUCE][0] == 0
    if codec == "zstd":
        return codec
    if old and not produce_v0:
        return "none"
    if codec == "lz4" and FIND_COORDINATOR not in C.SUPPORTED:
        return "none"
    return codec


CODE = {v: k for k, v in KC.CODEC_NAMES.items()}
N = 400


@pytest.fixture(scope="module")
def cluster(make_module_cluster: Any) -> LocalCluster:
    c: LocalCluster = make_module_cluster(servers=1)
    return c


def disk_codecs(c: LocalCluster, topic: str) -> Counter[str]:
    """The codec of every batch of partition 0 in the server's segment files."""
    data = c.data_dir / f"server-{c.servers[0].ident}" / "data"
    return Counter(
        KC.CODEC_NAMES[struct.unpack_from(">h", b, 21)[0] & 7]
        for b in log_batches(data, topic, 0)
        if b[16] == 2
    )


def values_for(tag: str) -> list[bytes]:
    # compressible, as real payloads are
    return [
        b'{"client": "%s", "n": %06d, "pad": "%s"}' % (tag.encode(), i, b"ab" * 40)
        for i in range(N)
    ]


def check(c: LocalCluster, topic: str, values: list[bytes], codec: str) -> Counter[str]:
    read = kafka_consume(c.kafka_bootstrap, topic, 1, len(values))
    assert [v for _, v in read[0]] == values
    assert [r.value for r in Reader(c.coordinator_url, topic, partition=0)] == values
    assert str(len(values)) in verify(c, topic)
    seen = disk_codecs(c, topic)
    assert sum(seen.values()) >= 1
    return seen


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_each_codec(cluster: LocalCluster, codec: str) -> None:
    topic = f"cf-{codec}"
    cluster.create_topic(topic, partitions=1)
    values = values_for(topic)
    kafka_produce(cluster.kafka_bootstrap, topic, values, **{"compression.type": codec})
    seen = check(cluster, topic, values, codec)
    print(f"confluent-kafka {codec}: batches on disk {dict(seen)}")
    assert set(seen) == {librdkafka_sends(codec, old=False)}, dict(seen)


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_each_codec(cluster: LocalCluster, codec: str) -> None:
    from aiokafka import AIOKafkaProducer

    topic = f"aio-{codec}"
    cluster.create_topic(topic, partitions=1)
    values = values_for(topic)

    async def main() -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            enable_idempotence=True,
            compression_type=codec,
            linger_ms=5,
        )
        await p.start()
        try:
            futs = [await p.send(topic, v, partition=0) for v in values]
            offsets = [(await f).offset for f in futs]
        finally:
            await p.stop()
        assert offsets == list(range(N))

    asyncio.run(main())
    seen = check(cluster, topic, values, codec)
    assert set(seen) == {codec}, dict(seen)
    read = aiokafka_read(cluster, topic)
    assert read == values


def aiokafka_read(c: LocalCluster, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def main() -> list[bytes]:
        cons = AIOKafkaConsumer(
            bootstrap_servers=c.kafka_bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await cons.start()
        out: list[bytes] = []
        try:
            cons.assign([TopicPartition(topic, 0)])
            for _ in range(60):
                got = await cons.getmany(timeout_ms=500)
                out.extend(m.value for msgs in got.values() for m in msgs)
                if len(out) >= N:
                    break
        finally:
            await cons.stop()
        return out

    return asyncio.run(main())


# kcat: one codec it falls back from (gzip; snappy and lz4 take the same path in its
# librdkafka) and the one it sends (zstd), to keep CI time down
@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_kcat_codecs(cluster: LocalCluster, codec: str) -> None:
    topic = f"kcat-{codec}"
    cluster.create_topic(topic, partitions=1)
    values = values_for(topic)
    p = subprocess.run(
        [
            KCAT,
            "-P",
            "-b",
            cluster.kafka_bootstrap,
            "-t",
            topic,
            "-p",
            "0",
            "-z",
            codec,
            "-X",
            "enable.idempotence=true",
            "-X",
            "acks=all",
        ],
        input=b"\n".join(values) + b"\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    seen = check(cluster, topic, values, codec)
    print(f"kcat {codec}: batches on disk {dict(seen)}")
    assert set(seen) == {librdkafka_sends(codec, old=True)}, dict(seen)
