"""The SDK's Producer takes up partitions added while it runs (issue 25, item 3:
CreatePartitions, "the SDK picks the new partitions up"): a running producer on a
2-partition topic, the topic grown to 4 with confluent-kafka's AdminClient; at its next
lease renewal, without a call, the producer leases partitions 2 and 3 with the same PID,
routes round-robin records to all four and takes an explicit partition 3; the existing
partitions' sequences go on (``pidlease verify``: no gap, no duplicate), every record is
read back once."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import AdminClient, NewPartitions

from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.errors import PidleaseError
from tests.helpers import wait_for
from tests.integration.test_kafka_clients import verify


def test_a_running_producer_takes_up_added_partitions(make_cluster: Any) -> None:
    c = make_cluster(servers=2)
    c.create_topic("grow", partitions=2, replication_factor=2)
    sent: list[bytes] = []
    with Producer(c.coordinator_url, topic="grow", expire_ms=2_000) as p:
        pid = p.pid
        futs = []
        for i in range(20):
            sent.append(b"before-%d" % i)
            futs.append(p.send(sent[-1]))
        assert {f.result(30).partition for f in futs} == {0, 1}
        try:
            p.send(b"nowhere", partition=2)
            raise AssertionError("partition 2 does not exist yet")
        except PidleaseError:
            pass
        admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
        fs = admin.create_partitions([NewPartitions("grow", 4)])
        assert fs["grow"].result(30) is None
        # Taken up by itself, at a lease renewal (every second with a 2 s lease).
        wait_for(lambda: p.partitions == 4, 20, "the producer on 4 partitions")
        assert p.pid == pid, "the same PID: the new partitions are leased, not a new producer"
        futs = []
        for i in range(40):
            sent.append(b"after-%d" % i)
            futs.append(p.send(sent[-1]))
        sent.append(b"explicit-3")
        futs.append(p.send(sent[-1], partition=3))
        got = [f.result(30) for f in futs]
        assert {m.partition for m in got} == {0, 1, 2, 3}
        assert got[-1].partition == 3
    read = [r.value for part in range(4) for r in Reader(c.coordinator_url, "grow", part)]
    assert sorted(read) == sorted(sent), "every record once"
    verify(c, "grow")
