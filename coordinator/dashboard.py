"""``GET /dashboard``: the ops page of PID expiry, one self-refreshing HTML table, soonest
expiry first. Rendered on the server with every value escaped; no scripts."""

from __future__ import annotations

import html
from typing import Any

_STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}
td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left}
.active{color:#16723a}.expiring{color:#a06000;font-weight:bold}.lapsed{color:#a01010}"""


def _dur(ms: int) -> str:
    sign = "-" if ms < 0 else ""
    s = abs(ms) // 1000
    if s < 120:
        return f"{sign}{s}s"
    if s < 7200:
        return f"{sign}{s // 60}m"
    return f"{sign}{s // 3600}h"


def render_dashboard(pids: list[dict[str, Any]], now_ms: int, coordinator_id: str) -> str:
    e = html.escape
    counts = {k: sum(1 for p in pids if p["state"] == k) for k in ("active", "expiring", "lapsed")}
    rows = []
    for p in sorted(pids, key=lambda v: v["expires_in_ms"]):
        parts = ", ".join(f"{x['topic']}/{x['partition']}@{x['highwater']}" for x in p["partitions"])
        rows.append(
            f"<tr><td>{p['pid']}</td><td>{e(p['producer_name'] or '')}</td>"
            f"<td>{p['generation']}</td><td class=\"{e(p['state'])}\">{e(p['state'])}</td>"
            f"<td>{_dur(p['expires_in_ms'])}</td><td>{_dur(now_ms - p['last_use_ms'])} ago</td>"
            f"<td>{e(parts)}</td></tr>")
    summary = " · ".join(f"{k}: {v}" for k, v in counts.items())
    return (f"<!doctype html><html><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"refresh\" content=\"5\"><title>pidlease PIDs</title>"
            f"<style>{_STYLE}</style></head><body><h1>PID leases</h1>"
            f"<p>coordinator {e(coordinator_id)} · {len(pids)} PIDs · {summary}</p>"
            f"<table><tr><th>pid</th><th>producer</th><th>generation</th><th>state</th>"
            f"<th>expires in</th><th>last use</th><th>partitions (highwater)</th></tr>"
            f"{''.join(rows)}</table></body></html>")
