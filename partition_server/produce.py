"""The one produce path of the server: how a client's batch, sent over our protocol
(``server.py``) or Kafka's (``kafka/records.py``), gets into a partition.

One call, ``ProducePath.produce``, with no await inside: route (does this server lead the
partition, and at which leader epoch), check (the protocol's validation and its
authorization: our lease token, or the PID's owner the Kafka listener looked up *before*
calling), and append at the routed epoch. ``Partition.append`` refuses with NOT_LEADER
(retriable) unless the partition still leads at that epoch, so a caller that awaited
between a route and an append it made itself could not write to a follower's log either
(issue 23, item 1: a Kafka produce awaited the owner lookup while the partition stepped
down, and its batch went into the follower's log with an ack nothing failed).

The bookkeeping of an append happens here once, for both protocols: the batches counted
toward ``snapshot_interval_batches`` (the log manager's ``note_append``), the appended, refused
and fenced metrics, and the append latency histogram.

A protocol's answer (its codes, when a duplicate is answered) stays with the protocol;
what this module returns is the partition's decision.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from partition_server.partition import Partition
from partition_server.producer_state import Decision
from pidlease.errors import PidleaseError
from pidlease.wire.protocol import BatchHeader

__all__ = ["Appended", "Metrics", "NotRouted", "ProducePath", "Route"]


class Metrics(Protocol):
    """What the path reports to (``metrics.ServerMetrics``)."""

    def appended(
        self,
        records: int,
        started_s: float | None = None,
        durable: asyncio.Future[Any] | None = None,
    ) -> None: ...

    def refused(
        self,
        outcome: str,
        topic: str,
        partition: int,
        pid: int,
        generation: int,
        base_sequence: int,
        count: int,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Route:
    """This server leads ``part`` at leader epoch ``epoch`` (-1 for a partition that is
    not replicated), as read when the request was routed."""

    part: Partition
    epoch: int


@dataclass(frozen=True, slots=True)
class NotRouted:
    """Not led here: ``leader`` is the leader's address ("" unknown), None when the
    partition is not known at all (the caller may re-read ZooKeeper and call again)."""

    leader: str | None


@dataclass(frozen=True, slots=True)
class Appended:
    """The partition's decision for a batch it was offered. ``durable`` (on APPEND) is
    resolved with the caller's ``on_durable(base, last)`` once committed."""

    part: Partition
    epoch: int
    header: BatchHeader
    decision: Decision
    durable: asyncio.Future[Any] | None


# The protocol's own checks of a batch, given the partition it was routed to: validation
# and authorization, synchronous; returns the batch's header or raises (the protocol
# turns its exception into its answer).
Check = Callable[[Partition], BatchHeader]


class ProducePath:
    def __init__(
        self,
        route: Callable[[str, int], tuple[Partition | None, str | None]],
        note_append: Callable[[int], None] | None = None,
    ) -> None:
        """``route``: the log manager's (the partition when this server leads it, else the
        leader's address, None when unknown). ``note_append``: counts batches toward the
        next snapshot."""
        self._route = route
        self._note_append = note_append
        self.metrics: Metrics | None = None  # set by the server that owns the metrics

    def route(self, topic: str, partition: int) -> Route | NotRouted:
        part, leader = self._route(topic, partition)
        if part is None:
            return NotRouted(leader)
        return Route(part, part.leader_epoch)

    def produce(
        self,
        topic: str,
        partition: int,
        batch: memoryview,
        check: Check,
        on_durable: Callable[[int, int], Any],
        *,
        started_s: float | None = None,
    ) -> Appended | NotRouted:
        """Route, check and append, with nothing awaited in between. Raises what ``check``
        raises, and what ``Partition.append`` raises (NotLeader, TooManyPids,
        NotEnoughReplicas, ServerUnavailable), after counting the refusal."""
        r = self.route(topic, partition)
        if isinstance(r, NotRouted):
            return r
        h = check(r.part)
        return self.append(r, batch, h, on_durable, started_s=started_s)

    def append(
        self,
        r: Route,
        batch: memoryview,
        h: BatchHeader,
        on_durable: Callable[[int, int], Any],
        *,
        started_s: float | None = None,
    ) -> Appended:
        """Append a checked batch to the partition routed in ``r``, at its routed epoch,
        and do the bookkeeping. Prefer ``produce``, which routes in the same call."""
        part = r.part
        if started_s is None:
            started_s = time.perf_counter()
        try:
            d, fut = part.append(batch, h, on_durable, epoch=r.epoch)
        except PidleaseError as exc:
            self._refused(part, h, type(exc).__name__)
            raise
        if fut is not None:
            if self._note_append is not None:
                self._note_append(1)
            if self.metrics is not None:
                self.metrics.appended(h.count, started_s, fut)
        else:
            self._refused(part, h, d.outcome.value)
        return Appended(part, r.epoch, h, d, fut)

    def _refused(self, part: Partition, h: BatchHeader, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.refused(
                outcome,
                part.topic,
                part.partition,
                h.pid,
                h.generation,
                h.base_sequence,
                h.count,
            )
