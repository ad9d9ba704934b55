"""The leaders' producer-state rows for the operator's view of every PID (issue 29): what
``GET /v1/pids``, the dashboard's "Producers" table and ``pidlease pids`` show as each
partition's highwater and last use.

One refresh asks every live server (``/servers``) for the rows of the partitions it leads,
with PRODUCER_LIST pages (``leaders.py``): one round trip per server and page, never one
per PID. The answer is kept as a snapshot with its time; views say how old it is ("as of
2 s ago"). A refresh runs in the background when a viewer finds the snapshot older than
``refresh_ms``, and never more often than ``BUSY_SHARE_MAX`` of the time (a refresh of a
million rows takes a while: the next waits accordingly), so viewers never wait for the
leaders except for the very first snapshot.

A partition no answering leader reported shows "leader unreachable" (its leader did not
answer, or it has no live leader), never -1. A partition whose leader answered without a
row for the PID shows "no state" with highwater -1: the leader holds nothing of it there
(nothing written, or its state expired).

Writing, seen from outside: a leader's last use of a PID moves on appends and on lease
renewals alike, so it cannot tell a stuck producer from a writing one. A snapshot keeps,
per row, when its durable highwater was last seen to move (``moved_ms``): the time of the
first refresh that saw the new value (so at most one refresh interval late). A row seen
for the first time has no such history; its leader's last use stands in (an upper bound
of its last append).

Memory: five columns of 8 or 4 bytes per row (36 bytes; 36 MB for a million rows), plus
the previous snapshot's during a refresh.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from coordinator.leaders import LeaderClient
from coordinator.store import Store
from pidlease.errors import CoordinatorUnavailable, PidleaseError, describe
from pidlease.wire import protocol
from pidlease.wire.cluster import tp_key

log = logging.getLogger("coordinator.live_rows")

T = TypeVar("T")

REFRESH_MS = 2000
INLINE_MAX_S = 0.25  # a refresh quicker than this runs in the viewer's request
BUSY_SHARE_MAX = 0.2  # a refresh that took d waits at least d / share before the next
FIRST_WAIT_S = 30.0  # how long a viewer waits for a refresh it needs
# Rows per PRODUCER_LIST page: a server answers a page in one pass of its event loop
# (about 0.3 us a row on this machine: 15 ms for 50,000), so smaller pages bound the pause
# its producers see, at one more round trip per 50,000 rows.
ROWS_PER_PAGE = 50_000
PAGES_MAX = 10_000  # per server and refresh: a bound, never reached by a sane cluster

LIVE = "live"
NO_STATE = "no state"
UNREACHABLE = "leader unreachable"
NOT_ASKED = "not asked yet"


@dataclass(slots=True)
class PartitionRows:
    """One partition's rows, columns in PID order."""

    server_id: int
    leader_epoch: int
    pids: array[int]
    generations: array[int]
    highwaters: array[int]
    last_use_ms: array[int]
    moved_ms: array[int] = field(default_factory=lambda: array("q"))

    def find(self, pid: int) -> int:
        i = bisect.bisect_left(self.pids, pid)
        return i if i < len(self.pids) and self.pids[i] == pid else -1


@dataclass(frozen=True, slots=True)
class Cell:
    """One partition of one PID as the view shows it."""

    status: str
    highwater: int | None
    last_use_ms: int | None
    moved_ms: int | None


@dataclass(slots=True)
class Snapshot:
    taken_ms: int  # wall clock when the refresh started: every row is at least this fresh
    took_s: float
    parts: dict[str, PartitionRows]
    unreachable: dict[int, str]  # server id -> why it did not answer

    @property
    def rows(self) -> int:
        return sum(len(p.pids) for p in self.parts.values())

    def cell(self, tp: str, pid: int) -> Cell:
        part = self.parts.get(tp)
        if part is None:
            return Cell(UNREACHABLE, None, None, None)
        i = part.find(pid)
        if i < 0:
            return Cell(NO_STATE, -1, None, None)
        return Cell(LIVE, part.highwaters[i], part.last_use_ms[i], part.moved_ms[i])


NOT_YET = Snapshot(0, 0.0, {}, {})


def carry_moved(new: PartitionRows, old: PartitionRows | None, now_ms: int) -> None:
    """Fill ``new.moved_ms``: a row's time from ``old`` when its highwater did not move
    since, ``now_ms`` when it did, its leader's last use when ``old`` never saw it."""
    if old is None:
        new.moved_ms = array("q", new.last_use_ms)
        return
    if old.pids == new.pids:  # the same producers: the common case, element-wise
        new.moved_ms = array(
            "q",
            (
                m if a == b else now_ms
                for a, b, m in zip(new.highwaters, old.highwaters, old.moved_ms, strict=True)
            ),
        )
        return
    before = {p: (h, m) for p, h, m in zip(old.pids, old.highwaters, old.moved_ms, strict=True)}
    moved = array("q")
    for p, h, lu in zip(new.pids, new.highwaters, new.last_use_ms, strict=True):
        got = before.get(p)
        moved.append(lu if got is None else (got[1] if got[0] == h else now_ms))
    new.moved_ms = moved


class Refreshing(Generic[T]):
    """A value that one refresh at a time replaces, for many viewers. A viewer asks for a
    value at most ``max_age_ms`` old: while refreshes are quick (under ``INLINE_MAX_S``,
    a small cluster) the viewer refreshes in line and sees the truth of now, as before
    there was any cache; once they are slow (a million PIDs) the viewer gets the newest
    value at once with its age, and a refresh starts in the background, never more than
    ``busy_share`` of the time. Only a viewer finding no value at all waits (at most
    ``FIRST_WAIT_S``, then a retriable COORDINATOR_UNAVAILABLE)."""

    busy_share = BUSY_SHARE_MAX

    def __init__(self, clock_ms: Callable[[], int], refresh_ms: int) -> None:
        self.clock_ms = clock_ms
        self.refresh_ms = refresh_ms
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._value: T | None = None
        self._taken_ms = 0
        self._took_s = 0.0
        self._background = False
        self._next_at = 0.0  # monotonic: no background refresh starts before
        self._done = threading.Event()  # set when a background refresh ends
        self._failed: Exception | None = None  # why the last background refresh failed
        self.refreshes = 0
        self.refresh_failures = 0

    def _produce(self) -> T:
        raise NotImplementedError

    def _fresh(self, max_age_ms: int) -> bool:
        """Younger than ``max_age_ms``; with 0, never (the viewer wants a refresh)."""
        return self._value is not None and self.clock_ms() - self._taken_ms < max_age_ms

    def current(
        self, max_age_ms: int | None = None, wait_first_s: float = FIRST_WAIT_S
    ) -> T | None:
        max_age_ms = self.refresh_ms if max_age_ms is None else max_age_ms
        if self._fresh(max_age_ms):
            return self._value
        if self._value is not None and self._took_s < INLINE_MAX_S:
            got = self._refresh_lock.acquire(timeout=wait_first_s)
            try:
                if got and not self._fresh(max_age_ms):
                    self._refresh_logged()  # a failure leaves the old value, with its age
            finally:
                if got:
                    self._refresh_lock.release()
            return self._value
        # Slow, or nothing yet: in the background. Only a viewer with nothing to show
        # waits, and at most ``wait_first_s`` (a first scan of a million records takes
        # minutes: it gets a retriable 503 meanwhile, never a request held for minutes).
        with self._lock:
            start = not self._background and (
                self._value is None or time.monotonic() >= self._next_at
            )
            if start:
                self._background = True
                self._done.clear()
        if start:
            threading.Thread(target=self._in_background, name="refresh", daemon=True).start()
        if self._value is None:
            self._done.wait(wait_first_s)
            if self._value is None:
                if self._failed is not None and not self._background:
                    raise self._failed  # nothing to show: the error (a 503), not []
                raise CoordinatorUnavailable(
                    f"{type(self).__name__}: the first refresh is still running; retry"
                )
        return self._value

    def _in_background(self) -> None:
        try:
            with self._refresh_lock:
                self._failed = self._refresh_logged()
        finally:
            with self._lock:
                self._background = False
            self._done.set()

    def _refresh_logged(self) -> Exception | None:
        try:
            self.refresh_now()
        except Exception as exc:  # noqa: BLE001 - viewers keep the old value; the log says why
            self.refresh_failures += 1
            log.warning("%s: refresh failed: %s", type(self).__name__, describe(exc))
            return exc
        return None

    def refresh_now(self) -> T:
        t0 = time.monotonic()
        taken = self.clock_ms()
        value = self._produce()
        took = time.monotonic() - t0
        with self._lock:
            self._value, self._taken_ms, self._took_s = value, taken, took
            self._next_at = time.monotonic() + took / self.busy_share
        self.refreshes += 1
        return value

    def peek(self) -> T | None:
        return self._value


class LiveRows(Refreshing[Snapshot]):
    def __init__(
        self,
        store: Store,
        leaders: LeaderClient,
        *,
        clock_ms: Callable[[], int],
        refresh_ms: int = REFRESH_MS,
        rows_per_page: int = ROWS_PER_PAGE,
        parallelism: int = 8,
    ) -> None:
        super().__init__(clock_ms, refresh_ms)
        self.store = store
        self.leaders = leaders
        self.rows_per_page = rows_per_page
        self._pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="live-rows")

    def get(self, max_age_ms: int | None = None) -> Snapshot:
        return self.current(max_age_ms) or NOT_YET

    def _produce(self) -> Snapshot:
        """Ask every live server for its rows now."""
        t0 = time.monotonic()
        taken = self.clock_ms()
        servers = self.store.live_servers()
        futures = [(s.id, self._pool.submit(self._rows_of, s.address)) for s in servers]
        parts: dict[str, PartitionRows] = {}
        unreachable: dict[int, str] = {}
        for server_id, fut in futures:
            try:
                got = fut.result()
            except PidleaseError as exc:
                unreachable[server_id] = exc.detail
                continue
            for tp, rows in got.items():
                rows.server_id = server_id
                old = parts.get(tp)
                # Two servers claiming one partition (a failover in progress): the newer
                # leader epoch's rows.
                if old is None or rows.leader_epoch > old.leader_epoch:
                    parts[tp] = rows
        previous = self.peek()
        for tp, rows in parts.items():
            carry_moved(rows, None if previous is None else previous.parts.get(tp), taken)
        return Snapshot(taken, time.monotonic() - t0, parts, unreachable)

    def _rows_of(self, address: str) -> dict[str, PartitionRows]:
        """Every page of one server's rows: partition -> columns."""
        out: dict[str, PartitionRows] = {}
        after: tuple[str, int, int] = ("", -1, -1)
        for _ in range(PAGES_MAX):
            resp = self.leaders.producer_list(address, self.rows_per_page, after)
            if resp.error_code != 0:
                raise CoordinatorUnavailable(
                    f"server {address} refused PRODUCER_LIST: {resp.detail}"
                )
            for r in resp.rows or ():
                tp = tp_key(r.topic, r.partition)
                have = out.get(tp)
                if have is None:
                    out[tp] = PartitionRows(
                        -1,
                        r.leader_epoch,
                        r.pids,
                        r.generations,
                        r.durable_highwaters,
                        r.last_use_ms,
                    )
                else:  # the rest of a partition a page boundary split
                    have.pids.extend(r.pids)
                    have.generations.extend(r.generations)
                    have.highwaters.extend(r.durable_highwaters)
                    have.last_use_ms.extend(r.last_use_ms)
                if len(r.pids):
                    after = (r.topic, r.partition, r.pids[-1])
                else:
                    after = (r.topic, r.partition, protocol.MAX_PID)
            if not resp.existed:
                return out
        raise CoordinatorUnavailable(
            f"server {address} answered more than {PAGES_MAX} pages of rows"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


IDLE_MS_DEFAULT = 60_000  # "leased but not writing": no highwater moved for this long


def annotate(view: dict[str, Any], snap: Snapshot, now_ms: int, idle_ms: int) -> dict[str, Any]:
    """A PID view (``LeaseService.pid_view``) with its partitions' live cells from ``snap``
    and the writing figures: ``last_append_ms`` (newest highwater move seen on any of its
    partitions, None: none seen), ``append_lag_ms`` (its lease's last renewal minus that:
    how far the producer's writes trail its renewals), ``writing`` (a move within
    ``idle_ms``). Changes ``view`` in place and returns it."""
    pid = view["pid"]
    asked = snap is not NOT_YET
    last = None
    for entry in view["partitions"]:
        if not asked:
            cell = Cell(NOT_ASKED, None, None, None)
        else:
            cell = snap.cell(tp_key(entry["topic"], entry["partition"]), pid)
        entry["status"] = cell.status
        entry["highwater"] = cell.highwater
        entry["last_use_ms"] = cell.last_use_ms
        entry["last_append_ms"] = cell.moved_ms
        if cell.moved_ms is not None and (last is None or cell.moved_ms > last):
            last = cell.moved_ms
    view["last_append_ms"] = last
    view["append_lag_ms"] = None if last is None else max(0, view["last_use_ms"] - last)
    view["writing"] = last is not None and now_ms - last <= idle_ms
    return view


def not_writing(view: dict[str, Any]) -> bool:
    """The filter "leased but not writing": a lease still running whose partitions saw no
    highwater move within the idle time (``annotate``'s ``writing``)."""
    return view["state"] != "lapsed" and not view["writing"]
