"""The dashboard's "Producers" table tells the truth (issue 29), in a real browser
(Debian's headless Chromium, as ``test_dashboard_browser.py``) against a real 3-server
cluster at R=3: after 5000 records over 6 partitions, the column "partitions
(highwater)" shows each partition's live highwater (not ``@-1``, as before the fix), the
page says how old the leaders' answers are, a producer that renews its lease but never
writes is flagged and is what the "leased but not writing" filter keeps, and the table
pages on the server. A screenshot with the live numbers is kept in
``$PIDLEASE_ARTIFACTS`` (else the test's tmp dir); ``PIDLEASE_SCREENSHOT=path`` copies it
there too (docs/img/dashboard-live-pids.png was made so)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster
from tests.helpers import leased

pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (driver only; no browser download)"
)
from playwright.sync_api import Page

from tests.integration.test_dashboard_browser import (
    CHROMIUM,
    page,  # noqa: F401 - the fixture
    screenshot,
)

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed"
)

RECORDS = 5000
PARTITIONS = 6


def test_live_highwaters_age_not_writing_filter_and_pages(
    make_cluster: Any,
    page: Page,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    cluster: LocalCluster = make_cluster(servers=3)
    cluster.create_topic("orders", PARTITIONS, replication_factor=3)
    with Producer(cluster.coordinator_url, topic="orders", producer_name="walk") as p:
        futures = [p.send(b"%d" % i, partition=i % PARTITIONS) for i in range(RECORDS)]
        acked = [f.result(timeout=120) for f in futures]
        walk = p.pid
    last = {part: max(a.sequence_id for a in acked[part::PARTITIONS]) for part in range(6)}
    want = " ".join(f"orders/{part}@{hw}" for part, hw in sorted(last.items()))
    # A producer that keeps its lease but never writes.
    stuck = leased(cluster, partition=2, producer_name="stuck-exporter", expire_ms=60_000)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(1.0):
            leased(cluster, pid=stuck["pid"], generation=stuck["generation"], expire_ms=60_000)

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        page.goto(cluster.coordinator_url + "/dashboard")
        page.wait_for_selector("#status.ok")
        cell = f'#pids tbody tr[data-pid="{walk}"] td[data-col="parts"]'
        page.wait_for_function(
            "([sel, want]) => document.querySelector(sel)?.textContent === want", arg=[cell, want]
        )
        page.wait_for_function(
            "() => /highwaters as of [0-9.]+s ago/"
            ".test(document.getElementById('asof').textContent)"
        )
        row = page.locator(f'#pids tbody tr[data-pid="{stuck["pid"]}"]')
        assert row.locator('td[data-col="parts"]').inner_text() == "orders/2@none"
        assert row.locator('td[data-col="lastappend"]').inner_text() == "never seen"
        page.wait_for_function(
            "(pid) => document.querySelector(`#pids tbody tr[data-pid='${pid}'] "
            "td[data-col='lastappend']`)?.className === 'writing'",
            arg=walk,
        )
        shot = screenshot(page, tmp_path, "dashboard-live-pids")
        assert shot.stat().st_size > 10_000
        if os.environ.get("PIDLEASE_SCREENSHOT"):
            shutil.copy(shot, os.environ["PIDLEASE_SCREENSHOT"])

        # The filter runs on the coordinator: only the stuck producer is left.
        page.check("#not-writing")
        page.wait_for_function(
            "(pid) => [...document.querySelectorAll('#pids tbody tr')].map((r) => r.dataset.pid)"
            ".join() === String(pid)",
            arg=stuck["pid"],
        )
        page.wait_for_function(
            "() => document.getElementById('shown').textContent.includes('of 1 matching')"
        )
        page.uncheck("#not-writing")
        page.wait_for_function(
            "() => document.getElementById('shown').textContent.includes('of 2 matching')"
        )
    finally:
        stop.set()
        renewer.join(15)
