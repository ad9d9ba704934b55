"""The operator's PID view tells the truth (issue 29), on a real cluster: after 5000
records over 6 partitions of a 3-server cluster at R=3, the PID list ``GET /v1/pids`` (what
the dashboard and ``pidlease pids`` show) answers each partition's live durable highwater
and last append, as ``GET /v1/pids/{pid}`` does, with the age of the leaders' answers;
a partition whose leader does not answer says "leader unreachable", never -1.

Before the fix the list answered what the lease record remembered when the PID was first
leased: ``orders/0@-1 ... orders/5@-1``."""

from __future__ import annotations

import time
from typing import Any

from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import cli, wait_for

RECORDS = 5000
PARTITIONS = 6


def _list(cluster: LocalCluster, **params: str) -> dict[str, Any]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    status, body = http_json("GET", f"{cluster.coordinator_url}/v1/pids?{query}", timeout_s=30)
    assert status == 200, body
    return dict(body)


def _highwaters(view: dict[str, Any]) -> dict[int, Any]:
    return {p["partition"]: p["highwater"] for p in view["partitions"]}


def test_the_list_answers_live_highwaters_after_5000_records(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=3)
    cluster.create_topic("orders", PARTITIONS, replication_factor=3)
    with Producer(cluster.coordinator_url, topic="orders", producer_name="walk") as p:
        futures = [p.send(b"%d" % i, partition=i % PARTITIONS) for i in range(RECORDS)]
        acked = [f.result(timeout=120) for f in futures]
        pid = p.pid
    last = {part: max(a.sequence_id for a in acked[part::PARTITIONS]) for part in range(6)}
    assert sum(1 for _ in acked) == RECORDS

    status, one = http_json("GET", f"{cluster.coordinator_url}/v1/pids/{pid}", timeout_s=30)
    assert status == 200, one
    assert _highwaters(one) == last  # the single-PID view was right before the fix too

    def listed() -> dict[str, Any] | None:
        body = _list(cluster)
        rows = [v for v in body["pids"] if v["pid"] == pid]
        return body if rows and _highwaters(rows[0]) == last else None

    try:
        body = wait_for(listed, 15, "the list to answer the live highwaters")
    except AssertionError:
        rows = [v for v in _list(cluster)["pids"] if v["pid"] == pid]
        raise AssertionError(
            f"GET /v1/pids answers {_highwaters(rows[0]) if rows else 'no row'} for pid {pid}, "
            f"GET /v1/pids/{pid} answers {last}"
        ) from None
    row = next(v for v in body["pids"] if v["pid"] == pid)
    assert 0 <= body["age_ms"] < 15_000 and body["as_of_ms"] <= body["served_ms"]
    for part in row["partitions"]:
        assert part["status"] == "live", part
        # the leader's last append for the PID: within the test, before the answer
        assert body["served_ms"] - 120_000 < part["last_append_ms"] <= body["as_of_ms"]
    assert row["last_append_ms"] == max(x["last_append_ms"] for x in row["partitions"])

    # `pidlease pids` prints the same numbers
    table = cli("pids", url=cluster.coordinator_url)
    assert table.returncode == 0, table.stderr
    printed = next(ln for ln in table.stdout.splitlines() if ln.split()[:2] == [str(pid), "walk"])
    for part, hw in last.items():
        assert f"orders/{part}@{hw}" in printed, printed
    assert "-1" not in printed.split()[-1], printed


def test_a_dead_leader_shows_as_unreachable_not_minus_one(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("t", 2)
    with Producer(cluster.coordinator_url, topic="t", producer_name="alone") as p:
        for i in range(10):
            p.send(b"x", partition=i % 2).result(timeout=60)
        pid = p.pid

    def live() -> dict[str, Any] | None:
        rows = [v for v in _list(cluster)["pids"] if v["pid"] == pid]
        return rows[0] if rows and _highwaters(rows[0]) == {0: 4, 1: 4} else None

    wait_for(live, 15, "the live highwaters")
    cluster.kill(cluster.servers[0])
    killed = time.monotonic()

    def unreachable() -> dict[str, Any] | None:
        body = _list(cluster)
        row = next(v for v in body["pids"] if v["pid"] == pid)
        statuses = {x["status"] for x in row["partitions"]}
        return row if statuses == {"leader unreachable"} else None

    row = wait_for(unreachable, 30, "the partitions to show 'leader unreachable'")
    assert time.monotonic() - killed < 30
    for part in row["partitions"]:
        assert part["highwater"] is None, part  # unknown, not -1
    table = cli("pids", url=cluster.coordinator_url)
    assert "t/0@unreachable" in table.stdout, table.stdout
