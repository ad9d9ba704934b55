"""The Kafka admin APIs from real admin clients against real partition servers (issue 25,
item 3): confluent-kafka's AdminClient and aiokafka's AIOKafkaAdminClient create topics
with configs (the settings of PATCH /v1/topics, unknown ones refused naming them),
describe and alter configs, add partitions (producers' state on the old ones untouched)
and delete topics (every replica's files and producer state removed; a topic created again
under the name starts clean, also on a server that was down during the delete)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from pidlease.client.reader import Reader
from pidlease.testing.devcluster import LocalCluster
from tests.integration.test_kafka_clients import kafka_consume, kafka_produce, verify


def topic_http(c: LocalCluster, name: str) -> dict[str, Any]:
    r = httpx.get(f"{c.coordinator_url}/v1/topics/{name}", timeout=10)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def partition_dirs(c: LocalCluster, topic: str) -> list[Path]:
    return sorted(
        d
        for s in c.servers
        for d in (c.data_dir / f"server-{s.ident}" / "data").glob(f"{topic}-*")
        if d.is_dir()
    )


def wait_for(what: str, check: Any, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_confluent_admin_configs_partitions_and_delete(make_cluster: Any) -> None:
    c = make_cluster(servers=3)
    admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
    configs = {
        "retention.ms": "3600000",
        "segment.bytes": "1048576",
        "min.insync.replicas": "2",
        "pidlease.dedup": "monotonic",
        "cleanup.policy": "delete",
    }
    assert admin.create_topics([NewTopic("cfg", 2, 3, config=configs)])["cfg"].result(30) is None
    t = topic_http(c, "cfg")
    assert (t["retention_ms"], t["segment_bytes"], t["min_insync_replicas"], t["dedup"]) == (
        3600000,
        1048576,
        2,
        "monotonic",
    )
    # unknown configs: refused, named, nothing created
    bad = admin.create_topics([NewTopic("bad", 1, 1, config={"compression.type": "gzip"})])
    with pytest.raises(KafkaException) as info:
        bad["bad"].result(30)
    assert info.value.args[0].code() == 40  # INVALID_CONFIG
    assert "compression.type" in info.value.args[0].str()
    assert httpx.get(f"{c.coordinator_url}/v1/topics/bad", timeout=10).status_code == 404

    res = ConfigResource("topic", "cfg")
    got = admin.describe_configs([res])[res].result(30)
    assert got["retention.ms"].value == "3600000"
    assert got["pidlease.dedup"].value == "monotonic" and got["pidlease.dedup"].is_read_only
    assert got["retention.bytes"].value == "-1" and got["retention.bytes"].is_default

    inc = ConfigResource(
        "topic",
        "cfg",
        incremental_configs=[
            ConfigEntry("retention.bytes", "10485760", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    assert admin.incremental_alter_configs([inc])[inc].result(30) is None
    t = topic_http(c, "cfg")
    assert (t["retention_bytes"], t["segment_bytes"], t["retention_ms"]) == (10485760, 0, 3600000)
    for entry, code in [
        (ConfigEntry("pidlease.dedup", "off", incremental_operation=AlterConfigOpType.SET), 40),
        (ConfigEntry("retention.ms", "0", incremental_operation=AlterConfigOpType.SET), 40),
        (ConfigEntry("min.insync.replicas", "4", incremental_operation=AlterConfigOpType.SET), 40),
        (ConfigEntry("max.message.bytes", "1", incremental_operation=AlterConfigOpType.SET), 40),
    ]:
        r = ConfigResource("topic", "cfg", incremental_configs=[entry])
        with pytest.raises(KafkaException) as info:
            admin.incremental_alter_configs([r])[r].result(30)
        assert info.value.args[0].code() == code, entry
    assert topic_http(c, "cfg")["retention_bytes"] == 10485760  # refusals changed nothing

    # CreatePartitions while an idempotent producer writes: its state on the old
    # partitions is untouched, the new partitions take records, verify passes.
    values = [b"v%05d" % i for i in range(600)]
    acked = kafka_produce(c.kafka_bootstrap, "cfg", values[:300])
    grown = admin.create_partitions([NewPartitions("cfg", 4)])
    assert grown["cfg"].result(30) is None
    shrink = admin.create_partitions([NewPartitions("cfg", 3)])
    with pytest.raises(KafkaException) as info:
        shrink["cfg"].result(30)
    assert info.value.args[0].code() == 37  # INVALID_PARTITIONS
    assert topic_http(c, "cfg")["partitions"] == 4
    acked += kafka_produce(c.kafka_bootstrap, "cfg", values[300:])
    assert {p for p, _ in acked} == {0, 1, 2, 3}, "the new partitions took records"
    read = kafka_consume(c.kafka_bootstrap, "cfg", 4, len(values))
    assert sorted(v for recs in read.values() for _, v in recs) == values
    verify(c, "cfg")

    # DeleteTopics: gone from every server's disk; a topic created again starts clean
    assert len(partition_dirs(c, "cfg")) == 12  # 4 partitions x 3 replicas
    assert admin.delete_topics(["cfg"])["cfg"].result(30) is None
    wait_for("every replica's files removed", lambda: partition_dirs(c, "cfg") == [])
    with pytest.raises(KafkaException):
        admin.delete_topics(["cfg"])["cfg"].result(30)  # UNKNOWN_TOPIC_OR_PARTITION
    assert admin.create_topics([NewTopic("cfg", 1, 3)])["cfg"].result(30) is None
    again = kafka_produce(c.kafka_bootstrap, "cfg", [b"new-0", b"new-1"])
    assert again == [(0, 0), (0, 1)], "offsets start at 0"
    assert [r.value for r in Reader(c.coordinator_url, "cfg", partition=0)] == [b"new-0", b"new-1"]
    assert topic_http(c, "cfg")["retention_ms"] != 3600000  # defaults, not the old configs
    verify(c, "cfg")


def test_a_server_down_during_the_delete_drops_the_old_topic_at_restart(make_cluster: Any) -> None:
    c = make_cluster(servers=2)
    admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
    assert admin.create_topics([NewTopic("old", 1, 2)])["old"].result(30) is None
    kafka_produce(c.kafka_bootstrap, "old", [b"old-%d" % i for i in range(50)])
    down = c.servers[1]
    c.kill(down)
    assert admin.delete_topics(["old"])["old"].result(30) is None
    wait_for("the live replica's files removed", lambda: len(partition_dirs(c, "old")) == 1)
    # created again on the live server only while the other is down (R = 1)
    assert admin.create_topics([NewTopic("old", 1, 1)])["old"].result(30) is None
    c.restart(down)
    wait_for(
        "the restarted server dropped its old directory",
        lambda: (
            [d.parent.parent.name for d in partition_dirs(c, "old")]
            == [f"server-{c.servers[0].ident}"]
        ),
    )
    acked = kafka_produce(c.kafka_bootstrap, "old", [b"again"])
    assert acked == [(0, 0)]
    verify(c, "old")


def test_aiokafka_admin(make_cluster: Any) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    c = make_cluster(servers=1)

    async def main() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=c.kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic("aio", 1, 1, topic_configs={"retention.ms": "60000"})]
            )
            assert topic_http(c, "aio")["retention_ms"] == 60000
            res = ConfigResource(ConfigResourceType.TOPIC, "aio")
            got = await admin.describe_configs([res])
            entries = {e[0]: e[1] for r in got for t in r.resources for e in t[4]}
            assert entries["retention.ms"] == "60000"
            alter = ConfigResource(
                ConfigResourceType.TOPIC, "aio", configs={"retention.bytes": "4096000"}
            )
            answer = await admin.alter_configs([alter])
            assert all(r[0] == 0 for a in answer for r in a.resources), answer
            t = topic_http(c, "aio")
            # AlterConfigs replaces the set: what was not named is back at its default
            assert t["retention_bytes"] == 4096000 and t["retention_ms"] != 60000
            await admin.create_partitions({"aio": NewPartitions(total_count=3)})
            assert topic_http(c, "aio")["partitions"] == 3
            await admin.delete_topics(["aio"])
        finally:
            await admin.close()

    asyncio.run(main())
    wait_for("deleted", lambda: partition_dirs(c, "aio") == [])
    assert httpx.get(f"{c.coordinator_url}/v1/topics/aio", timeout=10).status_code == 404
