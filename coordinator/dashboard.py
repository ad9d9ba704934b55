"""``GET /dashboard``: the operators' page of PID expiry, and ``GET /dashboard/data``, the
JSON it polls.

The page is rendered on the server first (every value escaped), so it is useful without
JavaScript and a reload always shows the truth; ``static/dashboard.js`` then polls
``/dashboard/data`` every second and updates the table, the counts, the expiry timeline,
the servers, the partition logs and the events in place, and ticks "expires in" and the
state between polls with the same rule as ``leases.lease_state``. Assets come from
``coordinator/static``, served by the coordinator itself; the Content-Security-Policy
allows nothing else.

One METADATA round to the servers serves every viewer for ``REFRESH_MS``, and the PID
table comes from the coordinator's PID view (``producers``: ``pid_index.py`` and
``live_rows.py``, each a shared cached refresh): a wall of open dashboards costs the same
as one. The table is one page, filtered and ordered on the coordinator (``PidQuery``);
without a PID view (unit tests) it is the whole list from ``list_pids``, cut at
``ROWS_MAX``.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.events import EventLog
from coordinator.fleet import Fleet
from coordinator.groups_view import GROUPS_MAX, GroupsView, lag_rows
from coordinator.live_rows import IDLE_MS_DEFAULT
from coordinator.pid_index import Producers
from pidlease.errors import describe

log = logging.getLogger("coordinator.dashboard")

REFRESH_MS = 1000  # how stale a shared snapshot may be
ROWS_MAX = 2000  # PID rows sent to a browser (counts and timeline cover all)
EVENTS_SHOWN = 50
LOG_ROWS_MAX = 2000  # partition logs on one page of the "Partition logs" table, at most
LOG_PAGE_ROWS = 100  # partition logs per page by default (10,000 partitions: 100 pages)
TIMELINE_BUCKETS = 30
HORIZON_MS_DEFAULT = 300_000
HORIZON_MS_MIN, HORIZON_MS_MAX = 10_000, 7 * 86_400_000
STATES = ("active", "expiring", "lapsed")
PAGE_ROWS = 100  # PID rows per dashboard page with an index (``producers``)
PAGE_ROWS_MAX = 1000


@dataclass(frozen=True, slots=True)
class PidQuery:
    """What the dashboard's "Producers" table asks for: filters and a page."""

    states: frozenset[str] = frozenset(STATES)
    text: str = ""
    not_writing: bool = False
    idle_ms: int = IDLE_MS_DEFAULT
    offset: int = 0
    limit: int = PAGE_ROWS


@dataclass(frozen=True, slots=True)
class LogQuery:
    """What the dashboard's "Partition logs" table asks for: the partitions whose topic
    name contains ``topic`` (all when empty), by topic and partition, one page of them."""

    topic: str = ""
    offset: int = 0
    limit: int = LOG_PAGE_ROWS


STATIC_DIR = Path(__file__).with_name("static")
STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# No CDN, no inline code: the page may load only what this coordinator serves.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def load_static(directory: Path = STATIC_DIR) -> dict[str, tuple[bytes, str]]:
    """The page's assets, read once at start: name -> (bytes, content type). A fixed
    set, so no request path ever reaches the file system. Missing assets (a package
    built without its data files) cost the page its live updates, never the lease
    service: the first paint still works, and the log says what is wrong."""
    try:
        files = sorted(directory.iterdir())
    except OSError as exc:
        log.error("dashboard assets missing (%s): /dashboard will not update itself", describe(exc))
        return {}
    return {
        p.name: (p.read_bytes(), STATIC_TYPES[p.suffix]) for p in files if p.suffix in STATIC_TYPES
    }


def timeline(
    pids: list[dict[str, Any]], horizon_ms: int, buckets: int = TIMELINE_BUCKETS
) -> dict[str, Any]:
    """Upcoming expiries over the next ``horizon_ms`` in equal buckets (by time left at
    the snapshot), plus how many expire later and how many have lapsed."""
    size = max(1, horizon_ms // buckets)
    counts = [0] * buckets
    later = lapsed = 0
    for p in pids:
        left = p["expires_in_ms"]
        if left <= 0:
            lapsed += 1
        elif left >= size * buckets:
            later += 1
        else:
            counts[left // size] += 1
    return {
        "horizon_ms": size * buckets,
        "bucket_ms": size,
        "counts": counts,
        "later": later,
        "lapsed": lapsed,
    }


def log_rows(
    servers: list[dict[str, Any]], limit: int, *, topic: str = "", offset: int = 0
) -> tuple[list[dict[str, Any]], int]:
    """One row per partition from the logs its leader reports, by topic and partition, and
    how many partitions matched: rows ``offset`` .. ``offset + limit - 1`` of the partitions
    whose topic name contains ``topic``. Two servers both claiming a partition (a failover
    in progress) show the newer epoch's."""
    best: dict[tuple[str, int], tuple[dict[str, Any], Any]] = {}
    for s in servers:
        for row in s.get("logs") or ():
            key = (row["topic"], row["partition"])
            if topic and topic not in key[0]:
                continue
            old = best.get(key)
            if old is None or row.get("leader_epoch", -1) > old[0].get("leader_epoch", -1):
                best[key] = (row, s.get("id"))
    keys = sorted(best)
    rows = [{**best[k][0], "leader": best[k][1]} for k in keys[offset : offset + limit]]
    return rows, len(keys)


def order_rows(pids: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """What an operator must see first when there are too many: leases still running,
    soonest expiry first, then the most recently lapsed."""
    running = sorted((p for p in pids if p["expires_in_ms"] > 0), key=lambda p: p["expires_in_ms"])
    lapsed = sorted((p for p in pids if p["expires_in_ms"] <= 0), key=lambda p: -p["expires_in_ms"])
    return (running + lapsed)[:limit]


class Dashboard:
    def __init__(
        self,
        list_pids: Callable[[], list[dict[str, Any]]],
        fleet: Fleet,
        events: EventLog,
        *,
        clock_ms: Callable[[], int],
        coordinator_id: str,
        expiring_window_ms: int,
        refresh_ms: int = REFRESH_MS,
        producers: Producers | None = None,
        groups_view: GroupsView | None = None,
    ) -> None:
        self._list_pids = list_pids
        # The PID table's source at scale (issue 29): pages, filters and live highwaters
        # from the coordinator's index; without it, the whole list from ``list_pids``.
        self.producers = producers
        self.fleet = fleet
        self.events = events
        self.clock_ms = clock_ms
        self.coordinator_id = coordinator_id
        self.expiring_window_ms = expiring_window_ms
        self.refresh_ms = refresh_ms
        self._lock = threading.Lock()
        self._pids: tuple[float, int, list[dict[str, Any]]] | None = None  # (taken, now_ms, views)
        self._servers: tuple[float, list[dict[str, Any]]] | None = None
        self.static = load_static()
        self.groups_view = groups_view
        # (taken, group x partition rows with lag, servers that did not answer)
        self._groups: tuple[float, list[dict[str, Any]], list[str]] | None = None

    # -- shared snapshots ------------------------------------------------------------------
    def pids(self) -> tuple[int, list[dict[str, Any]]]:
        """(snapshot time, PID views), at most ``refresh_ms`` old. The lock makes
        concurrent viewers wait for one scan instead of each starting their own."""
        with self._lock:
            got = self._pids
            if got is None or time.monotonic() - got[0] > self.refresh_ms / 1000:
                now = self.clock_ms()
                got = (time.monotonic(), now, self._list_pids())
                self._pids = got
            return got[1], got[2]

    def last_counts(self) -> dict[str, float] | None:
        """Counts per state of the newest snapshot, without scanning (for /metrics)."""
        if self.producers is not None:
            cols = self.producers.index.peek()
            if cols is None:
                return None
            return dict(cols.counts(self.clock_ms(), self.expiring_window_ms))
        got = self._pids
        if got is None:
            return None
        return {s: sum(1 for p in got[2] if p["state"] == s) for s in STATES}

    def servers(self) -> list[dict[str, Any]]:
        with self._lock:
            got = self._servers
            if got is None or time.monotonic() - got[0] > self.refresh_ms / 1000:
                got = (time.monotonic(), self.fleet.survey())
                self._servers = got
            return got[1]

    # -- consumer groups (issue 25) --------------------------------------------------------
    def groups(self, servers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        """(group x partition rows with their lag, servers whose groups are unknown), at most
        ``refresh_ms`` old; the high watermarks are those of ``servers`` (the fleet's
        survey of the same round)."""
        if self.groups_view is None:
            return [], []
        with self._lock:
            got = self._groups
            if got is None or time.monotonic() - got[0] > self.refresh_ms / 1000:
                groups, silent = self.groups_view.survey()
                hws = {
                    (r["topic"], r["partition"]): int(r.get("high_watermark", -1))
                    for r in log_rows(servers, 1 << 30)[0]
                }
                got = (time.monotonic(), lag_rows(groups, hws), silent)
                self._groups = got
            return got[1], got[2]

    def group_lag(self) -> list[tuple[dict[str, str], float]] | None:
        """``pidlease_group_lag`` samples (for /metrics): one per (group, topic, partition)
        with a known lag, from the shared snapshots (refreshed when older than
        ``refresh_ms``: a scrape costs the servers what one dashboard poll does). None
        without a groups view."""
        if self.groups_view is None:
            return None
        rows, _ = self.groups(self.servers())
        return [
            ({"group": r["group"], "topic": r["topic"], "partition": str(r["partition"])}, r["lag"])
            for r in rows
            if r["lag"] is not None
        ]

    # -- the JSON the page polls -----------------------------------------------------------
    def data(
        self,
        horizon_ms: int = HORIZON_MS_DEFAULT,
        query: PidQuery | None = None,
        logs_query: LogQuery | None = None,
    ) -> dict[str, Any]:
        horizon_ms = min(max(horizon_ms, HORIZON_MS_MIN), HORIZON_MS_MAX)
        servers = self.servers()
        lq = logs_query or LogQuery()
        limit = min(max(lq.limit, 1), LOG_ROWS_MAX)
        logs, logs_matched = log_rows(servers, limit, topic=lq.topic, offset=lq.offset)
        groups, groups_silent = self.groups(servers)
        return {
            "error": "NONE",
            "coordinator_id": self.coordinator_id,
            "served_ms": self.clock_ms(),
            "refresh_ms": self.refresh_ms,
            "expiring_window_ms": self.expiring_window_ms,
            **self.producers_data(horizon_ms, query or PidQuery()),
            # The logs travel once, in their own table, not again inside each server.
            "servers": [{k: v for k, v in s.items() if k != "logs"} for s in servers],
            # One page of the partitions (10,000 of them are 100 pages, issue 24).
            "logs": logs,
            "logs_truncated": lq.offset + len(logs) < logs_matched,
            "logs_page": {
                "topic": lq.topic,
                "offset": lq.offset,
                "limit": limit,
                "count": len(logs),
                "matched": logs_matched,
            },
            "events": self.events.recent(EVENTS_SHOWN),
            "groups": groups[:GROUPS_MAX],
            "groups_truncated": len(groups) > GROUPS_MAX,
            "groups_unknown": groups_silent,
        }

    def producers_data(self, horizon_ms: int, query: PidQuery) -> dict[str, Any]:
        """The "Producers" part of the data: one page of PIDs (filtered, in the
        operator's order, with live highwaters), the counts and the expiry timeline. With
        an index (``producers``) only the page travels; without, the whole list is
        ordered here and cut at ``ROWS_MAX``."""
        if self.producers is None:
            now, pids = self.pids()
            rows = order_rows(pids, ROWS_MAX)
            return {
                "now_ms": now,
                "total": len(pids),
                "truncated": len(rows) < len(pids),
                "counts": {s: sum(1 for p in pids if p["state"] == s) for s in STATES},
                "pids": rows,
                "timeline": timeline(pids, horizon_ms),
            }
        body = self.producers.query(
            states=query.states,
            text=query.text,
            not_writing=query.not_writing,
            idle_ms=query.idle_ms,
            offset=query.offset,
            limit=query.limit,
            max_age_ms=self.refresh_ms,
        )
        cols = self.producers.index.get(self.refresh_ms)
        now = body["served_ms"]
        return {
            "now_ms": now,
            "total": body["total"],
            "truncated": body["matched"] > len(body["pids"]),
            "counts": body["counts"],
            "pids": body["pids"],
            "timeline": cols.timeline(now, horizon_ms, TIMELINE_BUCKETS),
            "producers": {k: v for k, v in body.items() if k != "pids"},
        }

    # -- the page --------------------------------------------------------------------------
    def page(self) -> str:
        if self.producers is not None:
            body = self.producers.query(limit=PAGE_ROWS, max_age_ms=self.refresh_ms)
            return render_page(
                body["pids"], body["counts"], body["served_ms"], self.coordinator_id, body["total"]
            )
        now, pids = self.pids()
        rows = order_rows(pids, ROWS_MAX)
        counts = {s: sum(1 for p in pids if p["state"] == s) for s in STATES}
        return render_page(rows, counts, now, self.coordinator_id, len(pids))


def _dur(ms: int) -> str:
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 10_000:
        return f"{sign}{ms / 1000:.1f}s"
    s = ms // 1000
    if s < 120:
        return f"{sign}{s}s"
    if s < 7200:
        return f"{sign}{s // 60}m"
    if s < 172_800:
        return f"{sign}{s // 3600}h"
    return f"{sign}{s // 86_400}d"


def _highwater(x: dict[str, Any]) -> str:
    """One partition's cell text: the live highwater, or why there is none."""
    status = x.get("status", "live")
    if status == "leader unreachable":
        return "unreachable"
    if status == "not asked yet":
        return "?"
    if status == "no state":
        return "none"
    return str(x["highwater"])


def parts_text(p: dict[str, Any]) -> str:
    """``topic/partition@highwater`` for each partition of a PID view (as ``pidlease pids``
    prints it)."""
    return " ".join(f"{x['topic']}/{x['partition']}@{_highwater(x)}" for x in p["partitions"])


def _append_cells(p: dict[str, Any], now_ms: int) -> str:
    last = p.get("last_append_ms")
    lag = p.get("append_lag_ms")
    writing = "writing" if p.get("writing") else "not writing"
    return (
        f'<td data-col="lastappend" class="{writing.replace(" ", "-")}">'
        f"{'never seen' if last is None else _dur(now_ms - last) + ' ago'}</td>"
        f'<td data-col="lag">{"" if lag is None else _dur(lag)}</td>'
    )


def _row(p: dict[str, Any], now_ms: int) -> str:
    e = html.escape
    parts = parts_text(p)
    # Cells are found by data-col; the state cell's class is the state alone, so a page
    # grep for class="lapsed" finds exactly the lapsed rows.
    return (
        f'<tr data-pid="{p["pid"]}"><td data-col="name">{e(p["producer_name"] or "")}</td>'
        f'<td data-col="pid">{p["pid"]}</td><td data-col="gen">{p["generation"]}</td>'
        f'<td data-col="parts">{e(parts)}</td>'
        f'<td data-col="lastuse">{_dur(now_ms - p["last_use_ms"])} ago</td>'
        f"{_append_cells(p, now_ms)}"
        f'<td data-col="expires">{_dur(p["expires_in_ms"])}</td>'
        f'<td data-col="state" class="{e(p["state"])}">{e(p["state"])}</td></tr>'
    )


def render_page(
    rows: list[dict[str, Any]], counts: dict[str, int], now_ms: int, coordinator_id: str, total: int
) -> str:
    e = html.escape
    cards = "".join(
        f'<div class="card {s}"><span class="n" id="count-{s}">{counts[s]}</span>'
        f'<span class="label">{s}</span></div>'
        for s in STATES
    )
    body = "".join(_row(p, now_ms) for p in rows)
    head = "".join(
        f'<th data-sort="{k}" tabindex="0">{label}</th>'
        for k, label in (
            ("producer_name", "producer"),
            ("pid", "pid"),
            ("generation", "generation"),
            ("partitions", "partitions (highwater)"),
            ("last_use_ms", "last renewal"),
            ("last_append_ms", "last append"),
            ("append_lag_ms", "append lag"),
            ("expires_at_ms", "lease expires in"),
            ("state", "state"),
        )
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pidlease: PID expiry</title>
<link rel="icon" href="/dashboard/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/dashboard/static/dashboard.css">
<script src="/dashboard/static/dashboard.js" defer></script>
</head><body>
<header><h1>PID leases</h1>
<p class="meta">coordinator <b>{e(coordinator_id)}</b> · <span id="total">{total}</span> PIDs ·
updated <span id="updated">at load</span> <span id="status" class="ok"></span></p></header>
<section class="cards" id="counts">{cards}</section>
<section class="panel"><h2>Upcoming expiries</h2>
<label>horizon <select id="horizon"><option value="60000">1 minute</option>
<option value="300000" selected>5 minutes</option><option value="900000">15 minutes</option>
<option value="3600000">1 hour</option><option value="86400000">1 day</option></select></label>
<svg id="timeline" viewBox="0 0 600 120" role="img" aria-label="expiries over time"></svg>
<p id="timeline-note" class="note"></p></section>
<section class="panel"><h2>Producers</h2>
<div class="filters"><input id="filter" type="search" placeholder="filter: name, pid, topic">
<label><input type="checkbox" class="state-filter" value="active" checked> active</label>
<label><input type="checkbox" class="state-filter" value="expiring" checked> expiring</label>
<label><input type="checkbox" class="state-filter" value="lapsed" checked> lapsed</label>
<label><input type="checkbox" id="not-writing"> leased but not writing</label>
<span id="shown" class="note"></span> <span id="asof" class="note"></span>
<button id="prev" type="button">previous</button> <button id="next" type="button">next</button>
</div>
<table id="pids"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>
<section class="panel"><h2>Partition servers</h2>
<table id="servers"><thead><tr><th>server</th><th>address</th><th>partitions</th>
<th>tracked PIDs</th><th>PID state memory</th><th>resident memory</th><th>snapshot age</th>
<th>fenced appends</th><th>duplicates</th><th>out of order</th></tr></thead><tbody></tbody></table>
</section>
<section class="panel"><h2>Partition logs</h2>
<div class="filters"><input id="logs-filter" type="search" placeholder="topic contains"
 aria-label="show the partitions of topics whose name contains">
<span id="logs-shown" class="note"></span>
<button id="logs-prev" type="button">previous</button>
<button id="logs-next" type="button">next</button></div>
<table id="logs"><thead><tr><th>topic</th><th>partition</th><th>leader</th><th>log start</th>
<th>log end</th><th>high watermark</th><th>size</th><th>retention deleted</th></tr></thead>
<tbody></tbody></table><p id="logs-note" class="note"></p></section>
<section class="panel"><h2>Consumer groups</h2>
<table id="groups"><thead><tr><th>group</th><th>state</th><th>members</th><th>coordinator</th>
<th>topic</th><th>partition</th><th>committed</th><th>high watermark</th><th>lag</th></tr></thead>
<tbody></tbody></table><p id="groups-note" class="note"></p></section>
<section class="panel"><h2>Recent fenced and duplicate events</h2>
<ol id="events" class="events"></ol></section>
<noscript><p>Without JavaScript this page does not update itself; reload it.</p></noscript>
</body></html>"""
