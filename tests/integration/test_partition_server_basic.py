"""The partition server over real sockets: a real ZooKeeper (session fixture), the server
as a subprocess started by LocalCluster, topics created by writing znodes."""

from __future__ import annotations

import pytest

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire.cluster import ServerInfo, connect_zk, server_path

SHORT = {"PIDLEASE_FSYNC_INTERVAL_MS": "1"}


@pytest.fixture
def one_server(make_cluster, zk_hosts):  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0, env=SHORT)
    return cluster, cluster.servers[0]


def test_registers_in_zookeeper_and_answers_metadata(one_server, zk_hosts) -> None:
    _, svc = one_server
    zk = connect_zk(zk_hosts)
    try:
        raw, stat = zk.get(server_path(1))
        assert stat.ephemeralOwner != 0
        info = ServerInfo.from_bytes(raw)
        assert (info.id, info.port) == (1, svc.port)
    finally:
        zk.stop()
        zk.close()
    create_topic(zk_hosts, "orders", 2)
    with WireClient(svc.address) as c:
        r = c.produce("orders", 1, batch(0, 0, 0, [b"x"]))  # also makes the server refresh
        assert r.error_code == 0
        md = c.metadata()
    assert md["server_id"] == 1 and md["address"] == svc.address
    parts = {(p["topic"], p["partition"]): p for p in md["partitions"]}
    assert set(parts) == {("orders", 0), ("orders", 1)}
    assert parts[("orders", 1)]["log_end_offset"] == 1
    assert parts[("orders", 1)]["high_watermark"] == 1
    assert parts[("orders", 0)]["role"] == "leader"


def test_produce_then_fetch_returns_records_in_order(one_server, zk_hosts) -> None:
    _, svc = one_server
    create_topic(zk_hosts, "t")
    tok = token(DEV_SECRET, 7, 3)
    with WireClient(svc.address) as c:
        for i in range(5):
            c.produce_send(
                "t", 0, batch(7, 3, i * 10, [f"v{i}-{j}".encode() for j in range(10)]), tok
            )
        results = [c.recv() for _ in range(5)]
        assert [r.error_code for r in results] == [0] * 5
        assert [(r.base_offset, r.last_offset) for r in results] == [
            (i * 10, i * 10 + 9) for i in range(5)
        ]
        recs = c.read_all("t", 0)
    assert [r.value for r in recs] == [f"v{i}-{j}".encode() for i in range(5) for j in range(10)]
    assert [r.sequence_id for r in recs] == list(range(50))
    assert all(r.pid == 7 and r.generation == 3 for r in recs)


def test_unknown_topic_and_partition(one_server, zk_hosts) -> None:
    _, svc = one_server
    create_topic(zk_hosts, "known")
    with WireClient(svc.address) as c:
        r = c.produce("nope", 0, batch(0, 0, 0, [b"x"]))
        assert r.error_code == errors.UnknownTopicOrPartition.code
        r = c.fetch("known", 5, 0)
        assert r.error_code == errors.UnknownTopicOrPartition.code
        r = c.producer_state("known", 0, 99)
        assert r.error_code == 0 and not r.found


def test_not_leader_names_the_leader(one_server, zk_hosts) -> None:
    _, svc = one_server
    zk = connect_zk(zk_hosts)
    try:
        zk.create(server_path(2), ServerInfo(2, "127.0.0.1", 9, 0).to_bytes(), ephemeral=True)
        create_topic(zk_hosts, "elsewhere", leader=2, replicas=[2, 1])
        with WireClient(svc.address) as c:
            r = c.produce("elsewhere", 0, batch(0, 0, 0, [b"x"]))
            assert r.error_code == errors.NotLeader.code
            assert r.leader == "127.0.0.1:9"
            r = c.fetch("elsewhere", 0, 0)
            assert r.error_code == errors.NotLeader.code
    finally:
        zk.stop()
        zk.close()


def test_fsync_per_batch_mode_with_segment_rolls(make_cluster, zk_hosts) -> None:
    cluster = make_cluster(
        servers=1,
        coordinators=0,
        env={"PIDLEASE_FSYNC": "batch", "PIDLEASE_SEGMENT_BYTES_MAX": "4096"},
    )
    svc = cluster.servers[0]
    create_topic(zk_hosts, "fb")
    tok = token(DEV_SECRET, 12, 0)
    with WireClient(svc.address) as c:
        for i in range(60):
            c.produce_send("fb", 0, batch(12, 0, i * 2, [b"%04d" % i * 50, b"y"]), tok)
        rs = [c.recv() for _ in range(60)]
        assert [r.error_code for r in rs] == [0] * 60, [
            (i, r.error_code, r.detail) for i, r in enumerate(rs) if r.error_code
        ]
        assert [r.base_offset for r in rs] == list(range(0, 120, 2))
        md = c.metadata()["partitions"][0]
        assert md["high_watermark"] == md["log_end_offset"] == 120
        assert [r.sequence_id for r in c.read_all("fb", 0) if r.value == b"y"] == list(
            range(1, 120, 2)
        )
    segs = list((cluster.data_dir / "server-1" / "data" / "fb-0").glob("*.log"))
    assert len(segs) >= 4  # 60 batches of ~270 bytes in 4 KiB segments
    cluster.kill(svc)
    cluster.start_service(svc)
    with WireClient(svc.address) as c:
        assert len(c.read_all("fb", 0)) == 120
        assert c.produce("fb", 0, batch(12, 0, 120, [b"z"]), tok).base_offset == 120
