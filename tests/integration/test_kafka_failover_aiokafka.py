"""aiokafka's idempotent producer through a leader SIGKILL (docs/kafka.md, "Clients x
features", the failover column): a 3-partition R=3 topic, records sent while the leader of
partition 0 is SIGKILLed (and restarted); every record the producer reported sent is in
the log exactly once, where its report said, in send order per partition, and `pidlease
verify` finds no gap or duplicate in any PID's sequences."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiokafka import AIOKafkaProducer

from tests.helpers import wait_for
from tests.integration.test_kafka_clients import check_exactly_once, kafka_consume, verify
from tests.integration.test_kafka_failover import ENV, TOPIC, leader_of, live_leader

N = 3_000


def test_aiokafka_idempotent_producer_through_a_leader_kill(make_cluster: Any) -> None:
    c = make_cluster(servers=3, env=ENV)
    c.create_topic(TOPIC, partitions=3, replication_factor=3)
    live_leader(c, 0)
    values = [b"aio-%05d" % i for i in range(N)]
    acked: dict[int, tuple[int, int]] = {}
    errors: list[BaseException] = []
    sent = [0]

    async def produce() -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=c.kafka_bootstrap,
            enable_idempotence=True,
            request_timeout_ms=60_000,
            linger_ms=5,
        )
        await p.start()
        try:
            futs = []
            for i, v in enumerate(values):
                futs.append((i, await p.send(TOPIC, v, partition=i % 3)))
                sent[0] = i + 1
                if i % 50 == 49:
                    await asyncio.sleep(0.05)  # about 1,000 records a second
            for i, f in futs:
                try:
                    m = await f
                    acked[i] = (m.partition, m.offset)
                except Exception as exc:  # noqa: BLE001 - reported, checked below
                    errors.append(exc)
        finally:
            await p.stop()

    t = threading.Thread(target=lambda: asyncio.run(produce()), daemon=True)
    t.start()
    wait_for(lambda: sent[0] >= N // 3, 60, "a third of the records sent")
    leader = leader_of(c, 0)
    c.kill(c.server(leader))
    at_kill = sent[0]
    live_leader(c, 0, not_=leader)
    c.start_service(c.server(leader))
    t.join(300)
    assert not t.is_alive(), "the producer is stuck"
    assert not errors, errors[:3]
    assert at_kill < N, "the leader died while records were being sent"
    assert len(acked) == N
    read = kafka_consume(c.kafka_bootstrap, TOPIC, 3, N)
    check_exactly_once(values, [acked[i] for i in range(N)], read)
    verify(c, TOPIC)
