"""The partition servers as the dashboard sees them: for every live server (``/servers`` in
ZooKeeper) its METADATA answer, asked in parallel with the leader-call deadline, boiled
down to what an operator watches: partitions led and followed, tracked PIDs and their
estimated memory, resident memory, snapshot age, fenced appends and duplicates, and the
log (start, end, high watermark, size) of each partition it leads. The
servers' own event feeds are merged into the coordinator's ``EventLog`` on the way.

A server that does not answer is listed as unreachable with the reason, never dropped:
"registered but silent" is exactly what an operator needs to see. Servers from before the
metrics wiring answer METADATA without ``ops``; their figures show as unknown (None).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from coordinator.events import EventLog
from coordinator.leaders import LeaderClient
from coordinator.store import Store
from coordinator.topics import log_from_metadata
from pidlease import errors
from pidlease.errors import PidleaseError

log = logging.getLogger("coordinator.fleet")

SERVERS_MAX = 1000  # one page of servers; a bigger fleet shows the first ones
TOP_PARTITIONS = 5  # partitions listed per server, by tracked PIDs
LOGS_MAX = 1000  # partition logs listed per server (the dashboard caps the total again)
# Figures copied from a server's ``ops`` summary (partition_server/metrics.py).
_FIGURES = (
    "fenced_appends",
    "duplicates",
    "out_of_order",
    "unknown_pid",
    "sequence_unknown",
    "appended_batches",
    "fences",
    "producer_state_bytes",
    "snapshot_age_seconds",
)


class Fleet:
    def __init__(
        self,
        store: Store,
        leaders: LeaderClient,
        events: EventLog,
        *,
        timeout_ms: int,
        parallelism: int = 8,
    ) -> None:
        self.store = store
        self.leaders = leaders
        self.events = events
        self._timeout_s = timeout_ms / 1000
        self._pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="fleet")
        self.scrape_failures = 0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def survey(self) -> list[dict[str, Any]]:
        """One row per live server, by id. Raises CoordinatorUnavailable only when
        ZooKeeper cannot list the servers."""
        servers = self.store.live_servers()[:SERVERS_MAX]
        futures = {s.id: self._pool.submit(self.leaders.metadata, s.address) for s in servers}
        rows = []
        for s in servers:
            row: dict[str, Any] = {
                "id": s.id,
                "address": s.address,
                "started_ms": s.started_ms,
                "reachable": False,
                "error": "",
            }
            try:
                resp = futures[s.id].result(timeout=self._timeout_s * 2)
                if resp.error_code != errors.NONE:
                    raise PidleaseError(
                        f"METADATA answered {errors.error_for_code(resp.error_code).name}"
                    )
                row.update(self._describe(resp.info or {}))
                row["reachable"] = True
            except (PidleaseError, FutureTimeout) as exc:
                self.scrape_failures += 1
                row["error"] = getattr(exc, "detail", "") or "no answer in time"
            rows.append(row)
        return rows

    def _describe(self, info: dict[str, Any]) -> dict[str, Any]:
        parts = info.get("partitions") or []
        roles: dict[str, int] = {}
        for p in parts:
            roles[p.get("role", "none")] = roles.get(p.get("role", "none"), 0) + 1
        top = sorted(parts, key=lambda p: p.get("tracked_pids", 0), reverse=True)[:TOP_PARTITIONS]
        ops = info.get("ops") or {}
        if ops.get("events"):
            self.events.merge(ops["events"])
        out: dict[str, Any] = {
            "partitions": len(parts),
            "leading": roles.get("leader", 0),
            "following": roles.get("follower", 0),
            "tracked_pids": info.get(
                "tracked_pids_total", sum(p.get("tracked_pids", 0) for p in parts)
            ),
            "rss_bytes": ops.get("process_resident_memory_bytes"),
            "top_partitions": [
                {
                    "topic": p.get("topic"),
                    "partition": p.get("partition"),
                    "role": p.get("role"),
                    "tracked_pids": p.get("tracked_pids", 0),
                }
                for p in top
            ],
        }
        for key in _FIGURES:
            out[key] = ops.get(key)
        out["logs"] = _leader_logs(parts)
        return out


def _leader_logs(parts: list[Any]) -> list[dict[str, Any]]:
    """The log of each partition a server leads, read the way the topics API reads it
    (``log_from_metadata``), so the dashboard and ``GET /v1/topics/{name}`` agree."""
    out = []
    for p in parts:
        if not isinstance(p, dict) or p.get("role") != "leader":
            continue
        topic, partition = p.get("topic"), p.get("partition")
        if not isinstance(topic, str) or not isinstance(partition, int):
            continue
        row: dict[str, Any] = {"topic": topic, "partition": partition}
        row.update(log_from_metadata({"partitions": [p]}, topic, partition))
        epoch = p.get("leader_epoch")  # replicated partitions only: it orders two claims
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            row["leader_epoch"] = epoch
        out.append(row)
        if len(out) >= LOGS_MAX:
            break
    return out
