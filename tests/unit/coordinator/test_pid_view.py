"""The operator's view of every PID (issue 29), its pure parts: PRODUCER_LIST on the wire
and its pages over real producer-state tables, the leaders' rows assembled and joined
with the PID records, the writing figures, and the index's pages, counts and timeline
checked against the dashboard's whole-list rules (``dashboard.order_rows``,
``dashboard.timeline``, ``leases.lease_state``) as the reference model."""

from __future__ import annotations

import random
import time
from array import array
from typing import Any

import pytest

from coordinator import dashboard as D
from coordinator import leases
from coordinator.live_rows import (
    LIVE,
    NO_STATE,
    NOT_ASKED,
    NOT_YET,
    UNREACHABLE,
    LiveRows,
    PartitionRows,
    Refreshing,
    Snapshot,
    annotate,
    carry_moved,
    not_writing,
)
from coordinator.pid_index import STATES, build, page
from partition_server.log_manager import producer_list_pages
from partition_server.producer_state import ProducerStateTable
from pidlease.errors import CoordinatorUnavailable, CorruptRecord
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PidRecord
from tests.helpers import wait_for

NOW = 1_800_000_000_000
WINDOW = 30_000


def table_with(rows: dict[int, tuple[int, int, int]]) -> ProducerStateTable:
    """A table holding pid -> (generation, highwater, last use)."""
    t = ProducerStateTable()
    t.load_rows(
        (pid, gen, hw, lu, array("q", (max(0, hw), hw, 10 * pid)))
        for pid, (gen, hw, lu) in rows.items()
    )
    return t


# -- the wire ------------------------------------------------------------------------------
def test_producer_list_request_and_answer_round_trip() -> None:
    req = P.decode_request(P.producer_list_request(7, 500, ("orders", 3, 42))[4:])
    assert (req.api_key, req.correlation_id, req.max_bytes) == (P.PRODUCER_LIST, 7, 500)
    assert (req.topic, req.partition, req.pid) == ("orders", 3, 42)
    part = P.producer_list_part("o", 1, 5, 9, ([1, 2**63 - 1], [0, 2**31 - 1], [-1, 8], [3, 4]))
    body = P.producer_list_response(7, 0, "", [part], more=True)[4:]
    r = P.decode_response(P.PRODUCER_LIST, body)
    assert r.existed is True and r.rows is not None and len(r.rows) == 1
    got = r.rows[0]
    assert (got.topic, got.partition, got.leader_epoch, got.tracked) == ("o", 1, 5, 9)
    assert list(got.pids) == [1, 2**63 - 1] and list(got.generations) == [0, 2**31 - 1]
    assert list(got.durable_highwaters) == [-1, 8] and list(got.last_use_ms) == [3, 4]
    err = P.decode_response(P.PRODUCER_LIST, P.response(7, 22, "down", b"")[4:])
    assert err.error_code == 22 and err.rows == []


@pytest.mark.parametrize("rows_max", [0, P.PRODUCER_LIST_ROWS_MAX + 1])
def test_producer_list_refuses_a_page_size_out_of_bounds(rows_max: int) -> None:
    with pytest.raises(CorruptRecord, match="rows_max"):
        P.decode_request(P.producer_list_request(1, rows_max)[4:])


def test_producer_list_answer_that_claims_more_rows_than_it_carries_is_corrupt() -> None:
    part = P.producer_list_part("o", 1, 5, 9, ([1, 2], [0, 0], [1, 1], [3, 4]))
    body = P.producer_list_response(7, 0, "", [part])[4:]
    with pytest.raises(CorruptRecord):
        P.decode_response(P.PRODUCER_LIST, body[:-3])


def test_rows_after_is_sorted_paged_and_read_only() -> None:
    t = table_with({p: (1, p, 1000 + p) for p in (9, 3, 7, 1)})
    order_before = t.pids()
    lu_before = [t.get(p).last_use_ms for p in order_before]  # type: ignore[union-attr]
    pids, gens, hws, lus = t.rows_after(-1, 3)
    assert pids == [1, 3, 7] and gens == [1, 1, 1] and hws == [1, 3, 7]
    assert lus == [1001, 1003, 1007]
    assert t.rows_after(7, 10)[0] == [9] and t.rows_after(9, 10)[0] == []
    assert t.pids() == order_before  # the LRU order did not move
    assert [t.get(p).last_use_ms for p in order_before] == lu_before  # type: ignore[union-attr]


# -- pages over real tables, assembled by LiveRows ------------------------------------------
class TableLeaders:
    """A leader client whose servers answer PRODUCER_LIST from real tables through the
    real encoder and decoder (``producer_list_pages``, ``decode_response``); no sockets."""

    def __init__(self, servers: dict[str, list[tuple[tuple[str, int], int, Any]]]) -> None:
        self.servers = servers
        self.pages = 0

    def producer_list(self, address: str, rows_max: int, after: tuple[str, int, int]) -> P.Response:
        if address not in self.servers:
            raise CoordinatorUnavailable(f"partition leader {address} unreachable")
        self.pages += 1
        parts, more = producer_list_pages(self.servers[address], rows_max, after)
        return P.decode_response(
            P.PRODUCER_LIST, P.producer_list_response(1, 0, "", parts, more)[4:]
        )


class Server:
    def __init__(self, server_id: int, address: str) -> None:
        self.id, self.address = server_id, address


class FakeStore:
    def __init__(self, servers: list[Server]) -> None:
        self.servers = servers

    def live_servers(self) -> list[Server]:
        return self.servers


def test_live_rows_pages_split_partitions_and_keep_every_row_once() -> None:
    rng = random.Random(29)
    tables = {
        ("t", p): table_with({rng.randrange(1, 10**6): (1, p, 5) for _ in range(7)})
        for p in range(5)
    }
    tables[("t", 5)] = table_with({})
    led = [(k, 3, tables[k]) for k in sorted(tables)]
    leaders = TableLeaders({"a:1": led[:4], "b:1": led[4:]})
    clock = [NOW]
    live = LiveRows(
        FakeStore([Server(1, "a:1"), Server(2, "b:1"), Server(3, "gone:1")]),  # type: ignore[arg-type]
        leaders,  # type: ignore[arg-type]
        clock_ms=lambda: clock[0],
        rows_per_page=3,
    )
    snap = live.get()
    assert leaders.pages >= 35 // 3  # pages of 3 rows, partitions split between them
    assert set(snap.unreachable) == {3}
    for (topic, p), t in tables.items():
        rows = snap.parts[f"{topic}/{p}"]
        assert list(rows.pids) == sorted(t.pids())
        assert list(rows.highwaters) == [p] * len(t)
        assert list(rows.moved_ms) == [5] * len(t)  # first seen: the leader's last use
    live.close()


def test_carry_moved_keeps_the_time_of_the_last_highwater_move() -> None:
    def rows(pids: list[int], hws: list[int], lus: list[int]) -> PartitionRows:
        return PartitionRows(
            1, 1, array("Q", pids), array("I", [0] * len(pids)), array("q", hws), array("q", lus)
        )

    old = rows([1, 2], [5, 6], [100, 100])
    carry_moved(old, None, 1000)
    assert list(old.moved_ms) == [100, 100]
    same = rows([1, 2], [5, 7], [2000, 2000])  # 2 wrote, 1 only renewed
    carry_moved(same, old, 2000)
    assert list(same.moved_ms) == [100, 2000]
    other = rows([1, 3], [5, 1], [3000, 2500])  # 2 gone, 3 new
    carry_moved(other, same, 3000)
    assert list(other.moved_ms) == [100, 2500]


def test_cells_and_the_writing_figures() -> None:
    part = PartitionRows(
        1, 1, array("Q", [4]), array("I", [2]), array("q", [832]), array("q", [NOW - 5])
    )
    part.moved_ms = array("q", [NOW - 90_000])
    snap = Snapshot(NOW - 1000, 0.1, {"o/0": part}, {2: "down"})
    assert snap.cell("o/0", 4).status == LIVE and snap.cell("o/0", 4).highwater == 832
    assert snap.cell("o/0", 5).status == NO_STATE and snap.cell("o/0", 5).highwater == -1
    assert snap.cell("o/1", 4).status == UNREACHABLE and snap.cell("o/1", 4).highwater is None

    def v() -> dict[str, Any]:
        return {
            "pid": 4,
            "state": "active",
            "last_use_ms": NOW - 2000,
            "partitions": [{"topic": "o", "partition": 0}, {"topic": "o", "partition": 1}],
        }

    got = annotate(v(), snap, NOW, idle_ms=60_000)
    assert [x["status"] for x in got["partitions"]] == [LIVE, UNREACHABLE]
    assert got["last_append_ms"] == NOW - 90_000 and got["append_lag_ms"] == 88_000
    assert got["writing"] is False and not_writing(got)
    assert annotate(v(), snap, NOW, idle_ms=100_000)["writing"] is True
    lapsed = annotate({**v(), "state": "lapsed"}, snap, NOW, idle_ms=60_000)
    assert not not_writing(lapsed)  # a lapsed lease is not "leased"
    asked = annotate(v(), NOT_YET, NOW, idle_ms=60_000)
    assert {x["status"] for x in asked["partitions"]} == {NOT_ASKED}


# -- the index against the whole-list rules -------------------------------------------------
def records(n: int, seed: int) -> list[PidRecord]:
    rng = random.Random(seed)
    out = []
    for pid in range(1, n + 1):
        expire = rng.choice([10_000, 60_000, 3_600_000])
        out.append(
            PidRecord(
                pid=pid,
                generation=rng.randrange(3),
                producer_name=rng.choice([None, f"name-{pid % 13}"]),
                expire_ms=expire,
                expires_at_ms=NOW + rng.randrange(-200_000, 400_000),
                last_use_ms=NOW - rng.randrange(100_000),
                created_ms=NOW - 500_000,
                partitions={f"t{pid % 3}/{pid % 5}": {"seen": bool(pid % 2)}},
            )
        )
    return out


def reference_view(r: PidRecord) -> dict[str, Any]:
    return {
        "pid": r.pid,
        "expires_in_ms": r.expires_at_ms - NOW,
        "state": leases.lease_state(r, NOW, WINDOW).value,
    }


@pytest.mark.parametrize("seed", range(5))
def test_pages_counts_and_timeline_match_the_whole_list_rules(seed: int) -> None:
    recs = records(300, seed)
    cols = build(reversed(recs), NOW - 10, lambda r: True)
    views = [reference_view(r) for r in recs]
    want = [v["pid"] for v in D.order_rows(views, len(views))]
    got: list[int] = []
    for offset in range(0, 300, 70):
        got += [v["pid"] for v in page(cols, NOT_YET, NOW, WINDOW, offset=offset, limit=70).views]
    assert got == want
    counts = {s: sum(1 for v in views if v["state"] == s) for s in STATES}
    assert cols.counts(NOW, WINDOW) == counts
    assert cols.timeline(NOW, 300_000, 30) == D.timeline(views, 300_000, 30)
    for states in ({"active"}, {"expiring"}, {"lapsed"}, {"active", "lapsed"}):
        pg = page(cols, NOT_YET, NOW, WINDOW, states=frozenset(states), limit=1000)
        assert [v["pid"] for v in pg.views] == [
            v["pid"] for v in D.order_rows(views, 1000) if v["state"] in states
        ]
        assert pg.matched == len(pg.views)
    by_name = page(cols, NOT_YET, NOW, WINDOW, text="NAME-4", limit=5, offset=2)
    named = [
        v["pid"] for v in D.order_rows(views, 1000) if recs[v["pid"] - 1].producer_name == "name-4"
    ]
    assert [v["pid"] for v in by_name.views] == named[2:7] and by_name.matched == len(named)
    first = page(cols, NOT_YET, NOW, WINDOW, limit=1).views[0]
    r = recs[first["pid"] - 1]
    assert first["producer_name"] == r.producer_name and first["generation"] == r.generation
    assert [(x["topic"], x["partition"], x["seen"]) for x in first["partitions"]] == [
        (f"t{r.pid % 3}", r.pid % 5, bool(r.pid % 2))
    ]


def test_the_not_writing_filter_joins_the_leaders_rows() -> None:
    recs = [
        PidRecord(
            pid=p,
            generation=0,
            expire_ms=60_000,
            expires_at_ms=NOW + 50_000,
            last_use_ms=NOW,
            partitions={"o/0": {}},
        )
        for p in (1, 2, 3)
    ] + [
        PidRecord(
            pid=4, generation=0, expire_ms=60_000, expires_at_ms=NOW - 1, partitions={"o/0": {}}
        )
    ]
    cols = build(recs, NOW, lambda r: True)
    part = PartitionRows(
        1,
        1,
        array("Q", [1, 2, 4]),
        array("I", [0] * 3),
        array("q", [9, 9, 9]),
        array("q", [NOW] * 3),
    )
    part.moved_ms = array("q", [NOW - 1000, NOW - 120_000, NOW - 120_000])
    snap = Snapshot(NOW, 0.0, {"o/0": part}, {})
    pg = page(cols, snap, NOW, WINDOW, not_writing=True, idle_ms=60_000)
    # 1 wrote a second ago; 2 stopped two minutes ago; 3 never wrote; 4 has lapsed
    assert sorted(v["pid"] for v in pg.views) == [2, 3] and pg.matched == 2
    assert {v["pid"]: v["append_lag_ms"] for v in pg.views} == {2: 120_000, 3: None}


def test_a_lease_renewed_since_the_scan_shows_from_the_fresher_record() -> None:
    old = PidRecord(
        pid=1, generation=3, expire_ms=60_000, expires_at_ms=NOW - 5, last_use_ms=NOW - 60_005
    )
    cols = build([old], NOW - 120_000, lambda r: True)  # a scan two minutes old
    renewed = PidRecord(
        pid=1, generation=3, expire_ms=60_000, expires_at_ms=NOW + 50_000, last_use_ms=NOW - 10_000
    )
    stale = page(cols, NOT_YET, NOW, WINDOW).views[0]
    assert stale["state"] == "lapsed"
    fresh = page(cols, NOT_YET, NOW, WINDOW, fresher={1: renewed}.get).views[0]
    assert fresh["state"] == "active" and fresh["expires_in_ms"] == 50_000
    assert fresh["last_use_ms"] == NOW - 10_000
    older = PidRecord(
        pid=1, generation=2, expire_ms=60_000, expires_at_ms=NOW + 1, last_use_ms=NOW - 90_000
    )
    assert page(cols, NOT_YET, NOW, WINDOW, fresher={1: older}.get).views[0]["generation"] == 3


class Counter(Refreshing[int]):
    """A value that counts its refreshes, each taking ``delay_s``."""

    def __init__(self, clock: list[int], delay_s: float) -> None:
        super().__init__(lambda: clock[0], refresh_ms=1000)
        self.delay_s = delay_s
        self.made = 0

    def _produce(self) -> int:
        time.sleep(self.delay_s)
        self.made += 1
        return self.made


def test_quick_refreshes_run_in_the_viewers_request() -> None:
    clock = [NOW]
    c = Counter(clock, 0.0)
    assert c.current(0) == 1  # the first waits for its value
    assert c.current(0) == 2 and c.current(0) == 3  # max age 0: each call refreshes in line
    assert c.current(5000) == 3  # young enough: cached


def test_a_slow_refresh_never_holds_a_viewer() -> None:
    clock = [NOW]
    c = Counter(clock, 0.3)
    with pytest.raises(CoordinatorUnavailable, match="still running"):
        c.current(0, wait_first_s=0.05)  # nothing yet: a retriable error, not a long wait
    wait_for(lambda: c.peek() == 1, 5, "the first refresh")
    clock[0] += 5000
    started = time.monotonic()
    assert c.current(0) == 1  # stale but at once; a refresh starts behind it
    assert time.monotonic() - started < 0.2
    # the next background refresh waits out the busy share (0.3 s / 0.2 after the first)
    wait_for(lambda: c.current(0) == 2, 5, "the background refresh")


def test_a_first_refresh_that_fails_is_the_viewers_error() -> None:
    class Broken(Refreshing[int]):
        def _produce(self) -> int:
            raise CoordinatorUnavailable("ZooKeeper is not connected; retry")

    with pytest.raises(CoordinatorUnavailable, match="not connected"):
        Broken(lambda: NOW, 1000).current(0)


@pytest.mark.parametrize("text", ["name-4", "1", "t2/", "/3", "NAME", "zz", "5 t", "e-1"])
def test_the_text_search_finds_what_the_row_rule_finds(text: str) -> None:
    recs = records(500, 3)
    for r in recs[::7]:
        r.partitions["t9/9"] = {}  # some PIDs on two partitions
    cols = build(recs, NOW, lambda r: True)
    want = [i for i in range(len(cols)) if cols.matches_text(i, text.lower())]
    assert cols.text_rows(text.lower()) == want
