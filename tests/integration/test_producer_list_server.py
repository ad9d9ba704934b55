"""PRODUCER_LIST (issue 29) against a real partition server over a real socket: pages of
a few rows walk every row of every partition the server leads, each once, with the
durable highwaters the appends left; listing refreshes no PID's last use (PRODUCER_STATE
does, which is why the PID view does not use it); a page size out of bounds is refused."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire import protocol as P

ENV = {"PIDLEASE_FSYNC_INTERVAL_MS": "1"}


@pytest.fixture
def server(make_cluster):  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    return cluster.servers[0]


def list_all(c: WireClient, rows_max: int) -> tuple[dict[tuple[str, int, int], Any], int]:
    """Every row by (topic, partition, pid), and how many pages it took."""
    rows: dict[tuple[str, int, int], Any] = {}
    after: tuple[str, int, int] = ("", -1, -1)
    for pages in range(1, 100):
        corr = c.next_corr()
        c.send(P.PRODUCER_LIST, P.producer_list_request(corr, rows_max, after), corr)
        r = c.recv(P.PRODUCER_LIST)
        assert r.error_code == 0, r.detail
        for part in r.rows or ():
            for i, pid in enumerate(part.pids):
                key = (part.topic, part.partition, pid)
                assert key not in rows, f"{key} listed twice"
                rows[key] = (part.durable_highwaters[i], part.last_use_ms[i], part.tracked)
            last = part.pids[-1] if len(part.pids) else P.MAX_PID
            after = (part.topic, part.partition, last)
        if not r.existed:
            return rows, pages
    raise AssertionError("more than 99 pages")


def test_pages_walk_every_row_once_and_listing_touches_nothing(server, zk_hosts) -> None:  # type: ignore[no-untyped-def]
    create_topic(zk_hosts, "pl", 3)
    want = {}
    with WireClient(server.address) as c:
        for pid in range(1, 8):
            tok = token(DEV_SECRET, pid, 1)
            for part in range(3):
                n = (pid + part) % 4  # 0..3 records; 0: no state there
                if n:
                    r = c.produce("pl", part, batch(pid, 1, 0, [b"x"] * n), tok)
                    assert r.error_code == 0, r.detail
                    want[("pl", part, pid)] = n - 1
        time.sleep(0.2)  # durable (fsync every 1 ms)
        rows, pages = list_all(c, rows_max=4)
        assert {k: v[0] for k, v in rows.items()} == want
        assert pages >= len(want) // 4
        assert {v[2] for k, v in rows.items() if k[1] == 0} == {sum(1 for k in want if k[1] == 0)}
        one, _ = list_all(c, rows_max=P.PRODUCER_LIST_ROWS_MAX)
        assert one == rows

        time.sleep(0.05)
        again, _ = list_all(c, rows_max=4)
        assert {k: v[1] for k, v in again.items()} == {k: v[1] for k, v in rows.items()}
        touched = c.producer_state("pl", 1, 1)  # PRODUCER_STATE moves the last use
        assert touched.found and touched.last_use_ms > rows[("pl", 1, 1)][1]

        corr = c.next_corr()
        rows_max_0 = struct.pack(">I", 0) + P.pack_str("") + struct.pack(">iq", -1, -1)
        c.send(P.PRODUCER_LIST, P.request(P.PRODUCER_LIST, corr, rows_max_0), corr)
        bad = c.recv(P.PRODUCER_LIST)
        assert bad.error_code == errors.CorruptRecord.code and "rows_max" in bad.detail
