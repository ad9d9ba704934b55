"""`pidlease pids`, the dashboard's table in a terminal, against a real cluster: the
``--expiring-within`` and ``--state`` filters pick exactly the leases they should, JSON
and table agree, and the table has the dashboard's columns and counts."""

from __future__ import annotations

import json
import time
from typing import Any

from pidlease.testing.devcluster import LocalCluster
from tests.helpers import cli, leased

WAIT_S = 60


def test_pids_filters_table_and_json(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("t", 1)
    gone = leased(cluster, topic="t", producer_name="gone", expire_ms=300)
    hour = leased(cluster, topic="t", producer_name="hourly", expire_ms=3_600_000)
    minute = leased(cluster, topic="t", producer_name="minutely", expire_ms=120_000)
    url = cluster.coordinator_url
    deadline = time.monotonic() + WAIT_S
    while json.loads(cli("pids", "--json", "--state", "lapsed", url=url).stdout) == []:
        assert time.monotonic() < deadline, "the 300 ms lease never lapsed"
        time.sleep(0.2)

    every = json.loads(cli("pids", "--json", url=url).stdout)
    assert [p["pid"] for p in every] == [gone["pid"], minute["pid"], hour["pid"]]  # soonest first
    within = json.loads(cli("pids", "--json", "--expiring-within", "5m", url=url).stdout)
    assert [p["pid"] for p in within] == [minute["pid"]]
    within = json.loads(cli("pids", "--json", "--expiring-within", "2h", url=url).stdout)
    assert [p["pid"] for p in within] == [minute["pid"], hour["pid"]]
    lapsed = json.loads(cli("pids", "--json", "--state", "lapsed", url=url).stdout)
    assert [(p["pid"], p["producer_name"]) for p in lapsed] == [(gone["pid"], "gone")]

    table = cli("pids", url=url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "PID",
        "NAME",
        "GENERATION",
        "STATE",
        "EXPIRES_IN",
        "LAST_USE",
        "LAST_APPEND",
        "APPEND_LAG",
        "PARTITIONS(topic/p@highwater)",
    ]
    assert [ln.split()[1] for ln in lines[1:4]] == ["gone", "minutely", "hourly"]
    assert lines[1].split()[3] == "lapsed" and lines[3].split()[3] == "active"
    assert lines[-1] == "3 PIDs: 2 active, 0 expiring, 1 lapsed"
    assert cli("pids", "--state", "dead", url=url).returncode == 2
