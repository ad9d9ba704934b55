"""The dashboard in a real browser (Debian's headless Chromium driven by Playwright) against
a real cluster: a new producer appears, a short lease goes active -> expiring -> lapsed
without a reload, a takeover shows as a fenced event and the zombie's refused append as
another (from the partition server), the table sorts and filters, and the
page fetches nothing from anywhere but the coordinator. A screenshot is kept in
``$PIDLEASE_ARTIFACTS`` (else the test's tmp dir); its path is printed.

Every wait is on DOM state with a deadline. The state history is recorded in the page by
a MutationObserver, so a short-lived state is seen even if the test looks late.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pidlease import errors
from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.wire import WireClient, batch, token
from tests.helpers import leased

pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (driver only; no browser download)"
)
from playwright.sync_api import Page, sync_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 45_000
LEASE_MS = 10_000  # expiring once 5 s are left (min(window 30 s, 10 s / 2))

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed"
)

# Records, per PID row, every state its cell shows, in order (consecutive repeats dropped).
RECORD_STATES = """() => {
  window.__states = {};
  window.__marker = 'no reload since here';
  const scan = () => {
    for (const tr of document.querySelectorAll('#pids tbody tr[data-pid]')) {
      const cell = tr.querySelector('td[data-col="state"]');
      if (!cell) continue;
      const h = (window.__states[tr.dataset.pid] ||= []);
      if (h[h.length - 1] !== cell.textContent) h.push(cell.textContent);
    }
  };
  new MutationObserver(scan).observe(document.querySelector('#pids tbody'),
    {subtree: true, childList: true, characterData: true});
  scan();
}"""


def artifacts_dir(tmp_path: Path) -> Path:
    d = Path(os.environ.get("PIDLEASE_ARTIFACTS") or tmp_path / "artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


def screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    shot = artifacts_dir(tmp_path) / f"{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"dashboard screenshot: {shot}")
    return shot


@pytest.fixture
def page(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    with sync_playwright() as pw:
        # A persistent context is how Playwright takes a fresh --user-data-dir.
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1100},
        )
        pg = ctx.pages[0] if ctx.pages else ctx.new_page()
        pg.set_default_timeout(WAIT_MS)
        try:
            yield pg
        finally:
            rep = getattr(request.node, "rep_call", None)
            if rep is None or rep.failed:
                try:  # what the page showed when it failed
                    screenshot(pg, tmp_path, request.node.name + "-failed")
                except Exception as exc:  # noqa: BLE001 - must not hide the failure
                    print(f"no screenshot: {exc}")
            ctx.close()


def state_cell(page: Page, pid: int) -> Any:
    return page.locator(f'#pids tbody tr[data-pid="{pid}"] td[data-col="state"]')


def test_dashboard_lifecycle_takeover_sort_filter(
    make_cluster: Any, page: Page, tmp_path: Path
) -> None:
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("orders", 2)
    origin = cluster.coordinator_url
    requests: list[str] = []
    problems: list[str] = []
    loads: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on(
        "console",
        lambda m: (
            problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning")
            else None
        ),
    )
    page.on("load", lambda: loads.append("load"))

    steady = leased(cluster, partition=1, producer_name="steady-loader", expire_ms=600_000)
    page.goto(origin + "/dashboard")
    page.wait_for_selector("#status.ok")
    page.evaluate(RECORD_STATES)

    # A new producer appears, without a reload. It is renewed until the page has shown it
    # active, so the test cannot miss the first state however slow the machine is.
    short = leased(cluster, producer_name="nightly-export", expire_ms=LEASE_MS)
    pid = short["pid"]
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(1.0):
            leased(cluster, pid=pid, generation=short["generation"], expire_ms=LEASE_MS)

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        page.wait_for_selector(f'#pids tbody tr[data-pid="{pid}"] td[data-col="state"].active')
    finally:
        stop.set()
        renewer.join(15)
    row = page.locator(f'#pids tbody tr[data-pid="{pid}"]')
    assert row.locator('td[data-col="name"]').inner_text() == "nightly-export"
    # Leased, never written: its leader holds no state for it ("none"; -1 before issue 29),
    # and it shows as not writing.
    assert row.locator('td[data-col="parts"]').inner_text() == "orders/0@none"
    assert row.locator('td[data-col="lastappend"]').inner_text() == "never seen"
    assert row.locator('td[data-col="lastappend"]').get_attribute("class") == "not-writing"

    # Left alone, it goes expiring, then lapsed.
    page.wait_for_selector(f'#pids tbody tr[data-pid="{pid}"] td[data-col="state"].lapsed')
    history = page.evaluate(f"() => window.__states['{pid}']")
    assert history == ["active", "expiring", "lapsed"], history
    page.wait_for_function("() => document.getElementById('count-lapsed').textContent === '1'")
    assert page.evaluate("() => window.__marker") == "no reload since here"
    assert state_cell(page, steady["pid"]).inner_text() == "active"

    # A takeover by name: the old generation is fenced, and the page says so.
    taken = leased(cluster, producer_name="nightly-export", expire_ms=60_000)
    assert taken["kind"] == "takeover" and taken["pid"] == pid
    event = page.locator(f'#events li[data-kind="takeover"][data-pid="{pid}"]')
    event.wait_for()
    text = event.inner_text()
    assert f"generation {short['generation']} fenced" in text, text
    assert f"now {taken['generation']}" in text, text
    page.wait_for_selector(f'#pids tbody tr[data-pid="{pid}"] td[data-col="state"].active')
    assert row.locator('td[data-col="gen"]').inner_text() == str(taken["generation"])

    # A zombie of the old generation tries to append. Its lease lapsed above, so it holds
    # a token signed as a renewal just before the takeover would have been: the partition
    # server refuses it FENCED, and the page lists it with the server as source.
    zombie_token = token(cluster.secret, pid, short["generation"])
    with WireClient(cluster.servers[0].address) as c:
        r = c.produce("orders", 0, batch(pid, short["generation"], 0, [b"late"]), zombie_token)
    assert r.error_code == errors.ProducerFenced.code
    zombie = page.locator(f'#events li[data-kind="fenced_append"][data-pid="{pid}"]')
    zombie.wait_for()
    assert "refused FENCED" in zombie.inner_text() and "server 1" in zombie.inner_text()
    page.wait_for_function(
        "() => document.querySelector("
        '\'#servers tbody tr[data-server="1"] td[data-col="7"]\')'
        "?.textContent === '1'"
    )

    # Filter by text and by state; sort by pid both ways.
    rows = page.locator("#pids tbody tr")
    page.fill("#filter", "steady")
    page.wait_for_function("() => document.querySelectorAll('#pids tbody tr').length === 1")
    assert rows.first.get_attribute("data-pid") == str(steady["pid"])
    page.fill("#filter", "")
    page.uncheck('.state-filter[value="active"]')
    page.wait_for_function("() => document.querySelectorAll('#pids tbody tr').length === 0")
    page.check('.state-filter[value="active"]')
    page.wait_for_function("() => document.querySelectorAll('#pids tbody tr').length === 2")
    page.click('th[data-sort="pid"]')
    want = sorted([pid, steady["pid"]])
    page.wait_for_function(
        f"() => [...document.querySelectorAll('#pids tbody tr')]"
        f".map(r => +r.dataset.pid).join() === '{want[0]},{want[1]}'"
    )
    page.click('th[data-sort="pid"]')
    page.wait_for_function(
        f"() => [...document.querySelectorAll('#pids tbody tr')]"
        f".map(r => +r.dataset.pid).join() === '{want[1]},{want[0]}'"
    )
    assert page.get_attribute('th[data-sort="pid"]', "aria-sort") == "descending"

    # The servers panel lists the live server with the PIDs it tracks (the takeover's
    # fence created state for the name's PID on partition 0).
    server = page.locator('#servers tbody tr[data-server="1"]')
    server.wait_for()
    assert "unreachable" not in server.inner_text()

    # The partition logs panel: one row per partition of "orders", each with what the
    # topics API says of its log (nothing is written any more, so the figures hold).
    _, desc = http_json("GET", origin + "/v1/topics/orders")
    for st in desc["partition_states"]:
        want = [
            "orders",
            str(st["partition"]),
            "server 1",
            str(st["log_start_offset"]),
            str(st["log_end_offset"]),
            str(st["high_watermark"]),
        ]
        page.wait_for_function(
            "([p, want]) => [...(document.querySelector("
            '`#logs tbody tr[data-topic="orders"][data-partition="${p}"]`)?.cells || [])]'
            ".slice(0, 6).map(c => c.textContent).join('|') === want.join('|')",
            arg=[st["partition"], want],
        )
    log_row = page.locator('#logs tbody tr[data-topic="orders"][data-partition="0"]')
    assert "0 segments" in log_row.inner_text()  # retention took nothing (7-day default)

    page.fill("#filter", "")
    page.click('th[data-sort="expires_at_ms"]')
    assert screenshot(page, tmp_path, "dashboard").stat().st_size > 10_000
    assert page.evaluate("() => window.__marker") == "no reload since here"
    assert loads == ["load"], loads
    foreign = [u for u in requests if not u.startswith(origin + "/")]
    assert not foreign, foreign
    assert not problems, problems


def test_dashboard_partition_logs_are_paged_and_filtered_by_topic(
    make_cluster: Any, page: Page, tmp_path: Path
) -> None:
    """Issue 24: the "Partition logs" table shows one page of partitions (100), with the
    range and the total, previous / next, and a topic filter; a topic of thousands of
    partitions is 100-row pages, not one table of them all."""
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("wide", 250)
    cluster.create_topic("narrow", 3)
    origin = cluster.coordinator_url
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(origin + "/dashboard")
    page.wait_for_selector("#status.ok")
    rows = "#logs tbody tr"
    # every partition's leader reports its log: 253 in all, the first page of 100 shown
    page.wait_for_function(
        "() => document.querySelector('#logs-shown').textContent === 'partitions 1-100 of 253'"
    )
    assert page.locator(rows).count() == 100
    # by topic, then partition: narrow's 3 first, then wide/0 .. wide/96
    assert page.locator(rows).nth(0).get_attribute("data-topic") == "narrow"
    assert page.locator(rows).nth(99).get_attribute("data-partition") == "96"
    assert page.locator("#logs-prev").is_disabled()
    page.click("#logs-next")
    page.wait_for_function(
        "() => document.querySelector('#logs-shown').textContent === 'partitions 101-200 of 253'"
    )
    assert page.locator(rows).nth(0).get_attribute("data-partition") == "97"
    page.click("#logs-next")
    page.wait_for_function(
        "() => document.querySelector('#logs-shown').textContent === 'partitions 201-253 of 253'"
    )
    assert page.locator(rows).count() == 53
    assert page.locator("#logs-next").is_disabled()
    last = page.locator(rows).nth(52)
    assert (last.get_attribute("data-topic"), last.get_attribute("data-partition")) == (
        "wide",
        "249",
    )
    # the filter starts again from the first page of the matching topics
    page.fill("#logs-filter", "narr")
    page.wait_for_function(
        "() => document.querySelector('#logs-shown').textContent"
        " === 'partitions 1-3 of 3 in topics matching \"narr\"'"
    )
    assert page.locator(rows).count() == 3
    assert page.locator("#logs-next").is_disabled() and page.locator("#logs-prev").is_disabled()
    screenshot(page, tmp_path, "dashboard-logs-pages")
    # the page's size is the server's to bound: a bad one is a 422, not a crash
    status, _ = http_json("GET", origin + "/dashboard/data?logs_limit=0")
    assert status == 422
    status, body = http_json("GET", origin + "/dashboard/data?logs_offset=250&logs_limit=10")
    assert status == 200 and body["logs_page"]["count"] == 3 and body["logs_truncated"] is False
    assert not problems, problems
