"""ZooKeeper faults under a running coordinator, on a ZooKeeper of the test's own:
ZooKeeper stopped -> every request answers 503 COORDINATOR_UNAVAILABLE within the request
timeout (never hangs, never 500); ZooKeeper back -> leasing resumes without restarting the
coordinator. A coordinator whose session expired (frozen with SIGSTOP past its session
timeout) re-registers its ephemeral znode and keeps leasing."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.zkserver import ZooKeeperCluster
from pidlease.wire.cluster import COORDINATORS, connect_zk
from tests.helpers import wait_for

ZK_REQUEST_TIMEOUT_MS = 2_000
SESSION_TIMEOUT_MS = 4_000
WAIT_S = 90
LEASE = {"topic": "orders", "partition": 0, "pid": -1}
# A coordinator or ZooKeeper still down refuses the connection: not yet, not a failure.
poll = partial(wait_for, timeout_s=WAIT_S, interval_s=0.2, ignore=(OSError,))


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[ZooKeeperCluster]:
    zk = ZooKeeperCluster(tmp_path / "zookeeper", 1).start()
    yield zk
    zk.stop()


@pytest.fixture
def cluster(own_zk: ZooKeeperCluster, tmp_path: Path) -> Iterator[LocalCluster]:
    hosts = own_zk.hosts + "/outage"
    c = LocalCluster(
        tmp_path / "cluster",
        servers=1,
        zk_hosts=hosts,
        env={
            "PIDLEASE_ZK_REQUEST_TIMEOUT_MS": str(ZK_REQUEST_TIMEOUT_MS),
            "PIDLEASE_ZK_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        },
    )
    c.start()
    try:
        c.create_topic("orders", 1)
        yield c
    finally:
        c.stop()


def lease(c: LocalCluster, body: dict[str, Any] = LEASE) -> tuple[int, dict[str, Any]]:
    # The client's own timeout bounds the wait: a coordinator that hung would fail here.
    return http_json(
        "POST",
        c.coordinator_url + "/v1/lease_pid",
        body,
        timeout_s=ZK_REQUEST_TIMEOUT_MS / 1000 + 5,
    )


def lease_ok(c: LocalCluster, body: dict[str, Any] = LEASE) -> tuple[int, dict[str, Any]] | None:
    got = lease(c, body)
    return got if got[0] == 200 else None


def registration_owner(c: LocalCluster) -> int | None:
    zk = connect_zk(c.zk_hosts, ensure_roots=False)
    try:
        stat = zk.exists(f"{COORDINATORS}/coordinator-1")
        return None if stat is None else stat.ephemeralOwner
    finally:
        zk.stop()
        zk.close()


def test_zookeeper_down_is_503_and_leasing_resumes_when_it_is_back(
    own_zk: ZooKeeperCluster, cluster: LocalCluster
) -> None:
    coordinator_pid = cluster.coordinators[0].proc.pid  # type: ignore[union-attr]
    status, first = lease(cluster)
    assert status == 200
    before = {first["pid"]}
    status, named = lease(cluster, {**LEASE, "producer_name": "steady"})
    assert status == 200

    own_zk.stop()
    for _ in range(5):
        status, body = lease(cluster)
        assert (status, body["error"]) == (503, "COORDINATOR_UNAVAILABLE"), body
        assert body["detail"]
    for method, path, body in [
        (
            "POST",
            "/v1/lease_pid",
            {**LEASE, "pid": first["pid"], "generation": first["generation"]},
        ),
        ("POST", "/v1/lease_pid", {**LEASE, "producer_name": "steady"}),
        ("POST", "/v1/topics", {"name": "later", "partitions": 1}),
        ("GET", "/v1/pids", None),
        ("GET", f"/v1/pids/{first['pid']}", None),
        ("GET", "/v1/topics", None),
        ("GET", "/healthz", None),
    ]:
        status, got = http_json(
            method, cluster.coordinator_url + path, body, timeout_s=ZK_REQUEST_TIMEOUT_MS / 1000 + 5
        )
        assert (status, got["error"]) == (503, "COORDINATOR_UNAVAILABLE"), (path, got)
    status, batch = http_json(
        "POST",
        cluster.coordinator_url + "/v1/lease_pid/batch",
        {"requests": [LEASE, LEASE]},
        timeout_s=ZK_REQUEST_TIMEOUT_MS / 1000 + 5,
    )
    assert (
        status == 200
        and [r["error"] for r in batch["responses"]] == ["COORDINATOR_UNAVAILABLE"] * 2
    )

    own_zk.restart()
    resumed = poll(lambda: lease_ok(cluster), what="leasing to resume")
    assert resumed[1]["pid"] not in before
    assert cluster.coordinators[0].proc.pid == coordinator_pid, "not restarted"  # type: ignore[union-attr]
    poll(lambda: http_json("GET", cluster.coordinator_url + "/healthz")[0] == 200, what="healthz")
    status, again = lease(cluster, {**LEASE, "producer_name": "steady"})
    assert status == 200 and again["kind"] == "takeover" and again["pid"] == named["pid"]
    poll(lambda: registration_owner(cluster) is not None, what="the registration")


def test_expired_session_re_registers_and_keeps_leasing(cluster: LocalCluster) -> None:
    owner_before = poll(lambda: registration_owner(cluster), what="the first registration")
    status, first = lease(cluster)
    assert status == 200
    proc = cluster.coordinators[0].proc
    assert proc is not None
    # Freeze the coordinator past its session timeout: ZooKeeper expires the session and
    # deletes its ephemeral; after SIGCONT kazoo opens a new session.
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        poll(lambda: registration_owner(cluster) is None, what="ZooKeeper to expire the session")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    owner_after = poll(lambda: registration_owner(cluster), what="re-registration")
    assert owner_after != owner_before
    status, second = poll(lambda: lease_ok(cluster), what="leasing after the new session")
    assert second["pid"] != first["pid"]
    status, renewed = lease(
        cluster, {**LEASE, "pid": first["pid"], "generation": first["generation"]}
    )
    assert status == 200 and renewed["kind"] == "renew" and renewed["sequence_number"] == 0
    assert "registration 2" in cluster.coordinators[0].log_path.read_text()
