"""Every retained PID record as compact columns, for the operator's views at a million PIDs
(issue 29): ``GET /v1/pids``, the dashboard's "Producers" table and ``pidlease pids`` page,
sort and filter here, on the coordinator, and only the page's rows become JSON.

One snapshot is one ZooKeeper scan of ``/pids`` (the children, then the records in
pipelined reads of 1000). It refreshes in the background when a viewer finds it older than
``refresh_ms``, and a scan that took d waits at least d / ``BUSY_SHARE_MAX`` before the
next, so a million records (a scan of about a minute here) never keeps the coordinator
busy; every answer says how old its snapshot is. Only the first viewer ever waits for a
scan.

A record costs about 100 bytes here (seven 8-byte columns, the name and owner, one 4-byte
partition id and a seen flag per partition) instead of the kilobyte or so of a parsed
``PidRecord``. Rows are kept in expiry order, so the default page (leases still running,
soonest expiry first, then the most recently lapsed: ``dashboard.order_rows``), the state
counts and the expiry timeline cost a binary search, not a pass over every PID; a text or
"not writing" filter is one pass.
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from coordinator import leases
from coordinator.live_rows import IDLE_MS_DEFAULT, NOT_YET, LiveRows, Refreshing, Snapshot, annotate
from coordinator.store import Store
from pidlease.wire.cluster import PidRecord, split_tp_key

REFRESH_MS = 2000
READ_CHUNK = 1000
STATES = ("active", "expiring", "lapsed")


@dataclass(slots=True)
class PidColumns:
    """The records of one scan, sorted by ``expires_at_ms`` (ties by pid)."""

    taken_ms: int = 0
    took_s: float = 0.0
    pid: array[int] = field(default_factory=lambda: array("q"))
    generation: array[int] = field(default_factory=lambda: array("q"))
    expire_ms: array[int] = field(default_factory=lambda: array("q"))
    expires_at_ms: array[int] = field(default_factory=lambda: array("q"))
    last_use_ms: array[int] = field(default_factory=lambda: array("q"))
    created_ms: array[int] = field(default_factory=lambda: array("q"))
    name: list[str | None] = field(default_factory=list)
    owner: list[str] = field(default_factory=list)
    tp_start: array[int] = field(default_factory=lambda: array("I", [0]))
    tp_id: array[int] = field(default_factory=lambda: array("I"))
    tp_seen: array[int] = field(default_factory=lambda: array("b"))
    tps: list[str] = field(default_factory=list)
    # (live snapshot it was joined with, newest highwater move per row, -1: none)
    appended: tuple[Snapshot, array[int]] | None = None
    # (one lowercase line per row: name, pid, partitions; each line's start), built by the
    # first text search: a search is then ``str.find`` in C, not a pass in Python
    haystack: tuple[str, array[int]] | None = None

    def __len__(self) -> int:
        return len(self.pid)

    def partitions_of(self, i: int) -> list[tuple[str, bool]]:
        a, b = self.tp_start[i], self.tp_start[i + 1]
        return [(self.tps[self.tp_id[j]], bool(self.tp_seen[j])) for j in range(a, b)]

    def state(self, i: int, now_ms: int, window_ms: int) -> str:
        return leases.state_at(self.expires_at_ms[i], self.expire_ms[i], now_ms, window_ms).value

    def view(self, i: int, now_ms: int, window_ms: int) -> dict[str, Any]:
        """Row ``i`` as ``LeaseService.pid_view`` shows a record (recorded highwaters are
        left out: ``live_rows.annotate`` fills the live ones)."""
        parts = []
        for tp, seen in sorted(self.partitions_of(i), key=lambda x: split_tp_key(x[0])):
            topic, p = split_tp_key(tp)
            parts.append({"topic": topic, "partition": p, "highwater": -1, "seen": seen})
        return {
            "producer_name": self.name[i],
            "pid": self.pid[i],
            "owner": self.owner[i],
            "generation": self.generation[i],
            "expire_ms": self.expire_ms[i],
            "expires_at_ms": self.expires_at_ms[i],
            "expires_in_ms": self.expires_at_ms[i] - now_ms,
            "last_use_ms": self.last_use_ms[i],
            "created_ms": self.created_ms[i],
            "state": self.state(i, now_ms, window_ms),
            "partitions": parts,
        }

    # -- order, counts, timeline: binary searches over expires_at_ms ------------------
    def lapsed_count(self, now_ms: int) -> int:
        return bisect.bisect_right(self.expires_at_ms, now_ms)

    def order(self, now_ms: int) -> Iterator[int]:
        """Running leases soonest expiry first, then lapsed ones most recent first."""
        k = self.lapsed_count(now_ms)
        yield from range(k, len(self))
        yield from range(k - 1, -1, -1)

    def expiring(self, now_ms: int, window_ms: int) -> list[int]:
        """Rows in the expiring state: within the window's range of the expiry order, the
        ones ``leases.state_at`` calls expiring (its rule inline: a pass at a million)."""
        k = self.lapsed_count(now_ms)
        ea, em = self.expires_at_ms, self.expire_ms
        end = bisect.bisect_right(ea, now_ms + window_ms)
        return [i for i in range(k, end) if ea[i] - now_ms <= min(window_ms, em[i] // 2)]

    def counts(self, now_ms: int, window_ms: int) -> dict[str, int]:
        lapsed = self.lapsed_count(now_ms)
        expiring = len(self.expiring(now_ms, window_ms))
        return {
            "active": len(self) - lapsed - expiring,
            "expiring": expiring,
            "lapsed": lapsed,
        }

    def timeline(self, now_ms: int, horizon_ms: int, buckets: int) -> dict[str, Any]:
        """``dashboard.timeline`` by binary search: expiries per bucket of the horizon."""
        size = max(1, horizon_ms // buckets)
        ea = self.expires_at_ms
        k = bisect.bisect_right(ea, now_ms)
        edges = [bisect.bisect_left(ea, now_ms + size * b) for b in range(buckets + 1)]
        edges[0] = k
        counts = [max(0, edges[b + 1] - edges[b]) for b in range(buckets)]
        return {
            "horizon_ms": size * buckets,
            "bucket_ms": size,
            "counts": counts,
            "later": len(self) - max(k, edges[-1]),
            "lapsed": k,
        }

    # -- the join with the leaders' rows ----------------------------------------------
    def last_appends(self, live: Snapshot) -> array[int]:
        """Per row, the newest highwater move the leaders' rows show on its partitions
        (-1: none): one pass, kept while ``live`` stays the newest."""
        got = self.appended
        if got is not None and got[0] is live:
            return got[1]
        out = array("q", bytes(8 * len(self)))
        if live is not NOT_YET:
            parts = live.parts
            for i in range(len(self)):
                pid = self.pid[i]
                best = -1
                for j in range(self.tp_start[i], self.tp_start[i + 1]):
                    rows = parts.get(self.tps[self.tp_id[j]])
                    if rows is not None:
                        k = rows.find(pid)
                        if k >= 0 and rows.moved_ms[k] > best:
                            best = rows.moved_ms[k]
                out[i] = best
        else:
            out = array("q", [-1]) * len(self)
        self.appended = (live, out)
        return out

    def text_rows(self, text: str) -> list[int]:
        """Rows whose name, pid or a partition contains ``text`` (lowercase), in row
        order: what ``matches_text`` says of each, found with ``str.find`` over one
        string of every row (about 35 MB at a million PIDs, kept with the columns)."""
        if self.haystack is None:
            lines = []
            for i in range(len(self)):
                tps = "\t".join(
                    self.tps[self.tp_id[j]] for j in range(self.tp_start[i], self.tp_start[i + 1])
                )
                lines.append(f"{self.name[i] or ''}\t{self.pid[i]}\t{tps}".lower())
            starts = array("q", [0])
            for line in lines:
                starts.append(starts[-1] + len(line) + 1)
            self.haystack = ("\n".join(lines), starts)
        blob, starts = self.haystack
        text = text.replace("\n", " ").replace("\t", " ")
        out: list[int] = []
        pos = blob.find(text) if text else -1
        while pos >= 0:
            row = bisect.bisect_right(starts, pos) - 1
            out.append(row)
            pos = blob.find(text, starts[row + 1])
        return out

    def matches_text(self, i: int, text: str) -> bool:
        name = self.name[i]
        if name is not None and text in name.lower():
            return True
        if text in str(self.pid[i]):
            return True
        return any(
            text in self.tps[self.tp_id[j]].lower()
            for j in range(self.tp_start[i], self.tp_start[i + 1])
        )


def build(
    records: Iterable[PidRecord], taken_ms: int, keep: Callable[[PidRecord], bool]
) -> PidColumns:
    """Columns of the ``records`` that ``keep`` retains, in expiry order. Streams: each
    record is dropped once its row is appended (a million parsed records at once would
    take a gigabyte); the order is applied to the columns at the end."""
    c = PidColumns(taken_ms=taken_ms)
    tp_ids: dict[str, int] = {}
    owners: dict[str, str] = {}
    for r in records:
        if not keep(r):
            continue
        c.pid.append(r.pid)
        c.generation.append(r.generation)
        c.expire_ms.append(r.expire_ms)
        c.expires_at_ms.append(r.expires_at_ms)
        c.last_use_ms.append(r.last_use_ms)
        c.created_ms.append(r.created_ms)
        c.name.append(r.producer_name)
        owner = leases.owner_of(r)
        c.owner.append(owners.setdefault(owner, owner))
        for tp, info in r.partitions.items():
            got = tp_ids.get(tp)
            if got is None:
                got = tp_ids[tp] = len(c.tps)
                c.tps.append(tp)
            c.tp_id.append(got)
            c.tp_seen.append(1 if info.get("seen") else 0)
        c.tp_start.append(len(c.tp_id))
    ea, pid = c.expires_at_ms, c.pid
    order = sorted(range(len(pid)), key=lambda i: (ea[i], pid[i]))
    if any(i != j for i, j in enumerate(order)):
        _reorder(c, order)
    return c


def _reorder(c: PidColumns, order: list[int]) -> None:
    for name in ("pid", "generation", "expire_ms", "expires_at_ms", "last_use_ms", "created_ms"):
        col: array[int] = getattr(c, name)
        setattr(c, name, array("q", [col[i] for i in order]))
    c.name = [c.name[i] for i in order]
    c.owner = [c.owner[i] for i in order]
    start, ids, seen = c.tp_start, c.tp_id, c.tp_seen
    new_start, new_ids, new_seen = array("I", [0]), array("I"), array("b")
    for i in order:
        a, b = start[i], start[i + 1]
        new_ids.extend(ids[a:b])
        new_seen.extend(seen[a:b])
        new_start.append(len(new_ids))
    c.tp_start, c.tp_id, c.tp_seen = new_start, new_ids, new_seen


@dataclass(slots=True)
class Page:
    views: list[dict[str, Any]]
    matched: int  # rows matching the filters (all pages)
    counts: dict[str, int]  # every retained PID by state, filters aside
    total: int


def page(
    cols: PidColumns,
    live: Snapshot,
    now_ms: int,
    window_ms: int,
    *,
    states: frozenset[str] = frozenset(STATES),
    text: str = "",
    not_writing: bool = False,
    idle_ms: int = 60_000,
    offset: int = 0,
    limit: int = 100,
    fresher: Callable[[int], PidRecord | None] | None = None,
) -> Page:
    """One page of the filtered rows in the operator's order, with live cells
    (``live_rows.annotate``). Without a text or "not writing" filter the page costs a
    binary search and its own rows; with one, a pass over every row."""
    counts = cols.counts(now_ms, window_ms)
    text = text.strip().lower()
    picked: list[int] = []
    matched = 0
    if not text and not not_writing and states == frozenset(STATES):
        matched = len(cols)
        it = cols.order(now_ms)
        for _ in range(offset):
            if next(it, None) is None:
                break
        picked = [i for _, i in zip(range(limit), it, strict=False)]
    else:
        appended = cols.last_appends(live) if not_writing else None
        candidates = _candidates(cols, now_ms, window_ms, states)
        if text:
            candidates = _in_order(cols, cols.text_rows(text), now_ms)
        for i in candidates:
            if states != frozenset(STATES) and cols.state(i, now_ms, window_ms) not in states:
                continue
            if appended is not None:
                if cols.state(i, now_ms, window_ms) == "lapsed":
                    continue
                last = appended[i]
                if last >= 0 and now_ms - last <= idle_ms:
                    continue
            if offset <= matched < offset + limit:
                picked.append(i)
            matched += 1
    views = [cols.view(i, now_ms, window_ms) for i in picked]
    if fresher is not None:
        for v in views:
            _freshen(v, fresher(v["pid"]), now_ms, window_ms)
    views = [annotate(v, live, now_ms, idle_ms) for v in views]
    return Page(views, matched, counts, len(cols))


def _freshen(view: dict[str, Any], record: PidRecord | None, now_ms: int, window_ms: int) -> None:
    """A page row's lease from a newer record this coordinator holds (it renewed or took
    the PID over since the scan): at a million PIDs a scan is minutes old, and a lease
    renewed since must not show as lapsed. Order and counts stay as of the scan."""
    if record is None or record.last_use_ms <= view["last_use_ms"]:
        return
    view.update(
        generation=record.generation,
        expire_ms=record.expire_ms,
        expires_at_ms=record.expires_at_ms,
        expires_in_ms=record.expires_at_ms - now_ms,
        last_use_ms=record.last_use_ms,
        state=leases.lease_state(record, now_ms, window_ms).value,
    )


def _in_order(cols: PidColumns, rows: list[int], now_ms: int) -> list[int]:
    """``rows`` (ascending) in the operator's order: running, then lapsed newest first."""
    k = cols.lapsed_count(now_ms)
    cut = bisect.bisect_left(rows, k)
    return rows[cut:] + rows[:cut][::-1]


def _candidates(
    cols: PidColumns, now_ms: int, window_ms: int, states: frozenset[str]
) -> Iterable[int]:
    """The rows a state filter can match, in the operator's order (only the lapsed
    prefix, only the expiry window's range for expiring alone)."""
    if states == frozenset({"lapsed"}):
        return range(cols.lapsed_count(now_ms) - 1, -1, -1)
    if states == frozenset({"expiring"}):
        return cols.expiring(now_ms, window_ms)
    if "lapsed" not in states:
        return range(cols.lapsed_count(now_ms), len(cols))
    return cols.order(now_ms)


class PidIndex(Refreshing[PidColumns]):
    # A scan mostly waits for ZooKeeper's answers: it may run half the time.
    busy_share = 0.5

    def __init__(
        self,
        store: Store,
        *,
        clock_ms: Callable[[], int],
        retention_ms: int,
        refresh_ms: int = REFRESH_MS,
    ) -> None:
        super().__init__(clock_ms, refresh_ms)
        self.store = store
        self.retention_ms = retention_ms

    def get(self, max_age_ms: int | None = None) -> PidColumns:
        return self.current(max_age_ms) or PidColumns()

    def _produce(self) -> PidColumns:
        """Read every PID record now."""
        t0 = time.monotonic()
        taken = self.clock_ms()
        ids = self.store.list_pid_ids()

        def records() -> Iterator[PidRecord]:
            for start in range(0, len(ids), READ_CHUNK):
                for record, _ in self.store.get_pids(ids[start : start + READ_CHUNK]):
                    yield record

        cols = build(records(), taken, lambda r: leases.retained(r, taken, self.retention_ms))
        cols.took_s = time.monotonic() - t0
        return cols


class Producers:
    """The operator's view of every PID: the index's page, joined with the leaders' rows,
    as the JSON ``GET /v1/pids`` and the dashboard answer."""

    def __init__(
        self,
        index: PidIndex,
        live: LiveRows,
        *,
        clock_ms: Callable[[], int],
        window_ms: int,
        fresher: Callable[[int], PidRecord | None] | None = None,
    ) -> None:
        self.fresher = fresher
        self.index = index
        self.live = live
        self.clock_ms = clock_ms
        self.window_ms = window_ms

    def query(
        self,
        *,
        states: frozenset[str] = frozenset(STATES),
        text: str = "",
        not_writing: bool = False,
        idle_ms: int = IDLE_MS_DEFAULT,
        offset: int = 0,
        limit: int = 100,
        max_age_ms: int | None = None,
    ) -> dict[str, Any]:
        # Records as fresh as asked (a small cluster rescans in line: a PID leased a
        # moment ago is listed, as before the index); the leaders' rows at most one
        # refresh period old, or as old as asked: each refresh asks every leader.
        cols = self.index.get(max_age_ms)
        live = self.live.get(max(max_age_ms or 0, self.live.refresh_ms))
        now = self.clock_ms()
        pg = page(
            cols,
            live,
            now,
            self.window_ms,
            states=states,
            text=text,
            not_writing=not_writing,
            idle_ms=idle_ms,
            offset=offset,
            limit=limit,
            fresher=self.fresher,
        )
        asked = live is not NOT_YET
        return {
            "count": len(pg.views),
            "matched": pg.matched,
            "total": pg.total,
            "offset": offset,
            "limit": limit,
            "counts": pg.counts,
            "served_ms": now,
            # the leaders' rows: highwaters and last uses
            "as_of_ms": live.taken_ms if asked else None,
            "age_ms": now - live.taken_ms if asked else None,
            # the PID records (names, generations, leases)
            "records_as_of_ms": cols.taken_ms,
            "records_age_ms": now - cols.taken_ms,
            "leaders_unreachable": [
                {"server_id": k, "detail": v} for k, v in sorted(live.unreachable.items())
            ],
            "pids": pg.views,
        }
