"""The operator's view of every PID at a million PIDs (issue 29): what one refresh costs
the leaders and the coordinator, what the coordinator keeps, and how long a page takes.

    .venv/bin/python -m bench.bench_pid_view [--pids 1000000] [--partitions 1000]
        [--servers 3] [--zk 20000]

What it measures, honestly:

- **Leaders' CPU per refresh**: the real producer-state tables (``ProducerStateTable``,
  filled with ``load_rows`` as a recovery would: PID p on partition p % partitions) and
  the real PRODUCER_LIST code (``broker.producer_list_pages`` and the answer's encoder),
  run in this process with ``time.process_time``; no socket, no event loop around it.
- **Coordinator, leaders' rows**: ``LiveRows`` assembling a snapshot from the encoded
  answers (decoder and all), the answers pre-encoded so their cost is not counted here;
  the snapshot's memory (every object it holds, counted once: ``deep_size``); a second
  refresh (the moved-highwater join; odd PIDs wrote since, even ones did not for 100 s).
- **Coordinator, PID records**: the index built from ``--pids`` synthetic records
  streamed through ``pid_index.build`` (made on the fly; not read from ZooKeeper:
  registering a million PIDs through the lease API takes about 15 minutes of ZooKeeper
  writes alone here, next to five other jobs), its memory, and the time of
  pages: the default first page, a page deep in, a state filter, a text filter (first
  with building its search string, then again) and the "not writing" filter (first with
  the join, then cached).
- **ZooKeeper scan rate** (``--zk N``): a real ZooKeeper filled with N records by async
  creates, then ``PidIndex``'s scan of them timed: records per second, from which the
  scan of a million is extrapolated (said so in the output).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from array import array
from typing import Any

from coordinator.live_rows import LiveRows
from coordinator.pid_index import build, page
from partition_server.log_manager import producer_list_pages
from partition_server.producer_state import ProducerStateTable
from pidlease.wire import protocol as P
from pidlease.wire.cluster import PidRecord

NOW = 1_800_000_000_000
WINDOW = 30_000


class _Server:
    def __init__(self, server_id: int, address: str) -> None:
        self.id, self.address = server_id, address


class _Store:
    def __init__(self, servers: list[_Server]) -> None:
        self.servers = servers

    def live_servers(self) -> list[_Server]:
        return self.servers


class _Answers:
    """A leader client answering from pre-encoded PRODUCER_LIST pages."""

    def __init__(self, pages: dict[str, list[bytes]]) -> None:
        self.pages = pages
        self.at: dict[str, int] = {}

    def producer_list(self, address: str, rows_max: int, after: tuple[str, int, int]) -> Any:
        i = 0 if after == ("", -1, -1) else self.at[address] + 1
        self.at[address] = i
        return P.decode_response(P.PRODUCER_LIST, self.pages[address][i][4:])


def fill_tables(pids: int, partitions: int, moved: int = 0) -> dict[tuple[str, int], Any]:
    rows: list[list[Any]] = [[] for _ in range(partitions)]
    for pid in range(1, pids + 1):
        hw = 10 + (pid % 1000) + moved * (pid % 2)  # ``moved``: odd PIDs wrote
        lu = NOW - 100_000 - pid % 60_000  # even PIDs: no append for over 100 s
        rows[pid % partitions].append((pid, 0, hw, lu, array("q", (hw, hw, pid))))
    tables = {}
    for p in range(partitions):
        t = ProducerStateTable(pids_max=pids + 1)
        t.load_rows(rows[p])
        tables[("bench", p)] = t
    return tables


def leader_pages(
    tables: dict[tuple[str, int], Any], servers: int
) -> tuple[dict[str, list[bytes]], list[float]]:
    """Every server's answers to one refresh, and each server's CPU seconds for them."""
    pages: dict[str, list[bytes]] = {}
    cpu = []
    keys = sorted(tables)
    for s in range(servers):
        led = [(k, 1, tables[k]) for k in keys[s::servers]]
        address = f"server-{s}:1"
        out = []
        after: tuple[str, int, int] = ("", -1, -1)
        t0 = time.process_time()
        while True:
            parts, more = producer_list_pages(led, P.PRODUCER_LIST_ROWS_MAX, after)
            out.append(P.producer_list_response(1, 0, "", parts, more))
            if not more:
                break
            last = P.decode_response(P.PRODUCER_LIST, out[-1][4:]).rows
            assert last
            after = (
                last[-1].topic,
                last[-1].partition,
                last[-1].pids[-1] if last[-1].pids else P.MAX_PID,
            )
        cpu.append(time.process_time() - t0)
        pages[address] = out
    return pages, cpu


def synthetic_records(n: int, partitions: int, seed: int = 29) -> Any:
    rng = random.Random(seed)
    for pid in range(1, n + 1):
        yield PidRecord(
            pid=pid,
            generation=0,
            producer_name=f"producer-{pid}",
            expire_ms=60_000,
            expires_at_ms=NOW + rng.randrange(-100_000, 60_000),
            last_use_ms=NOW - rng.randrange(30_000),
            created_ms=NOW - 3_600_000,
            partitions={f"bench/{pid % partitions}": {"seen": True}},
        )


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of ``obj`` and everything it holds (arrays, lists, dicts, strings, dataclass
    slots), each object once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(deep_size(getattr(obj, a), seen) for a in obj.__slots__ if hasattr(obj, a))
    return size


CPU: dict[str, float] = {}


def timed(f: Any) -> tuple[float, Any]:
    """(wall seconds, result); the call's CPU seconds (this process) in ``CPU["last"]``."""
    c0, t0 = time.process_time(), time.perf_counter()
    got = f()
    CPU["last"] = time.process_time() - c0
    return time.perf_counter() - t0, got


def zk_scan(n: int) -> dict[str, Any]:
    from kazoo.client import KazooClient

    from coordinator.pid_index import PidIndex
    from coordinator.store import Store
    from pidlease.testing.zkserver import ZooKeeperCluster
    from pidlease.wire import cluster

    zk = ZooKeeperCluster(tempfile.mkdtemp(prefix="bench-pid-view-")).start()
    try:
        kz = KazooClient(hosts=zk.hosts)
        kz.start()
        kz.ensure_path("/bench" + cluster.PIDS)
        t0 = time.perf_counter()
        pending = []
        for r in synthetic_records(n, 1000):
            pending.append(kz.create_async(f"/bench{cluster.pid_path(r.pid)}", r.to_bytes()))
            if len(pending) >= 1000:
                for x in pending:
                    x.get()
                pending = []
        for x in pending:
            x.get()
        fill_s = time.perf_counter() - t0
        kz.stop()
        store = Store(f"{zk.hosts}/bench", request_timeout_ms=30_000, session_timeout_ms=30_000)
        store.start()
        deadline = time.monotonic() + 30
        while not store.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        store.ensure_layout()
        index = PidIndex(store, clock_ms=lambda: NOW, retention_ms=10**12)
        scan_s, cols = timed(index.refresh_now)
        store.stop()
    finally:
        zk.stop()
    return {
        "zk_records": n,
        "zk_fill_s": round(fill_s, 1),
        "zk_scan_s": round(scan_s, 2),
        "zk_scan_records_per_s": round(len(cols) / scan_s),
        "zk_scan_of_1M_s_extrapolated": round(1_000_000 / (len(cols) / scan_s)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pids", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--zk", type=int, default=0, help="also time a real ZooKeeper scan of N")
    args = ap.parse_args()
    out: dict[str, Any] = {"pids": args.pids, "partitions": args.partitions}

    tables = fill_tables(args.pids, args.partitions)
    pages, cpu = leader_pages(tables, args.servers)
    out["leader_cpu_s_per_refresh"] = [round(c, 3) for c in cpu]
    out["answer_bytes_per_refresh"] = sum(len(b) for v in pages.values() for b in v)
    out["answer_pages_per_refresh"] = sum(len(v) for v in pages.values())
    moved_pages, _ = leader_pages(fill_tables(args.pids, args.partitions, moved=1), args.servers)
    del tables
    gc.collect()

    servers = [_Server(s, f"server-{s}:1") for s in range(args.servers)]
    clock = [NOW]
    live = LiveRows(_Store(servers), _Answers(pages), clock_ms=lambda: clock[0])  # type: ignore[arg-type]
    cpu0 = time.process_time()
    took, snap = timed(live.refresh_now)
    out["coordinator_rows_refresh_s"] = round(took, 2)
    out["coordinator_rows_refresh_cpu_s"] = round(time.process_time() - cpu0, 2)
    out["coordinator_rows_bytes"] = deep_size(snap)
    out["rows"] = snap.rows
    live.leaders = _Answers(moved_pages)  # type: ignore[assignment]
    clock[0] += 2000
    took, snap = timed(live.refresh_now)
    out["coordinator_rows_second_refresh_s"] = round(took, 2)
    del pages, moved_pages
    gc.collect()

    cpu0 = time.process_time()
    took, cols = timed(
        lambda: build(synthetic_records(args.pids, args.partitions), NOW, lambda r: True)
    )
    out["index_build_s_incl_making_records"] = round(took, 2)
    out["index_build_cpu_s"] = round(time.process_time() - cpu0, 2)
    out["index_bytes"] = deep_size(cols)

    def pg(**kw: Any) -> Any:
        return page(cols, snap, NOW, WINDOW, **kw)

    for name, kw in (
        ("first_page", {"limit": 100}),
        ("page_at_500k", {"offset": 500_000, "limit": 100}),
        ("expiring_only", {"states": frozenset({"expiring"}), "limit": 100}),
        ("text_filter_first", {"text": "producer-77777", "limit": 100}),
        ("text_filter_again", {"text": "producer-12345", "limit": 100}),
        ("not_writing_first", {"not_writing": True, "limit": 100}),
        ("not_writing_cached", {"not_writing": True, "limit": 100}),
    ):
        took, got = timed(lambda kw=kw: pg(**kw))
        out[f"{name}_s"] = round(took, 3)
        out[f"{name}_cpu_s"] = round(CPU["last"], 3)
        out[f"{name}_matched"] = got.matched
    if args.zk:
        out.update(zk_scan(args.zk))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
