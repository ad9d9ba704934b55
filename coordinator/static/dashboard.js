// The PID-expiry dashboard's behaviour: poll /dashboard/data every second, update the page
// in place (no reload), and between polls tick "expires in" and each lease's state with
// the coordinator's rule (coordinator/leases.py lease_state). No dependencies, no inline
// code (the page's Content-Security-Policy forbids it), every value set as text.
"use strict";

(() => {
  const POLL_MS = 1000;
  const TICK_MS = 250;
  const STATE_ORDER = { active: 0, expiring: 1, lapsed: 2 };

  let data = null;          // the last /dashboard/data answer
  let clockOffset = 0;      // coordinator clock minus ours, from the last answer
  let sortKey = "expires_at_ms";
  let sortDir = 1;
  let pollTimer = null;
  let lastEventsKey = "";
  const rowsByPid = new Map();

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const svg = (tag, attrs) => {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  };
  const setText = (node, text) => { if (node.textContent !== text) node.textContent = text; };

  // -- formatting (same units as the server-rendered first paint) ----------------------
  function dur(ms) {
    const sign = ms < 0 ? "-" : "";
    ms = Math.abs(ms);
    if (ms < 10000) return `${sign}${(ms / 1000).toFixed(1)}s`;
    const s = Math.floor(ms / 1000);
    if (s < 120) return `${sign}${s}s`;
    if (s < 7200) return `${sign}${Math.floor(s / 60)}m`;
    if (s < 172800) return `${sign}${Math.floor(s / 3600)}h`;
    return `${sign}${Math.floor(s / 86400)}d`;
  }
  function bytes(n) {
    if (n === null || n === undefined) return "?";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }
  const num = (n) => (n === null || n === undefined ? "?" : String(n));
  const now = () => Date.now() + clockOffset;
  const clock = (ms) => new Date(ms).toLocaleTimeString();

  // The coordinator's rule: lapsed when the lease has run out, expiring once at most
  // min(window, expire_ms / 2) is left.
  function stateOf(p, t) {
    const left = p.expires_at_ms - t;
    if (left <= 0) return "lapsed";
    if (left <= Math.min(data.expiring_window_ms, Math.floor(p.expire_ms / 2))) return "expiring";
    return "active";
  }
  // A partition's live highwater, or why there is none (coordinator/dashboard.py _highwater).
  const HW_WORDS = { "leader unreachable": "unreachable", "not asked yet": "?", "no state": "none" };
  const hwText = (x) => HW_WORDS[x.status] || String(x.highwater);
  const partsText = (p) => p.partitions.map((x) => `${x.topic}/${x.partition}@${hwText(x)}`).join(" ");

  // -- the PID table ---------------------------------------------------------------------
  function sortValue(p, key, t) {
    if (key === "state") return STATE_ORDER[stateOf(p, t)];
    if (key === "partitions") return partsText(p);
    if (key === "producer_name") return p.producer_name || "";
    return p[key];
  }

  function visibleRows(t) {
    const needle = $("filter").value.trim().toLowerCase();
    const states = new Set([...document.querySelectorAll(".state-filter:checked")].map((c) => c.value));
    const rows = data.pids.filter((p) => {
      if (!states.has(stateOf(p, t))) return false;
      if (!needle) return true;
      return `${p.producer_name || ""} ${p.pid} ${partsText(p)}`.toLowerCase().includes(needle);
    });
    rows.sort((a, b) => {
      const x = sortValue(a, sortKey, t);
      const y = sortValue(b, sortKey, t);
      return (x < y ? -1 : x > y ? 1 : a.pid - b.pid) * sortDir;
    });
    return rows;
  }

  function makeRow(pid) {
    const tr = el("tr", { "data-pid": String(pid) });
    for (const col of ["name", "pid", "gen", "parts", "lastuse", "lastappend", "lag", "expires", "state"]) {
      tr.appendChild(el("td", { "data-col": col }));
    }
    return tr;
  }

  function renderTable() {
    const t = now();
    const tbody = $("pids").tBodies[0];
    const rows = visibleRows(t);
    const keep = new Set();
    rows.forEach((p, i) => {
      keep.add(p.pid);
      let tr = rowsByPid.get(p.pid);
      if (!tr) { tr = makeRow(p.pid); rowsByPid.set(p.pid, tr); }
      const c = tr.cells;
      setText(c[0], p.producer_name || "");
      setText(c[1], String(p.pid));
      setText(c[2], String(p.generation));
      setText(c[3], partsText(p));
      setText(c[4], `${dur(t - p.last_use_ms)} ago`);
      renderAppend(c[5], c[6], p, t);
      setText(c[7], dur(p.expires_at_ms - t));
      const state = stateOf(p, t);
      if (c[8].className !== state) c[8].className = state;
      setText(c[8], state);
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
    });
    for (const [pid, tr] of rowsByPid) {
      if (!keep.has(pid)) { tr.remove(); rowsByPid.delete(pid); }
    }
    while (tbody.children.length > rows.length) tbody.lastElementChild.remove();
    renderPager(rows.length);
  }

  // -- the PID table's server side: page, filters, age of the leaders' answers ----------
  let pidOffset = 0;
  let logsOffset = 0;  // the "Partition logs" table's page (issue 24: 10,000 partitions)
  function pidQuery() {
    const params = new URLSearchParams();
    const needle = $("filter").value.trim();
    if (needle) params.set("q", needle);
    const states = [...document.querySelectorAll(".state-filter:checked")].map((c) => c.value);
    if (states.length && states.length < 3) for (const s of states) params.append("state", s);
    if ($("not-writing").checked) params.set("not_writing", "true");
    params.set("offset", String(pidOffset));
    const topic = $("logs-filter").value.trim();
    if (topic) params.set("logs_topic", topic);
    params.set("logs_offset", String(logsOffset));
    return params.toString();
  }

  function renderAppend(cell, lagCell, p, t) {
    const writing = p.writing ? "writing" : "not-writing";
    if (cell.className !== writing) cell.className = writing;
    setText(cell, p.last_append_ms == null ? "never seen" : `${dur(t - p.last_append_ms)} ago`);
    setText(lagCell, p.append_lag_ms == null ? "" : dur(p.append_lag_ms));
  }

  function renderPager(shown) {
    const meta = data.producers;
    if (!meta) {
      const more = data.truncated ? ` (the ${data.pids.length} most urgent of ${data.total})` : "";
      setText($("shown"), `${shown} shown${more}`);
      return;
    }
    const first = meta.matched ? meta.offset + 1 : 0;
    setText($("shown"), `${shown} shown, ${first}-${meta.offset + meta.count} of ${meta.matched} matching`);
    $("prev").disabled = meta.offset <= 0;
    $("next").disabled = meta.offset + meta.count >= meta.matched;
    const age = meta.age_ms == null ? "highwaters not asked yet" : `highwaters as of ${dur(meta.age_ms)} ago`;
    const gone = meta.leaders_unreachable.length ? `; unreachable: server ${meta.leaders_unreachable.map((u) => u.server_id).join(", ")}` : "";
    setText($("asof"), `${age}, records as of ${dur(meta.records_age_ms)} ago${gone}`);
  }

  function turnPage(step) {
    const meta = data && data.producers;
    if (!meta) return;
    pidOffset = Math.max(0, pidOffset + step * meta.limit);
    schedule(0);
  }

  function refilter() {
    pidOffset = 0;
    if (data) renderTable();
    schedule(0);
  }

  function setSort(key) {
    sortDir = key === sortKey ? -sortDir : 1;
    sortKey = key;
    for (const th of $("pids").tHead.rows[0].cells) {
      if (th.dataset.sort === sortKey) th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
    if (data) renderTable();
  }

  // -- counts, timeline, servers, events -------------------------------------------------
  function renderCounts() {
    for (const s of Object.keys(STATE_ORDER)) setText($(`count-${s}`), String(data.counts[s]));
    setText($("total"), String(data.total));
    setText($("updated"), clock(data.served_ms));
  }

  function renderTimeline() {
    const tl = data.timeline;
    const chart = $("timeline");
    const W = 600, H = 100, max = Math.max(1, ...tl.counts);
    const w = W / tl.counts.length;
    const parts = [];
    tl.counts.forEach((n, i) => {
      const h = (n / max) * (H - 10);
      const soon = (i + 1) * tl.bucket_ms <= data.expiring_window_ms;
      const bar = svg("rect", { x: (i * w + 1).toFixed(1), y: (H - h).toFixed(1), width: (w - 2).toFixed(1),
        height: h.toFixed(1), class: soon ? "bar expiring" : "bar active", "data-count": n });
      const title = svg("title");
      title.textContent = `${n} expiring in ${dur(i * tl.bucket_ms)}..${dur((i + 1) * tl.bucket_ms)}`;
      bar.appendChild(title);
      parts.push(bar);
    });
    parts.push(svg("line", { x1: 0, y1: H, x2: W, y2: H, class: "axis" }));
    for (const [x, label, anchor] of [[0, "now", "start"], [W / 2, `+${dur(tl.horizon_ms / 2)}`, "middle"],
      [W, `+${dur(tl.horizon_ms)}`, "end"]]) {
      const text = svg("text", { x, y: H + 15, "text-anchor": anchor, class: "tick" });
      text.textContent = label;
      parts.push(text);
    }
    chart.replaceChildren(...parts);
    const soon = tl.counts.reduce((a, b) => a + b, 0);
    setText($("timeline-note"), `${soon} lease${soon === 1 ? " expires" : "s expire"} within ` +
      `${dur(tl.horizon_ms)}, ${tl.later} later; ${tl.lapsed} lapsed (kept until retention ends)`);
  }

  function renderServers() {
    const tbody = $("servers").tBodies[0];
    const rows = data.servers.map((s) => {
      const tr = el("tr", { "data-server": String(s.id), class: s.reachable ? "" : "down" });
      const cells = s.reachable
        ? [`server ${s.id}`, s.address, `${s.partitions} (${s.leading} leading)`, num(s.tracked_pids),
          bytes(s.producer_state_bytes), bytes(s.rss_bytes),
          s.snapshot_age_seconds === null || s.snapshot_age_seconds === undefined ? "?" : dur(s.snapshot_age_seconds * 1000),
          num(s.fenced_appends), num(s.duplicates), num(s.out_of_order)]
        : [`server ${s.id}`, s.address, `unreachable: ${s.error}`, "", "", "", "", "", "", ""];
      cells.forEach((text, i) => tr.appendChild(el("td", { "data-col": String(i) }, text)));
      if (s.top_partitions && s.top_partitions.length) {
        tr.cells[3].title = s.top_partitions.map((p) => `${p.topic}/${p.partition} (${p.role}): ${p.tracked_pids}`).join("\n");
      }
      return tr;
    });
    tbody.replaceChildren(...rows);
  }

  // Offsets and sizes as the topics API gives them: -1 is "the leader did not say".
  const known = (n) => (n === null || n === undefined || n < 0 ? "?" : String(n));
  function renderLogs() {
    const rows = data.logs.map((p) => {
      const tr = el("tr", { "data-topic": p.topic, "data-partition": String(p.partition) });
      const deleted = p.segments_deleted === undefined
        ? "?" : `${p.segments_deleted} segments (${bytes(p.bytes_deleted)})`;
      const cells = [p.topic, String(p.partition), `server ${p.leader}`, known(p.log_start_offset),
        known(p.log_end_offset), known(p.high_watermark),
        p.size_bytes < 0 ? "?" : bytes(p.size_bytes), deleted];
      cells.forEach((text, i) => tr.appendChild(el("td", { "data-col": String(i) }, text)));
      return tr;
    });
    $("logs").tBodies[0].replaceChildren(...rows);
    const meta = data.logs_page;
    if (!meta) {  // a coordinator from before the pages
      setText($("logs-note"), data.logs_truncated ? `first ${data.logs.length} partitions shown`
        : (data.logs.length ? "" : "no partition leader reported a log yet"));
      return;
    }
    if (meta.offset > 0 && meta.count === 0 && meta.matched > 0) {
      // past the end (partitions gone, or a narrower filter): back to the last page
      logsOffset = Math.max(0, Math.floor((meta.matched - 1) / meta.limit) * meta.limit);
      schedule(0);
    }
    const first = meta.count ? meta.offset + 1 : 0;
    setText($("logs-shown"), `partitions ${first}-${meta.offset + meta.count} of ${meta.matched}`
      + (meta.topic ? ` in topics matching "${meta.topic}"` : ""));
    $("logs-prev").disabled = meta.offset <= 0;
    $("logs-next").disabled = meta.offset + meta.count >= meta.matched;
    setText($("logs-note"), meta.matched ? ""
      : (meta.topic ? "no partition of a matching topic reported a log" : "no partition leader reported a log yet"));
  }

  function turnLogsPage(step) {
    const meta = data && data.logs_page;
    if (!meta) return;
    logsOffset = Math.max(0, logsOffset + step * meta.limit);
    schedule(0);
  }

  // -- consumer groups (issue 25): one row per group and committed partition -------------
  function renderGroups() {
    const rows = (data.groups || []).map((g) => {
      const tr = el("tr", { "data-group": g.group, "data-topic": g.topic === null ? "" : g.topic,
        "data-partition": g.partition === null ? "" : String(g.partition) });
      const cells = [g.group, g.state, String(g.members), g.coordinator,
        g.topic === null ? "-" : g.topic, g.partition === null ? "-" : String(g.partition),
        g.committed === null ? "-" : String(g.committed), g.high_watermark === null ? "?" : known(g.high_watermark),
        g.lag === null ? (g.topic === null ? "-" : "?") : String(g.lag)];
      cells.forEach((text, i) => tr.appendChild(el("td", { "data-col": String(i) }, text)));
      if (g.lag !== null && g.lag > 0) tr.cells[8].className = "lagging";
      return tr;
    });
    $("groups").tBodies[0].replaceChildren(...rows);
    const notes = [];
    if (data.groups_truncated) notes.push(`first ${data.groups.length} rows shown`);
    if (!rows.length) notes.push("no consumer groups yet");
    for (const s of data.groups_unknown || []) notes.push(`groups unknown on ${s}`);
    setText($("groups-note"), notes.join("; "));
  }

  function eventText(e) {
    const who = `pid ${e.pid}${e.producer_name ? ` (${e.producer_name})` : ""}`;
    const where = e.topic !== undefined ? ` on ${e.topic}/${e.partition}` : "";
    switch (e.kind) {
      case "takeover":
        return `${who} taken over: generation ${e.fenced_generation} fenced, now ${e.generation} ` +
          `(${e.partitions_fenced} partition${e.partitions_fenced === 1 ? "" : "s"} fenced)`;
      case "fenced_lease":
        return `${who}: lease with stale generation ${e.generation} refused FENCED`;
      case "fenced_append":
        return `${who} generation ${e.generation}: append${where} refused FENCED (zombie producer)`;
      case "duplicate":
        return `${who}: batch seq ${e.base_sequence}..${e.base_sequence + e.count - 1}${where} ` +
          "answered DUPLICATE (a retry; not appended again)";
      case "fence":
        return `${who}: fence record${where}, generation ${e.generation} now current`;
      default:
        return `${who}: ${e.kind}`;
    }
  }

  function renderEvents() {
    const key = data.events.map((e) => e.id).join(",");
    if (key === lastEventsKey) return;
    lastEventsKey = key;
    const items = data.events.map((e) => {
      const li = el("li", { "data-kind": e.kind, "data-pid": String(e.pid), "data-id": e.id });
      li.appendChild(el("time", {}, clock(e.time_ms)));
      li.appendChild(el("span", { class: `kind ${e.kind === "duplicate" ? "duplicate" : "fenced"}` }, e.kind));
      li.appendChild(el("span", { class: "source" }, e.source));
      li.appendChild(el("span", { class: "text" }, eventText(e)));
      return li;
    });
    if (!items.length) items.push(el("li", { class: "empty" }, "no fenced or duplicate events yet"));
    $("events").replaceChildren(...items);
  }

  // -- the loop --------------------------------------------------------------------------
  async function poll() {
    pollTimer = null;
    try {
      const resp = await fetch(`/dashboard/data?horizon_ms=${$("horizon").value}&${pidQuery()}`, { cache: "no-store" });
      const body = await resp.json();
      if (!resp.ok) throw new Error(`${body.error}: ${body.detail}`);
      if (!data) $("pids").tBodies[0].replaceChildren();  // adopt nothing from the first paint
      data = body;
      clockOffset = body.served_ms - Date.now();
      renderCounts();
      renderTable();
      renderTimeline();
      renderServers();
      renderLogs();
      renderGroups();
      renderEvents();
      $("status").className = "ok";
      setText($("status"), "live");
    } catch (err) {
      $("status").className = "error";
      setText($("status"), `cannot reach the coordinator (${err.message}); retrying`);
    } finally {
      schedule(POLL_MS);
    }
  }

  function schedule(ms) {
    if (pollTimer !== null) clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, ms);
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const th of $("pids").tHead.rows[0].cells) {
      th.addEventListener("click", () => setSort(th.dataset.sort));
      th.addEventListener("keydown", (ev) => { if (ev.key === "Enter") setSort(th.dataset.sort); });
    }
    $("filter").addEventListener("input", refilter);
    for (const c of document.querySelectorAll(".state-filter")) c.addEventListener("change", refilter);
    $("not-writing").addEventListener("change", refilter);
    $("prev").addEventListener("click", () => turnPage(-1));
    $("next").addEventListener("click", () => turnPage(1));
    $("logs-prev").addEventListener("click", () => turnLogsPage(-1));
    $("logs-next").addEventListener("click", () => turnLogsPage(1));
    $("logs-filter").addEventListener("input", () => { logsOffset = 0; schedule(0); });
    $("horizon").addEventListener("change", () => schedule(0));
    setInterval(() => data && renderTable(), TICK_MS);
    sortKey = "";  // the first setSort picks ascending expiry
    setSort("expires_at_ms");
    schedule(0);
  });
})();
