"""The coordinator's feed of recent fencing events for the dashboard: who was fenced, when,
and which retries were answered DUPLICATE.

Two sources fill it. Takeovers and leases refused FENCED happen here, so the lease
service records them as they are answered (``ObservedLeaseService``). Fenced appends,
DUPLICATE answers and fence records happen on the partition servers; the fleet view
(``fleet.py``) merges their own event feeds, read through METADATA, by event id. A
takeover served by another coordinator still shows, as the fence records it made the
servers write.

The feed is a ring of ``events_kept`` entries: an operator's page, not an audit log (the
partition logs are that).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from coordinator.auth import ANONYMOUS, Principal
from coordinator.leases import LeaseKind, LeaseRequest
from coordinator.service import LeaseResult, LeaseService, wall_clock_ms
from pidlease.errors import ProducerFenced

EVENTS_KEPT = 200
# Ids of merged server events remembered so a re-read feed is not added twice; larger
# than any one server's feed times the servers a dashboard shows.
SEEN_IDS_MAX = 20_000


class EventLog:
    """A bounded, thread-safe ring of event dicts, newest last. Each has ``id`` (unique),
    ``kind``, ``time_ms`` and ``source`` (``coordinator <id>`` or ``server <id>``)."""

    def __init__(
        self, source: str, *, kept: int = EVENTS_KEPT, clock_ms: Callable[[], int] = wall_clock_ms
    ) -> None:
        self.source = source
        self.clock_ms = clock_ms
        self._events: deque[dict[str, Any]] = deque(maxlen=kept)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.added = 0

    def add(self, kind: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            event = {
                "id": f"c:{self.source}:{next(self._ids)}",
                "kind": kind,
                "time_ms": self.clock_ms(),
                "source": f"coordinator {self.source}",
                **fields,
            }
            self._append(event)
            return event

    def merge(self, events: Iterable[dict[str, Any]]) -> int:
        """Add events read from a partition server (they carry their own ``id`` and
        ``time_ms``); returns how many were new."""
        new = 0
        with self._lock:
            for e in events:
                eid = str(e.get("id", ""))
                if not eid or eid in self._seen:
                    continue
                self._seen[eid] = None
                if len(self._seen) > SEEN_IDS_MAX:
                    self._seen.popitem(last=False)
                sid = e.get("server_id")
                self._append({**e, "id": f"s:{eid}", "source": f"server {sid}"})
                new += 1
        return new

    def _append(self, event: dict[str, Any]) -> None:
        self._events.append(event)
        self.added += 1

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        """Newest first, by event time (server events arrive a little late)."""
        with self._lock:
            events = list(self._events)
        events.sort(key=lambda e: (e.get("time_ms", 0), e["id"]), reverse=True)
        return events[:limit]


class ObservedLeaseService(LeaseService):
    """The lease service, recording takeovers and refused stale generations in ``events``.
    ``lease_batch`` goes through ``lease`` too, so batched requests are seen as well."""

    def __init__(self, *args: Any, events: EventLog, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.events = events

    def lease(self, req: LeaseRequest, principal: Principal = ANONYMOUS) -> LeaseResult:
        try:
            result = super().lease(req) if principal is ANONYMOUS else super().lease(req, principal)
        except ProducerFenced as exc:
            self.events.add(
                "fenced_lease",
                pid=req.pid,
                producer_name=req.producer_name,
                generation=req.generation,
                topic=req.topic,
                partition=req.partition,
                detail=exc.detail,
            )
            raise
        if result.kind is LeaseKind.TAKEOVER:
            rec = result.record
            self.events.add(
                "takeover",
                pid=rec.pid,
                producer_name=rec.producer_name,
                generation=rec.generation,
                fenced_generation=rec.generation - 1,
                topic=req.topic,
                partition=req.partition,
                partitions_fenced=len(rec.partitions),
            )
        return result
