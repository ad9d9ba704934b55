"""The dashboard without a cluster: the expiry timeline and row order, escaping of what
producers name themselves, the JSON the page polls (with a fake PID list and fleet), its
assets and security headers, the PID-state gauge on /metrics, and that the script only
uses element ids the page has."""

from __future__ import annotations

import re
from typing import Any

import pytest

from coordinator import dashboard as D
from coordinator.app import Coordinator, create_app
from coordinator.events import EventLog
from coordinator.settings import CoordinatorSettings
from partition_server.metrics import parse_text, sample
from tests.unit.coordinator.test_app import TestClient

NOW = 1_800_000_000_000


def view(
    pid: int,
    expires_in_ms: int,
    *,
    expire_ms: int = 60_000,
    name: str | None = None,
    state: str | None = None,
) -> dict[str, Any]:
    if state is None:
        state = (
            "lapsed"
            if expires_in_ms <= 0
            else "expiring"
            if expires_in_ms <= min(30_000, expire_ms // 2)
            else "active"
        )
    return {
        "producer_name": name,
        "pid": pid,
        "generation": 3,
        "expire_ms": expire_ms,
        "expires_at_ms": NOW + expires_in_ms,
        "expires_in_ms": expires_in_ms,
        "last_use_ms": NOW - 1000,
        "created_ms": NOW - 5000,
        "state": state,
        "partitions": [{"topic": "orders", "partition": 0, "highwater": 7, "seen": True}],
    }


def test_timeline_puts_every_running_lease_in_exactly_one_bucket() -> None:
    lefts = [1, 9_999, 10_000, 299_999, 300_000, 5_000_000, 0, -1, -86_400_000]
    tl = D.timeline([view(i, left) for i, left in enumerate(lefts)], 300_000, buckets=30)
    assert tl["bucket_ms"] == 10_000 and tl["horizon_ms"] == 300_000
    assert tl["counts"][0] == 2 and tl["counts"][1] == 1 and tl["counts"][29] == 1
    assert sum(tl["counts"]) == 4 and tl["later"] == 2 and tl["lapsed"] == 3


def test_rows_show_running_leases_soonest_first_then_the_most_recently_lapsed() -> None:
    pids = [view(1, 50_000), view(2, -10), view(3, 5_000), view(4, -90_000), view(5, 0)]
    got = [p["pid"] for p in D.order_rows(pids, 10)]
    assert got == [3, 1, 5, 2, 4]
    assert [p["pid"] for p in D.order_rows(pids, 2)] == [3, 1]


def test_first_paint_escapes_what_producers_call_themselves() -> None:
    evil = '<script>alert("x")</script>'
    html = D.render_page(
        [view(1, -5, name=evil)], {"active": 0, "expiring": 0, "lapsed": 1}, NOW, "coord<1>", 1
    )
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "coord&lt;1&gt;" in html
    assert 'class="lapsed"' in html and 'id="count-lapsed">1<' in html
    # No inline code: the CSP forbids it, so any would silently not run.
    assert not re.search(r"<script>|<style|\sstyle=|\son[a-z]+=", html)


def test_every_element_the_script_uses_is_on_the_page() -> None:
    js = (D.STATIC_DIR / "dashboard.js").read_text()
    html = D.render_page([], {"active": 0, "expiring": 0, "lapsed": 0}, NOW, "c", 0)
    ids = set(re.findall(r'\$\("([\w-]+)"\)', js)) | {f"count-{s}" for s in D.STATES}
    assert ids and all(f'id="{i}"' in html for i in ids), sorted(
        i for i in ids if f'id="{i}"' not in html
    )
    assert "http://" not in js.replace("http://www.w3.org/2000/svg", "") and "https://" not in js


class FakeFleet:
    def __init__(self) -> None:
        self.surveys = 0

    def survey(self) -> list[dict[str, Any]]:
        self.surveys += 1
        return [{"id": 1, "address": "127.0.0.1:1", "reachable": True, "tracked_pids": 4}]

    def close(self) -> None:
        pass


@pytest.fixture
def client() -> tuple[TestClient, Coordinator, list[int], FakeFleet]:
    coord = Coordinator(CoordinatorSettings(zk="127.0.0.1:1/none"))
    scans: list[int] = []
    pids = [view(1, 120_000), view(2, 10_000, name="n"), view(3, -1)]

    def list_pids() -> list[dict[str, Any]]:
        scans.append(1)
        return pids

    fleet = FakeFleet()
    coord.dashboard = D.Dashboard(
        list_pids,
        fleet,
        coord.events,  # type: ignore[arg-type]
        clock_ms=lambda: NOW,
        coordinator_id="c1",
        expiring_window_ms=30_000,
        refresh_ms=60_000,
    )
    return TestClient(create_app(coordinator=coord, start=False)), coord, scans, fleet


def test_data_counts_rows_timeline_servers_and_events(client: Any) -> None:
    c, coord, scans, fleet = client
    coord.events.add("takeover", pid=2, generation=4, fenced_generation=3)
    coord.events.merge(
        [
            {
                "id": "1:5:1",
                "kind": "duplicate",
                "time_ms": NOW + 1,
                "server_id": 1,
                "pid": 2,
                "topic": "orders",
                "partition": 0,
                "base_sequence": 0,
                "count": 1,
            }
        ]
    )
    r = c.get("/dashboard/data?horizon_ms=60000")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    body = r.json()
    assert body["counts"] == {"active": 1, "expiring": 1, "lapsed": 1} and body["total"] == 3
    assert [p["pid"] for p in body["pids"]] == [2, 1, 3]
    assert body["timeline"]["counts"][5] == 1 and body["timeline"]["later"] == 1
    assert body["expiring_window_ms"] == 30_000 and body["served_ms"] == NOW
    assert [e["kind"] for e in body["events"]] == ["duplicate", "takeover"]
    assert body["events"][0]["source"] == "server 1" and body["servers"][0]["tracked_pids"] == 4
    for _ in range(3):  # one shared snapshot serves every viewer within refresh_ms
        c.get("/dashboard/data")
        c.get("/dashboard")
    assert len(scans) == 1 and fleet.surveys == 1
    assert c.get("/dashboard/data?horizon_ms=0").status_code == 422


def test_page_assets_and_headers(client: Any) -> None:
    c, _, _, _ = client
    page = c.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        asset = c.get(src)
        assert asset.status_code == 200 and asset.content, src
    assert (
        c.get("/dashboard/static/dashboard.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    for bad in ("/dashboard/static/app.py", "/dashboard/static/..%2Fapp.py", "/dashboard/static/"):
        r = c.get(bad)
        assert r.status_code == 404 and r.json()["error"] == "INVALID_REQUEST", bad


def test_metrics_show_pids_per_state_only_once_a_snapshot_exists(client: Any) -> None:
    c, _, _, _ = client
    assert "pidlease_pids{" not in c.get("/metrics").text
    c.get("/dashboard/data")
    s = parse_text(c.get("/metrics").text)
    assert [sample(s, "pidlease_pids", state=k) for k in D.STATES] == [1, 1, 1]


def test_without_zookeeper_the_data_is_503_not_500() -> None:
    c = TestClient(
        create_app(coordinator=Coordinator(CoordinatorSettings(zk="127.0.0.1:1/none")), start=False)
    )
    r = c.get("/dashboard/data")
    assert r.status_code == 503 and r.json()["error"] == "COORDINATOR_UNAVAILABLE"


def test_missing_assets_cost_the_live_updates_not_the_coordinator(tmp_path: Any) -> None:
    assert D.load_static(tmp_path / "not-there") == {}
    assert set(D.load_static()) == {"dashboard.js", "dashboard.css", "favicon.svg"}


def test_partition_logs_table_one_row_per_partition_from_its_newest_leader() -> None:
    """The leaders' METADATA, read as the topics API reads it (followers and junk
    skipped); a partition two servers claim shows the newer epoch's figures; the logs
    travel in their own table, not again inside each server's row."""
    from coordinator.fleet import _leader_logs

    def entry(topic: str, p: int, role: str, epoch: int, **kw: Any) -> dict[str, Any]:
        base = {"topic": topic, "partition": p, "role": role, "leader_epoch": epoch}
        return {**base, "log_end_offset": 50, "high_watermark": 40, **kw}

    one = _leader_logs(
        [
            entry(
                "b",
                0,
                "leader",
                1,
                log_start_offset=10,
                size_bytes=999,
                segments_deleted=2,
                bytes_deleted=8192,
            ),
            entry("a", 1, "follower", 1),
            entry("a", 0, "leader", 3, size_bytes=5),
            {"topic": 7, "partition": 0, "role": "leader"},
            "junk",
        ]
    )
    two = _leader_logs([entry("a", 0, "leader", 4, log_start_offset=20, size_bytes=6)])
    assert [(r["topic"], r["partition"]) for r in one] == [("b", 0), ("a", 0)]
    assert one[0] == {
        "topic": "b",
        "partition": 0,
        "log_start_offset": 10,
        "log_end_offset": 50,
        "high_watermark": 40,
        "size_bytes": 999,
        "segments_deleted": 2,
        "bytes_deleted": 8192,
        "leader_epoch": 1,
    }
    servers = [
        {"id": 1, "reachable": True, "logs": one},
        {"id": 2, "reachable": True, "logs": two},
        {"id": 3, "reachable": False, "error": "no answer in time"},
    ]
    rows, matched = D.log_rows(servers, 10)
    assert [(r["topic"], r["partition"], r["leader"]) for r in rows] == [("a", 0, 2), ("b", 0, 1)]
    assert matched == 2
    assert rows[0]["log_start_offset"] == 20 and "segments_deleted" not in rows[0]
    assert D.log_rows(servers, 1) == (rows[:1], 2)
    assert D.log_rows(servers, 1, offset=1) == (rows[1:], 2)
    assert D.log_rows(servers, 10, topic="b") == (rows[1:], 1)

    class LogFleet(FakeFleet):
        def survey(self) -> list[dict[str, Any]]:
            return servers

    dash = D.Dashboard(
        list,
        LogFleet(),  # type: ignore[arg-type]  # duck-typed stand-in
        EventLog("coordinator c1"),
        clock_ms=lambda: NOW,
        coordinator_id="c1",
        expiring_window_ms=30_000,
    )
    body = dash.data()
    assert body["logs"] == rows and body["logs_truncated"] is False
    assert body["logs_page"] == {"topic": "", "offset": 0, "limit": 100, "count": 2, "matched": 2}
    body = dash.data(logs_query=D.LogQuery(offset=1, limit=1))
    assert body["logs"] == rows[1:] and body["logs_truncated"] is False
    body = dash.data(logs_query=D.LogQuery(limit=1))
    assert body["logs"] == rows[:1] and body["logs_truncated"] is True
    assert all("logs" not in s for s in body["servers"]) and len(body["servers"]) == 3
    page = D.render_page([], {"active": 0, "expiring": 0, "lapsed": 0}, NOW, "c", 0)
    assert '<table id="logs">' in page and "log start" in page and "high watermark" in page
