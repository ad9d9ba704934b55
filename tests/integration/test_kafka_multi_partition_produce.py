"""Our answer to a Produce spanning partitions whose leaders differ or moved (issue 25: the
kafkajs finding; docs/kafka.md "kafkajs"). Kafka answers per partition: NONE with the
offset for a partition the broker leads, NOT_LEADER_OR_FOLLOWER (6) with offset -1 and
nothing written for one it does not; a retry of a batch already written is answered NONE
with its first offset, also by the new leader after a failover. Raw requests on real
servers, one idempotent PID, a leader SIGKILLed in between."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from partition_server.kafka import codec as C
from tests.kafka_wire import KafkaWire, record_batch

TOPIC = "mp"


def produce(w: KafkaWire, parts: dict[int, bytes]) -> dict[int, tuple[int, int]]:
    """One Produce v9 for several partitions: partition -> (error code, base offset)."""
    r = w.request(
        C.PRODUCE,
        9,
        {
            "acks": -1,
            "timeout": dt.timedelta(seconds=30),
            "topic_data": [
                {
                    "name": TOPIC,
                    "partition_data": [{"index": p, "records": b} for p, b in parts.items()],
                }
            ],
        },
    )
    return {
        int(p.index): (int(p.error_code), int(p.base_offset))
        for p in r.responses[0].partition_responses
    }


def leaders(w: KafkaWire) -> dict[int, int]:
    r = w.request(C.METADATA, 12, {"topics": [{"name": TOPIC}]})
    return {int(p.partition_index): int(p.leader_id) for p in r.topics[0].partitions}


def test_a_produce_spanning_moved_partitions_is_answered_per_partition(make_cluster: Any) -> None:
    c = make_cluster(servers=2)
    c.create_topic(TOPIC, partitions=2, replication_factor=2)
    s1, s2 = c.servers
    with KafkaWire(s1.kafka_address) as w1:
        got = w1.request(
            C.INIT_PRODUCER_ID,
            4,
            {"transactional_id": None, "transaction_timeout": dt.timedelta(seconds=60)},
        )
        pid, epoch = int(got.producer_id), int(got.producer_epoch)
        lead = leaders(w1)
    assert lead == {0: s1.ident, 1: s2.ident}, lead

    def batch(p: int, seq: int) -> bytes:
        return record_batch([b"p%d-s%d" % (p, seq)], pid=pid, epoch=epoch, base_sequence=seq)

    both = {0: batch(0, 0), 1: batch(1, 0)}
    with KafkaWire(s1.kafka_address) as w1:
        # server 1 leads partition 0 only: 0 is written, 1 is NOT_LEADER and not written
        assert produce(w1, both) == {0: (0, 0), 1: (6, -1)}
        # the same request again (a client that lost the answer): 0 is a duplicate,
        # answered with its first offset; 1 still not led here
        assert produce(w1, both) == {0: (0, 0), 1: (6, -1)}
    with KafkaWire(s2.kafka_address) as w2:
        # partition 1's sequence 0 was never taken anywhere: new at its leader
        assert produce(w2, {1: batch(1, 0)}) == {1: (0, 0)}
    c.kill(s1)  # partition 0's leader dies
    with KafkaWire(s2.kafka_address) as w2:
        deadline = time.monotonic() + 60
        while leaders(w2).get(0) != s2.ident:
            assert time.monotonic() < deadline, "partition 0 got no new leader"
            time.sleep(0.2)
        # both partitions on one broker now: a retry of what was written before the
        # failover is a duplicate with its first offsets, the next sequences are new
        assert produce(w2, both) == {0: (0, 0), 1: (0, 0)}
        assert produce(w2, {0: batch(0, 1), 1: batch(1, 1)}) == {0: (0, 1), 1: (0, 1)}
        # a client that skips a sequence (what a lost, never-resent batch would leave)
        # is refused, never written with a gap
        assert produce(w2, {0: batch(0, 3)})[0][0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
