"""The project's own ZooKeeper management against Debian's real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidlease.testing import zkserver
from pidlease.testing.zkserver import ZooKeeperCluster
from pidlease.wire.cluster import ALL_ROOTS, connect_zk


def test_standalone_with_chroot_is_created_on_connect(zookeeper: ZooKeeperCluster) -> None:
    zk = connect_zk(zookeeper.hosts + "/fresh-chroot/deeper")
    try:
        assert set(zk.get_children("/")) >= {r.strip("/") for r in ALL_ROOTS}
    finally:
        zk.stop()
        zk.close()
    assert zookeeper.nodes[0].mode() == "standalone"


def test_ensemble_survives_the_leader_being_killed(tmp_path: Path) -> None:
    with ZooKeeperCluster(tmp_path, 3) as ens:
        zk = connect_zk(ens.hosts + "/ens")
        try:
            zk.create("/before", b"1")
            leader = next(n for n in ens.nodes if n.mode() == "leader")
            ens.kill_node(leader)
            ens.wait_ready(30)
            # The client reconnects to a surviving node; the write goes through the new leader.
            zk.retry(zk.create, "/after", b"2")
            assert zk.get("/before")[0] == b"1" and zk.get("/after")[0] == b"2"
        finally:
            zk.stop()
            zk.close()
        assert (leader.data_dir / "myid").read_text().strip() == str(leader.myid)


def test_missing_install_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zkserver, "ZK_JAR", Path("/nonexistent/zookeeper.jar"))
    with pytest.raises(
        zkserver.ZooKeeperMissing, match="apt-get install -y --no-install-recommends zookeeper"
    ):
        ZooKeeperCluster("/tmp/unused", 1)
