"""The Kafka APIs' semantics on real servers, through a raw client (tests/kafka_wire.py):
answers in request order per connection, Fetch's long poll, byte limits and
OFFSET_OUT_OF_RANGE, ListOffsets, Metadata's one view from every node, and InitProducerId
on every node with PIDs from the cluster's ZooKeeper counter."""

from __future__ import annotations

import datetime as dt
import struct
import threading
import time
from typing import Any

import pytest

from partition_server.kafka import codec as C
from pidlease.client.producer import Producer as SdkProducer
from pidlease.wire.cluster import connect_zk
from tests.kafka_wire import KafkaWire, fetch_values, produce_values, record_batch

TOPIC = "apis"


@pytest.fixture(scope="module")
def cluster(make_module_cluster):  # type: ignore[no-untyped-def]
    c = make_module_cluster(servers=2)
    c.create_topic(TOPIC, partitions=2, replication_factor=2)
    return c


def leader_address(c: Any, partition: int) -> str:
    with KafkaWire(c.servers[0].kafka_address) as w:
        md = w.request(C.METADATA, 12, {"topics": [{"name": TOPIC}]})
    (t,) = md.topics
    leader = next(p.leader_id for p in t.partitions if p.partition_index == partition)
    b = next(b for b in md.brokers if b.node_id == leader)
    return f"{b.host}:{b.port}"


def produce(w: KafkaWire, partition: int, values: list[bytes], acks: int = -1) -> Any:
    r = w.request(C.PRODUCE, 9, produce_values(TOPIC, partition, record_batch(values), acks))
    p = r.responses[0].partition_responses[0]
    assert int(p.error_code) == 0, p
    return p


def test_metadata_is_one_view_from_every_node(cluster) -> None:  # type: ignore[no-untyped-def]
    # Every node answers from its own read of ZooKeeper: the views agree once both have
    # read the latest state (a node may be a watch event behind, or a leader may have just
    # changed on a loaded machine), so they are compared until they agree, within 20 s.
    deadline = time.monotonic() + 20
    while True:
        views = []
        for svc in cluster.servers:
            with KafkaWire(svc.kafka_address) as w:
                md = w.request(C.METADATA, 12, {"topics": None})
            views.append(md)
            assert {b.node_id: b.port for b in md.brokers} == {
                s.ident: s.kafka_port for s in cluster.servers
            }
            assert md.controller_id == 1
        seen = [[t for t in v.topics if t.name == TOPIC] for v in views]
        agree = all(len(ts) == 1 for ts in seen) and views[0] == views[1]
        if agree or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for v in views:
        (t,) = [t for t in v.topics if t.name == TOPIC]
        assert sorted(p.partition_index for p in t.partitions) == [0, 1]
        assert all(p.leader_id in (1, 2) and p.leader_epoch >= 0 for p in t.partitions)
    assert views[0] == views[1]
    with KafkaWire(cluster.servers[1].kafka_address) as w:
        md = w.request(C.METADATA, 1, {"topics": [{"name": "no-such-topic"}]})
        assert int(md.topics[0].error_code) == 3


def test_answers_in_request_order(cluster) -> None:  # type: ignore[no-untyped-def]
    """A long-polling Fetch holds back the answers pipelined behind it; an acks=0 Produce
    gets none."""
    addr = leader_address(cluster, 0)
    with KafkaWire(addr) as w:
        hw = produce(w, 0, [b"o1"]).base_offset + 1
        frames = [
            w.frame(C.FETCH, 11, fetch_values(TOPIC, 0, hw, max_wait_ms=1500)),
            w.frame(C.API_VERSIONS, 3, {}),
            w.frame(C.PRODUCE, 9, produce_values(TOPIC, 1, record_batch([b"z"]), acks=0)),
            w.frame(C.METADATA, 12, {"topics": None}),
        ]
        corrs = [struct.unpack_from(">i", f, 8)[0] for f in frames]
        t0 = time.monotonic()
        w.send_raw(b"".join(frames))
        got = [struct.unpack_from(">i", w.read_frame())[0] for _ in range(3)]
        assert got == [corrs[0], corrs[1], corrs[3]]
        assert time.monotonic() - t0 >= 1.0, "the fetch waited and the others waited behind it"


def test_fetch_long_poll_limits_and_out_of_range(cluster) -> None:  # type: ignore[no-untyped-def]
    addr = leader_address(cluster, 1)
    with KafkaWire(addr) as w, KafkaWire(addr) as w2:
        first = produce(w, 1, [b"a" * 50, b"b" * 50]).base_offset
        second = produce(w, 1, [b"c" * 50]).base_offset
        # At least one whole batch even over the limit, and not more than the limit after it.
        vals = fetch_values(TOPIC, 1, first)
        vals["topics"][0]["partitions"][0]["partition_max_bytes"] = 1
        r = w.request(C.FETCH, 11, vals)
        p = r.responses[0].partitions[0]
        (n,) = struct.unpack_from(">i", p.records, 8)
        assert len(p.records) == 12 + n, "exactly one whole batch"
        assert p.high_watermark == second + 1
        # Offset past the high watermark: OFFSET_OUT_OF_RANGE.
        r = w.request(C.FETCH, 11, fetch_values(TOPIC, 1, second + 5))
        assert int(r.responses[0].partitions[0].error_code) == 1
        # A long poll at the end returns when a record comes, well before max_wait.
        hw = second + 1
        box: dict[str, Any] = {}

        def poll() -> None:
            t0 = time.monotonic()
            box["r"] = w2.request(C.FETCH, 11, fetch_values(TOPIC, 1, hw, max_wait_ms=20_000))
            box["s"] = time.monotonic() - t0

        th = threading.Thread(target=poll)
        th.start()
        time.sleep(1.0)
        produce(w, 1, [b"late"])
        th.join(30)
        assert box["s"] < 15, f"the fetch answered after {box['s']:.1f} s"
        assert box["r"].responses[0].partitions[0].records, "it carries the new record"
        # A partition in error is answered at once, whatever the wait asked.
        vals = fetch_values(TOPIC, 1, hw + 1, max_wait_ms=8_000)  # at the end: nothing to read
        vals["topics"][0]["partitions"].append(
            {"partition": 9, "fetch_offset": 0, "partition_max_bytes": 100}
        )
        t0 = time.monotonic()
        r = w2.request(C.FETCH, 11, vals)
        assert time.monotonic() - t0 < 5
        assert int(r.responses[0].partitions[1].error_code) == 3
        # Nothing comes: it answers empty after max_wait, not before.
        t0 = time.monotonic()
        r = w2.request(C.FETCH, 11, fetch_values(TOPIC, 1, hw + 1, max_wait_ms=700))
        assert time.monotonic() - t0 >= 0.6 and not r.responses[0].partitions[0].records


def test_list_offsets(cluster) -> None:  # type: ignore[no-untyped-def]
    addr = leader_address(cluster, 0)
    with KafkaWire(addr) as w:
        before_ms = int(time.time() * 1000)
        time.sleep(0.05)
        base = produce(w, 0, [b"t1", b"t2"]).base_offset

        def ask(ts: int) -> int:
            r = w.request(
                C.LIST_OFFSETS,
                5,
                {
                    "replica_id": -1,
                    "topics": [
                        {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": ts}]}
                    ],
                },
            )
            p = r.topics[0].partitions[0]
            assert int(p.error_code) == 0
            return int(p.offset)

        assert ask(-2) == 0
        assert ask(-1) == base + 2
        assert ask(before_ms) == base
        # Nothing that late: -1, as Kafka answers (issue 25; it used to be the high watermark).
        assert ask(int(time.time() * 1000) + 60_000) == -1


def test_init_producer_id_on_every_node_from_the_zookeeper_counter(cluster) -> None:  # type: ignore[no-untyped-def]
    pids = []
    for svc in cluster.servers:
        with KafkaWire(svc.kafka_address) as w:
            r = w.request(C.INIT_PRODUCER_ID, 0, {"transaction_timeout": dt.timedelta(seconds=60)})
            assert int(r.error_code) == 0 and r.producer_epoch == 0
            pids.append(r.producer_id)
    with SdkProducer(cluster.coordinator_url, topic=TOPIC) as p:
        pids.append(p.pid)
    assert len(set(pids)) == len(pids), f"a PID handed out twice: {pids}"
    zk = connect_zk(cluster.zk_hosts, ensure_roots=False)
    try:
        counter = int(zk.get("/pid_block")[0])
        assert all(pid < counter for pid in pids), "every PID from a reserved block"
        for pid in pids[:2]:
            assert zk.exists(f"/kafka_pids/{pid}") is not None
    finally:
        zk.stop()
        zk.close()
    with KafkaWire(cluster.servers[0].kafka_address) as w:
        r = w.request(
            C.INIT_PRODUCER_ID,
            4,
            {"transactional_id": "txn", "transaction_timeout": dt.timedelta(seconds=60)},
        )
        assert int(r.error_code) == 42 and r.producer_id == -1  # transactions: not here
