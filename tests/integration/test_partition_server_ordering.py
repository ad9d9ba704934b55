"""The pipelining guarantee over a real socket (docs/protocol.md): one connection's requests
are applied and answered in the order they were sent, even while the server is learning
about a topic created a moment ago; and the connection refusal guard.

The race this closes: the first PRODUCE for a fresh topic used to be parked in a task until
ZooKeeper was re-read, while frames behind it on the same connection that arrived after
the assignment did were appended at once, ahead of it.
"""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, TopicSpec, connect_zk, partition_path, topic_path

BATCHES = 150
PID, GEN = 41, 2
# Frames spaced so that they straddle the server's ZooKeeper reads (a few ms each): some
# arrive before the new partition is known, some while, some after.
GAP_S = 0.0005


def _create_now(zk: KazooClient, name: str, dedup: str, partitions: int = 1) -> None:
    """Create a topic the way the coordinator does, with a client already connected, so
    the caller's first frame follows the last znode within a millisecond."""
    zk.create(
        topic_path(name), TopicSpec(name, partitions, 1, dedup, int(time.time() * 1000)).to_bytes()
    )
    for p in range(partitions):
        zk.create(partition_path(name, p), PartitionState([1], 1, 0, [1]).to_bytes(), makepath=True)


def _blast(c: WireClient, topic: str, tok: str) -> list[P.Response]:
    """BATCHES two-record batches of one producer, pipelined, then every answer."""
    for i in range(BATCHES):
        c.produce_send(
            topic, 0, batch(PID, GEN, i * 2, [b"%d" % (i * 2), b"%d" % (i * 2 + 1)]), tok
        )
        time.sleep(GAP_S)
    return [c.recv() for _ in range(BATCHES)]


@pytest.mark.parametrize("dedup", ["strict", "monotonic", "off"])
def test_fresh_topic_pipelined_batches_apply_in_order(make_cluster, zk_hosts, dedup) -> None:
    cluster = make_cluster(servers=1, coordinators=0, env={"PIDLEASE_FSYNC_INTERVAL_MS": "1"})
    svc = cluster.servers[0]
    tok = token(DEV_SECRET, PID, GEN)
    zk = connect_zk(zk_hosts)
    try:
        # Several fresh topics, one after another, to give the race several chances.
        for round_ in range(4):
            topic = f"fresh-{dedup}-{round_}"
            with WireClient(svc.address) as c:
                _create_now(zk, topic, dedup)
                rs = _blast(c, topic, tok)
                refused = [(i, r.error_code, r.detail) for i, r in enumerate(rs) if r.error_code]
                assert not refused, refused
                # Appended in the order sent: offsets rise with the sequence numbers.
                assert [r.base_offset for r in rs] == list(range(0, 2 * BATCHES, 2))
                recs = c.read_all(topic, 0)
            data = [r for r in recs if not r.is_control]
            assert [r.value for r in data] == [b"%d" % s for s in range(2 * BATCHES)]
            if dedup != "off":
                assert [r.sequence_id for r in data] == list(range(2 * BATCHES))
    finally:
        zk.stop()
        zk.close()


def test_refused_batch_holds_back_the_later_ones_until_resent(make_cluster, zk_hosts) -> None:
    """Batch 0 refused UNKNOWN_TOPIC_OR_PARTITION (no such topic yet); the topic appears;
    batch 1, pipelined behind on the same connection, is refused too (never appended on
    this monotonic topic); the in-order resend of 0 then 1 is appended."""
    cluster = make_cluster(servers=1, coordinators=0, env={"PIDLEASE_FSYNC_INTERVAL_MS": "1"})
    svc = cluster.servers[0]
    tok = token(DEV_SECRET, PID, GEN)
    b0 = batch(PID, GEN, 0, [b"a", b"b"])
    b1 = batch(PID, GEN, 2, [b"c"])
    with WireClient(svc.address) as c:
        r = c.produce("later", 0, b0, tok)
        assert r.error_code == errors.UnknownTopicOrPartition.code
        create_topic(zk_hosts, "later", dedup="monotonic")
        _wait_known(svc.address, "later")  # the assignment arrives (by watch or re-read)
        r = c.produce("later", 0, b1, tok)
        assert r.error_code == errors.UnknownTopicOrPartition.code
        assert "resend from sequence 0" in r.detail
        assert (
            errors.error_for_code(r.error_code).retriable
            or r.error_code == errors.UnknownTopicOrPartition.code
        )  # what the SDK retries
        assert c.read_all("later", 0) == []  # batch 1 never reached the log
        # Another producer on the same connection is not held back.
        tok9 = token(DEV_SECRET, 9, 0)
        assert c.produce("later", 0, batch(9, 0, 5, [b"x"]), tok9).error_code == 0
        # The in-order resend: 0 clears the guard, 1 follows.
        r0 = c.produce("later", 0, b0, tok)
        r1 = c.produce("later", 0, b1, tok)
        assert (r0.error_code, r1.error_code) == (0, 0)
        recs = [r for r in c.read_all("later", 0) if r.pid == PID]
        assert [r.sequence_id for r in recs] == [0, 1, 2]
        assert [r.value for r in recs] == [b"a", b"b", b"c"]


def _wait_known(address: str, topic: str) -> None:
    with WireClient(address) as other:  # a fresh connection has no guard
        deadline = time.monotonic() + 30
        while other.fetch(topic, 0, 0).error_code and time.monotonic() < deadline:
            time.sleep(0.02)
        assert other.fetch(topic, 0, 0).error_code == 0


@pytest.mark.parametrize("dedup", ["strict", "monotonic"])
def test_guard_lets_go_once_the_refused_range_is_written_elsewhere(
    make_cluster, zk_hosts, dedup
) -> None:
    """The producer resent the refused batch on another connection (another leader in a
    real cluster): the first connection must not hold its later batches back forever."""
    cluster = make_cluster(servers=1, coordinators=0, env={"PIDLEASE_FSYNC_INTERVAL_MS": "1"})
    svc = cluster.servers[0]
    tok = token(DEV_SECRET, PID, GEN)
    b0 = batch(PID, GEN, 0, [b"a", b"b"])
    with WireClient(svc.address) as c:
        assert c.produce("elsewhere", 0, b0, tok).error_code == errors.UnknownTopicOrPartition.code
        create_topic(zk_hosts, "elsewhere", dedup=dedup)
        _wait_known(svc.address, "elsewhere")
        with WireClient(svc.address) as d:
            assert d.produce("elsewhere", 0, b0, tok).error_code == 0
        r = c.produce("elsewhere", 0, batch(PID, GEN, 2, [b"c"]), tok)
        assert r.error_code == 0, r.detail
        assert [x.sequence_id for x in c.read_all("elsewhere", 0)] == [0, 1, 2]


def test_guard_never_holds_a_topic_without_dedup(make_cluster, zk_hosts) -> None:
    """dedup=off keeps no producer state and promises no order across retries: nothing
    could ever show the held range written, so the guard must not hold its batches."""
    cluster = make_cluster(servers=1, coordinators=0, env={"PIDLEASE_FSYNC_INTERVAL_MS": "1"})
    svc = cluster.servers[0]
    tok = token(DEV_SECRET, PID, GEN)
    with WireClient(svc.address) as c:
        assert (
            c.produce("nodedup", 0, batch(PID, GEN, 0, [b"a"]), tok).error_code
            == errors.UnknownTopicOrPartition.code
        )
        create_topic(zk_hosts, "nodedup", dedup="off")
        _wait_known(svc.address, "nodedup")
        assert c.produce("nodedup", 0, batch(PID, GEN, 1, [b"b"]), tok).error_code == 0


def test_many_requests_for_a_missing_partition_are_answered_in_order(make_cluster) -> None:
    """One connection, 300 pipelined PRODUCEs for a topic that does not exist: each is
    answered UNKNOWN_TOPIC_OR_PARTITION, in order (the server re-reads ZooKeeper for the
    first and notes the partition missing for a moment, rather than one read each)."""
    cluster = make_cluster(servers=1, coordinators=0)
    svc = cluster.servers[0]
    with WireClient(svc.address) as c:
        for i in range(300):
            c.produce_send("ghost", 0, batch(0, 0, 0, [b"%d" % i]))
        rs = [c.recv() for _ in range(300)]
        assert {r.error_code for r in rs} == {errors.UnknownTopicOrPartition.code}
        assert [r.correlation_id for r in rs] == list(range(1, 301))
