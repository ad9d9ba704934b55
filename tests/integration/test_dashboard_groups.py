"""Consumer groups on the coordinator's dashboard and in its ``/metrics`` (issue 25): a
confluent-kafka group's committed offsets on a 2-partition topic on 2 real servers show
in ``/dashboard/data`` and as ``pidlease_group_lag{group,topic,partition}`` with the lag
of each partition (high watermark minus the commit), and in a real headless Chromium
the groups table shows them and follows a new commit without a reload."""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import wait_for

pytest.importorskip("playwright.sync_api", reason="pip install playwright")
from tests.integration.test_dashboard_browser import CHROMIUM, page  # noqa: F401 - fixture

GROUP = "billing"


def commit(c: LocalCluster, offsets: dict[int, int]) -> None:
    k = Consumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": GROUP, "enable.auto.commit": False}
    )
    try:
        done = k.commit(
            offsets=[TopicPartition("ledger", p, o) for p, o in offsets.items()],
            asynchronous=False,
        )
        assert done is not None and all(t.error is None for t in done), done
    finally:
        k.close()


def lags(c: LocalCluster) -> dict[int, Any]:
    status, body = http_json("GET", f"{c.coordinator_url}/dashboard/data")
    assert status == 200, body
    return {r["partition"]: r["lag"] for r in body["groups"] if r["group"] == GROUP}


def metric_lags(c: LocalCluster) -> dict[int, int]:
    with urllib.request.urlopen(f"{c.coordinator_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    pat = r'^pidlease_group_lag\{group="billing",topic="ledger",partition="(\d+)"\} (\d+)$'
    return {int(p): int(v) for p, v in re.findall(pat, text, re.MULTILINE)}


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")
def test_group_lag_on_the_dashboard_and_in_metrics(
    make_cluster: Any,
    page: Any,  # noqa: F811 - the browser fixture
    tmp_path: Path,
) -> None:
    c: LocalCluster = make_cluster(servers=2)
    c.create_topic("ledger", partitions=2, replication_factor=2)
    with Producer(c.coordinator_url, topic="ledger") as p:
        for i in range(100):
            p.send(b"r%d" % i, partition=i % 2)
        p.flush()
    commit(c, {0: 30, 1: 50})
    want = {0: 20, 1: 0}
    wait_for(lambda: lags(c) == want, 30, f"the dashboard's lags {want}")
    assert metric_lags(c) == want
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(f"{c.coordinator_url}/dashboard")
    row = page.locator(f'#groups tbody tr[data-group="{GROUP}"][data-partition="0"]')
    row.locator('td[data-col="8"]').filter(has_text="20").wait_for()
    assert row.locator('td[data-col="6"]').text_content() == "30"
    assert row.locator('td[data-col="7"]').text_content() == "50"
    assert row.locator('td[data-col="1"]').text_content() == "Empty"
    page.evaluate("() => { window.__marker = 'no reload since here'; }")
    commit(c, {0: 45})
    row.locator('td[data-col="8"]').filter(has_text="5").wait_for()
    assert page.evaluate("() => window.__marker") == "no reload since here"
    assert metric_lags(c) == {0: 5, 1: 0}
    assert not problems, problems
