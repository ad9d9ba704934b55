"""``pidlease consume --group`` and ``pidlease groups list|describe|delete`` on a real
cluster (issue 25, item 2): a group consumer reads everything once, a rerun only what is
new; the group, its offsets and lag are shown, also a Kafka consumer's group; delete
removes it."""

from __future__ import annotations

import json

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition

from pidlease.client.producer import Producer as SdkProducer
from tests.helpers import cli


def test_consume_group_and_groups_commands(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("clines", partitions=2)
    url = c.coordinator_url

    def send(values: list[bytes]) -> None:
        with SdkProducer(url, topic="clines") as p:
            for i, v in enumerate(values):
                p.send(v, partition=i % 2)
            p.flush()

    send([b"a%d" % i for i in range(10)])
    r = cli("consume", "clines", "--group", "cg", url=url)
    assert r.returncode == 0, r.stderr
    assert sorted(ln.split("\t")[3] for ln in r.stdout.splitlines()) == sorted(
        f"a{i}" for i in range(10)
    )
    send([b"b%d" % i for i in range(4)])
    r = cli("consume", "clines", "--group", "cg", "--json", url=url)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(ln)["value"] for ln in r.stdout.splitlines()) == [
        "b0",
        "b1",
        "b2",
        "b3",
    ], "the rerun resumes at the commits"
    # A Kafka consumer's group shows up too.
    k = KafkaConsumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": "kg", "enable.auto.commit": False}
    )
    k.commit(offsets=[TopicPartition("clines", 0, 3)], asynchronous=False)
    k.close()
    # assign() without an offset starts at the group's commit (librdkafka asks OffsetFetch).
    k = KafkaConsumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": "kg", "enable.auto.commit": False}
    )
    k.assign([TopicPartition("clines", 0)])
    try:
        m = None
        for _ in range(100):
            m = k.poll(0.5)
            if m is not None and m.error() is None:
                break
        assert m is not None and m.error() is None and m.offset() == 3, m
    finally:
        k.close()
    r = cli("groups", "list", "--json", url=url)
    assert r.returncode == 0, r.stderr
    listed = {g["group"]: g["state"] for g in json.loads(r.stdout)}
    assert listed == {"cg": "Empty", "kg": "Empty"}
    r = cli("groups", "describe", "cg", "--json", url=url)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {(o["partition"], o["committed"], o["lag"]) for o in d["offsets"]} == {
        (0, 7, 0),
        (1, 7, 0),
    }
    r = cli("groups", "describe", "kg", url=url)
    assert r.returncode == 0 and "LAG" in r.stdout, r.stdout + r.stderr
    r = cli("groups", "delete", "cg", url=url)
    assert r.returncode == 0, r.stderr
    r = cli("groups", "list", "--json", url=url)
    assert [g["group"] for g in json.loads(r.stdout)] == ["kg"]
