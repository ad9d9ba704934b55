"""A confluent-kafka group member as its own process, for the group tests (it must be
SIGKILLable): ``python -m tests.integration.kafka_group_consumer BOOTSTRAP GROUP TOPIC OUT
[confluent|aiokafka]`` (an aiokafka member writes the same events).

It subscribes, and after every poll commits what it read synchronously. Every event goes
to OUT as one line, flushed at once, with the time: ``A t p,p,...`` (assigned), ``R t p o
value`` (read), ``B t p o`` (about to commit next offset ``o`` of ``p``), ``C t p o``
(committed), ``F t error`` (a commit refused). It runs until SIGTERM or SIGKILL.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition


def main(bootstrap: str, group: str, topic: str, out_path: str) -> None:
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    def say(*parts: object) -> None:
        out.write(" ".join(str(p) for p in (parts[0], f"{time.time():.6f}", *parts[1:])) + "\n")

    def on_assign(c: Any, parts: list[TopicPartition]) -> None:
        say("A", ",".join(str(p.partition) for p in parts) or "-")

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 2000,
        }
    )
    c.subscribe([topic], on_assign=on_assign)
    try:
        while not stop:
            msgs = c.consume(500, 0.5)
            nxt: dict[int, int] = {}
            for m in msgs:
                if m.error() is not None:
                    continue
                say("R", m.partition(), m.offset(), m.value().decode())
                nxt[m.partition()] = m.offset() + 1
            if not nxt:
                continue
            offsets = [TopicPartition(topic, p, o) for p, o in sorted(nxt.items())]
            for tp in offsets:
                say("B", tp.partition, tp.offset)
            try:
                done = c.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                say("F", str(exc).replace("\n", " "))
                continue
            for tp in done or []:
                if tp.error is None:
                    say("C", tp.partition, tp.offset)
                else:
                    say("F", tp.error)
    finally:
        c.close()
        out.close()


def aio_main(bootstrap: str, group: str, topic: str, out_path: str) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka import TopicPartition as AioTopicPartition
    from aiokafka.errors import KafkaError

    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def say(*parts: object) -> None:
        out.write(" ".join(str(p) for p in (parts[0], f"{time.time():.6f}", *parts[1:])) + "\n")

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        async def on_partitions_revoked(self, revoked: Any) -> None:
            return None

        async def on_partitions_assigned(self, assigned: Any) -> None:
            say("A", ",".join(str(tp.partition) for tp in sorted(assigned)) or "-")

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        c = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            metadata_max_age_ms=2000,
        )
        c.subscribe([topic], listener=Listener())
        await c.start()
        try:
            while not stop.is_set():
                batch = await c.getmany(timeout_ms=500, max_records=500)
                nxt: dict[int, int] = {}
                for tp, msgs in batch.items():
                    for m in msgs:
                        say("R", tp.partition, m.offset, m.value.decode())
                        nxt[tp.partition] = m.offset + 1
                if not nxt:
                    continue
                for p, o in sorted(nxt.items()):
                    say("B", p, o)
                try:
                    await c.commit({AioTopicPartition(topic, p): o for p, o in nxt.items()})
                except KafkaError as exc:
                    say("F", str(exc).replace("\n", " "))
                    continue
                for p, o in sorted(nxt.items()):
                    say("C", p, o)
        finally:
            await c.stop()
            out.close()

    asyncio.run(run())


if __name__ == "__main__":
    if sys.argv[5:6] == ["aiokafka"]:
        aio_main(*sys.argv[1:5])
    else:
        main(*sys.argv[1:5])
