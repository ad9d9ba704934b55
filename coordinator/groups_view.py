"""Consumer groups as the dashboard and ``/metrics`` see them (issue 25): every live
server's Kafka listener is asked for the groups it coordinates (``server_groups``: ListGroups,
DescribeGroups, a batched OffsetFetch; in parallel, with the leader-call deadline), and each
committed offset is set against its partition's high watermark as the fleet's survey
reports it (the leader's log row): the lag is the records written and committed but not
yet consumed by the group, ``high watermark - committed``.

A group whose coordinator cannot be reached is missing until it can; the view says which
servers did not answer. With API tokens the listeners require SASL/PLAIN: the coordinator
logs in as its own principal (``auth.own_login``: the first admin one configured; the
servers have the same tokens), over TLS when it calls the servers over TLS (``app.py``
passes both to ``server_groups``); a refused login shows as a server not answering, with
the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pidlease.errors import describe
from pidlease.wire.cluster import ServerInfo
from pidlease.wire.kafka_conn import server_groups

log = logging.getLogger("coordinator.groups_view")

GROUPS_MAX = 5_000  # rows (group x partition) sent to a browser


def lag_rows(
    groups: list[dict[str, Any]], high_watermarks: dict[tuple[str, int], int]
) -> list[dict[str, Any]]:
    """One row per (group, committed partition), by group, topic and partition; a group
    without a commit gets one row with no partition. ``lag`` is None when the partition's
    high watermark is unknown (its leader did not answer), else never below 0 (a commit
    may run ahead of what a lagging leader reports)."""
    rows: list[dict[str, Any]] = []
    for g in sorted(groups, key=lambda g: g["group"]):
        base = {
            "group": g["group"],
            "state": g["state"],
            "members": g["members"],
            "coordinator": g["coordinator"],
        }
        if not g["offsets"]:
            none = {"topic": None, "partition": None, "committed": None, "high_watermark": None}
            rows.append({**base, **none, "lag": None})
            continue
        for o in g["offsets"]:
            hw = high_watermarks.get((o["topic"], o["partition"]))
            lag = None if hw is None or hw < 0 else max(hw - o["committed"], 0)
            rows.append(
                {
                    **base,
                    "topic": o["topic"],
                    "partition": o["partition"],
                    "committed": o["committed"],
                    "high_watermark": hw,
                    "lag": lag,
                }
            )
    return rows


class GroupsView:
    def __init__(
        self,
        list_servers: Callable[[], list[ServerInfo]],
        *,
        timeout_ms: int,
        fetch: Callable[[str, float], list[dict[str, Any]]] = server_groups,
        parallelism: int = 4,
    ) -> None:
        self._list_servers = list_servers
        self._timeout_s = timeout_ms / 1000
        self._fetch = fetch
        self._pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="groups")
        self.failures = 0

    def survey(self) -> tuple[list[dict[str, Any]], list[str]]:
        """(every group the live servers coordinate, the servers that did not answer)."""
        servers = [s for s in self._list_servers() if s.kafka_port > 0]
        futures = {
            s.id: self._pool.submit(self._fetch, f"{s.host}:{s.kafka_port}", self._timeout_s)
            for s in servers
        }
        groups: dict[str, dict[str, Any]] = {}
        silent: list[str] = []
        for s in servers:
            try:
                for g in futures[s.id].result(timeout=self._timeout_s * 2):
                    groups[g["group"]] = g
            except Exception as exc:  # noqa: BLE001 - one bad server must not hide the others
                if isinstance(exc, FutureTimeout):
                    exc = TimeoutError("no answer in time")
                self.failures += 1
                silent.append(f"server {s.id}: {describe(exc)}")
        return [groups[k] for k in sorted(groups)], silent

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
