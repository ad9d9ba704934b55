"""Lease expiry as the coordinator shows it: an unrenewed short lease goes
active -> expiring -> lapsed in /v1/pids, a takeover by name within retention gets the
same PID back, and past retention the PID is UNKNOWN_PID, swept from ZooKeeper, and its
name gets a new PID."""

from __future__ import annotations

from typing import Any

import httpx

from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.wire.cluster import connect_zk, name_path, pid_path
from tests.helpers import lease_pid, wait_for

WAIT_S = 60


def pid_states(cluster: LocalCluster, state: str) -> set[int]:
    status, body = http_json("GET", cluster.coordinator_url + f"/v1/pids?state={state}")
    assert status == 200
    return {p["pid"] for p in body["pids"]}


def test_unrenewed_lease_lapses_and_a_takeover_by_name_keeps_the_pid(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("orders", 1)
    status, short = lease_pid(cluster, producer_name="nightly", expire_ms=400)
    assert status == 200 and short["expire_ms"] == 400
    _, steady = lease_pid(cluster, expire_ms=600_000)
    # 400 ms lease: expiring once at most 200 ms are left, lapsed after.
    wait_for(
        lambda: short["pid"] in pid_states(cluster, "lapsed"),
        WAIT_S,
        "the short lease to lapse",
        interval_s=0.1,
    )
    assert steady["pid"] in pid_states(cluster, "active")
    assert steady["pid"] not in pid_states(cluster, "lapsed")

    status, view = http_json("GET", cluster.coordinator_url + f"/v1/pids/{short['pid']}")
    assert status == 200 and view["state"] == "lapsed" and view["expires_in_ms"] <= 0
    assert view["producer_name"] == "nightly"

    page = httpx.get(cluster.coordinator_url + "/dashboard", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "nightly" in page.text and 'class="lapsed"' in page.text

    status, again = lease_pid(cluster, producer_name="nightly", expire_ms=60_000)
    assert status == 200 and again["kind"] == "takeover"
    assert again["pid"] == short["pid"] and again["generation"] == short["generation"] + 1
    assert short["pid"] in pid_states(cluster, "active")
    # A lease of another topic name that does not exist is refused, not created.
    status, body = lease_pid(cluster, topic="nope")
    assert (status, body["error"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_past_retention_the_pid_is_unknown_swept_and_the_name_rebound(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(
        servers=1,
        env={"PIDLEASE_PID_RETENTION_MS": "1000", "PIDLEASE_PID_SWEEP_INTERVAL_MS": "200"},
    )
    cluster.create_topic("orders", 1)
    _, old = lease_pid(cluster, producer_name="job", expire_ms=200)
    zk = connect_zk(cluster.zk_hosts)
    try:
        # Polled with a read: a renew while still retained would push the expiry out.
        wait_for(
            lambda: http_json("GET", cluster.coordinator_url + f"/v1/pids/{old['pid']}")[0] == 404,
            WAIT_S,
            "UNKNOWN_PID past retention",
            interval_s=0.1,
        )
        status, body = lease_pid(cluster, pid=old["pid"], generation=old["generation"])
        assert (status, body["error"]) == (404, "UNKNOWN_PID")
        wait_for(
            lambda: zk.exists(pid_path(old["pid"])) is None,
            WAIT_S,
            "the sweeper to delete the record",
            interval_s=0.1,
        )
        assert zk.exists(name_path("job")) is None, "the name binding went with it"
        status, body = http_json("GET", cluster.coordinator_url + f"/v1/pids/{old['pid']}")
        assert (status, body["error"]) == (404, "UNKNOWN_PID")
        status, new = lease_pid(cluster, producer_name="job")
        assert status == 200 and new["kind"] == "new" and new["pid"] != old["pid"]
        assert int(zk.get(name_path("job"))[0]) == new["pid"]
    finally:
        zk.stop()
        zk.close()
