"""Transactions are not supported (docs/kafka.md, "Clients x features"): what a Kafka
client's transactional producer sees, as the matrix says. FindCoordinator for a
transactional id answers COORDINATOR_NOT_AVAILABLE ("transactions are not supported"),
which the clients retry: confluent-kafka's ``init_transactions`` times out with a
retriable ``_TIMED_OUT``, aiokafka's ``start()`` never finishes; nothing is written."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import KafkaError, KafkaException, Producer

from pidlease.testing.devcluster import LocalCluster, http_json


@pytest.fixture(scope="module")
def cluster(make_module_cluster: Any) -> LocalCluster:
    c: LocalCluster = make_module_cluster(servers=1)
    c.create_topic("txn", partitions=1, replication_factor=1)
    return c


def high_watermark(c: LocalCluster) -> int:
    status, body = http_json("GET", f"{c.coordinator_url}/v1/topics/txn")
    assert status == 200, body
    return int(body["partition_states"][0].get("high_watermark", -1))


def test_confluent_kafka_init_transactions_times_out(cluster: LocalCluster) -> None:
    p = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": "tx-c"})
    t0 = time.monotonic()
    with pytest.raises(KafkaException) as got:
        p.init_transactions(3)
    err = got.value.args[0]
    assert err.code() == KafkaError._TIMED_OUT, err
    assert err.retriable() and not err.fatal()
    assert time.monotonic() - t0 < 30
    assert high_watermark(cluster) == 0, "nothing written"


def test_aiokafka_transactional_start_never_finishes(cluster: LocalCluster) -> None:
    async def go() -> None:
        p = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, transactional_id="tx-a")
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(p.start(), 5)
        finally:
            await p.stop()

    asyncio.run(go())
    assert high_watermark(cluster) == 0, "nothing written"
