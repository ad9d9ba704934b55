"""The record APIs of the Kafka listener: Produce, Fetch and ListOffsets, over the
partitions this server leads (``LogManager.route``) and the log side in
``partition_server/kafka_partition.py`` (validation, Kafka's idempotence rules, RecordBatch
v2 assembly).

Produce is applied inside the call, in the order the connection sent it; only a partition
not known yet (a ZooKeeper re-read) and, with SASL, who owns the PID are awaited first,
before the partition is routed: the route, the checks and the append then happen in one
call through the server's produce path (``produce.py``), with no await in between. Its
answer waits for the batches' durability by ``acks`` within the request's timeout; Fetch
long-polls on the partitions' data futures up to ``max_wait_ms`` (at most
``kafka_fetch_wait_max_ms``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from partition_server.kafka import codec as C
from partition_server.kafka_partition import (
    KafkaProduceResult,
    Unauthorized,
    kafka_fetch,
    kafka_produce,
)
from partition_server.log_manager import LogManager
from partition_server.partition import Partition
from partition_server.produce import NotRouted
from partition_server.settings import ServerSettings
from pidlease.wire.kafka_errors import (
    INVALID_RECORD,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    REQUEST_TIMED_OUT,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_VERSION,
)
from pidlease.wire.protocol import BatchHeader

log = logging.getLogger("partition_server.kafka")

Reply = bytes | asyncio.Future[bytes] | None

_PID_AT = struct.Struct(">q")  # producerId in a RecordBatch v2 header, at byte 43
_PID_OFFSET = 43
LATEST = -1
EARLIEST = -2


class RecordApis:
    def __init__(
        self,
        settings: ServerSettings,
        log_manager: LogManager,
        refresh: Callable[[], Awaitable[None]],
        owner: Callable[[int], str | None] | None,
        *,
        stopping: Callable[[], bool],
    ) -> None:
        """``owner``: who initialised a PID (blocking, run in an executor); None when SASL
        is off and PIDs are not checked."""
        self.s = settings
        self.log_manager = log_manager
        self._refresh = refresh
        self._owner = owner
        self._stopping = stopping
        self.produce_timeouts = 0

    # -- Produce ---------------------------------------------------------------------------
    async def produce(self, h: C.Header, req: Any, principal: str) -> Reply:
        acks = int(req.acks)
        timeout_s = max(req.timeout.total_seconds(), 0.001)
        refreshed = False
        results: list[
            tuple[str, list[tuple[int, KafkaProduceResult | asyncio.Future[KafkaProduceResult]]]]
        ] = []
        for t in req.topic_data:
            parts: list[tuple[int, KafkaProduceResult | asyncio.Future[KafkaProduceResult]]] = []
            for pd in t.partition_data:
                # What must be awaited comes first (the PID's owner; ZooKeeper for a
                # partition not known yet); routing and appending come after, in one call
                # with no await (produce.py), so leadership cannot change in between.
                authorize = await self._authorizer(pd.records, principal)
                r = self._produce_now(t.name, pd, acks, authorize, refreshed)
                if r is None:
                    await self._refresh()
                    refreshed = True
                    r = self._produce_now(t.name, pd, acks, authorize, refreshed)
                assert r is not None
                parts.append((pd.index, r))
            results.append((t.name, parts))
        if acks == 0:
            return None
        corr, v = h.correlation_id, h.api_version
        futs = [r for _, ps in results for _, r in ps if isinstance(r, asyncio.Future)]
        if not futs:
            return C.respond(C.PRODUCE, v, corr, _produce_values(results))

        async def answer() -> bytes:
            # One deadline for the whole request (its timeout), not one per partition.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            done: dict[int, KafkaProduceResult] = {}
            for f in futs:
                try:
                    left = max(deadline - loop.time(), 0.001)
                    done[id(f)] = await asyncio.wait_for(asyncio.shield(f), left)
                except TimeoutError:
                    self.produce_timeouts += 1
                    done[id(f)] = KafkaProduceResult(
                        REQUEST_TIMED_OUT, error_message="not replicated within the timeout"
                    )
            resolved = [
                (name, [(i, done[id(r)] if isinstance(r, asyncio.Future) else r) for i, r in ps])
                for name, ps in results
            ]
            return C.respond(C.PRODUCE, v, corr, _produce_values(resolved))

        return asyncio.ensure_future(answer())

    async def _authorizer(
        self, records: bytes | None, principal: str
    ) -> Callable[[BatchHeader], None] | None:
        """With SASL: who owns the batch's PID, looked up (in an executor: a first sight
        reads ZooKeeper) before the batch is routed; the check it returns runs inside the
        produce path. None when PIDs are not checked (SASL off, no PID)."""
        if self._owner is None or not records or len(records) < _PID_OFFSET + 8:
            return None
        (pid,) = _PID_AT.unpack_from(records, _PID_OFFSET)
        if pid < 0:
            return None
        owner = await asyncio.get_running_loop().run_in_executor(None, self._owner, pid)

        def authorize(h: BatchHeader) -> None:
            if h.pid != pid or owner != principal:
                raise Unauthorized(h.pid)

        return authorize

    def _produce_now(
        self,
        topic: str,
        pd: Any,
        acks: int,
        authorize: Callable[[BatchHeader], None] | None,
        refreshed: bool,
    ) -> KafkaProduceResult | asyncio.Future[KafkaProduceResult] | None:
        """One partition's batch through the produce path; None when the partition is not
        known and ZooKeeper was not re-read yet for this request."""
        path = self.log_manager.produce
        route = path.route(topic, pd.index)
        if isinstance(route, NotRouted):
            return self._not_routed(route, refreshed)
        if self._stopping():
            return KafkaProduceResult(NOT_LEADER_OR_FOLLOWER, error_message="server stopping")
        records = pd.records
        if not records:
            return KafkaProduceResult(INVALID_RECORD, error_message="no records")
        r = kafka_produce(
            path,
            topic,
            pd.index,
            records,
            acks=acks,
            batch_bytes_max=self.s.batch_bytes_max,
            authorize=authorize,
        )
        if isinstance(r, NotRouted):  # cannot happen: routed just above, no await between
            return self._not_routed(r, True)
        return r

    @staticmethod
    def _not_routed(r: NotRouted, refreshed: bool) -> KafkaProduceResult | None:
        if r.leader is None:
            if not refreshed:
                return None
            return KafkaProduceResult(UNKNOWN_TOPIC_OR_PARTITION, error_message="no such partition")
        return KafkaProduceResult(NOT_LEADER_OR_FOLLOWER, error_message="not the leader")

    # -- Fetch -----------------------------------------------------------------------------
    def fetch(self, h: C.Header, req: Any) -> Reply:
        wait_s = min(req.max_wait.total_seconds(), self.s.kafka_fetch_wait_max_ms / 1000)
        max_bytes = min(getattr(req, "max_bytes", self.s.fetch_bytes_max), self.s.fetch_bytes_max)
        values, size, waitable = self._fetch_once(req, max_bytes)
        if size >= max(req.min_bytes, 1) or wait_s <= 0 or not waitable:
            return C.respond(C.FETCH, h.api_version, h.correlation_id, values)

        async def long_poll() -> bytes:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_s
            nonlocal values, size
            while size < max(req.min_bytes, 1) and not self._stopping():
                left = deadline - loop.time()
                if left <= 0:
                    break
                waits = [p.wait_for_data() for p in waitable]
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                values, size, _ = self._fetch_once(req, max_bytes)
            return C.respond(C.FETCH, h.api_version, h.correlation_id, values)

        return asyncio.ensure_future(long_poll())

    def _fetch_once(self, req: Any, max_bytes: int) -> tuple[dict[str, Any], int, list[Partition]]:
        """(response values, record bytes in it, the partitions a long poll may wait on:
        none when a partition has an error, which the client must hear at once)."""
        total = 0
        errored = False
        waitable: list[Partition] = []
        topics = []
        for t in req.topics:
            parts = []
            for fp in t.partitions:
                entry: dict[str, Any] = {"partition_index": fp.partition, "records": b""}
                part, leader = self.log_manager.route(t.topic, fp.partition)
                if part is None:
                    entry.update(
                        error_code=UNKNOWN_TOPIC_OR_PARTITION
                        if leader is None
                        else NOT_LEADER_OR_FOLLOWER,
                        high_watermark=-1,
                    )
                    parts.append(entry)
                    errored = True
                    continue
                limit = min(fp.partition_max_bytes, max_bytes - total)
                r = kafka_fetch(part, fp.fetch_offset, max(limit, 1))
                records = r.records
                if total and len(records) > limit:
                    records = b""  # only the first data may go over the limits (one batch)
                total += len(records)
                entry.update(
                    error_code=r.error_code,
                    high_watermark=r.high_watermark,
                    last_stable_offset=r.high_watermark,
                    log_start_offset=r.log_start_offset,
                    records=records,
                )
                if r.error_code != NONE:
                    errored = True
                elif not records:
                    waitable.append(part)
                parts.append(entry)
            topics.append({"topic": t.topic, "partitions": parts})
        values = {"error_code": NONE, "session_id": 0, "responses": topics}
        return values, total, [] if errored else waitable

    # -- ListOffsets -----------------------------------------------------------------------
    def list_offsets(self, h: C.Header, req: Any) -> bytes:
        topics = []
        for t in req.topics:
            parts = []
            for lp in t.partitions:
                part, leader = self.log_manager.route(t.name, lp.partition_index)
                if part is None:
                    code = UNKNOWN_TOPIC_OR_PARTITION if leader is None else NOT_LEADER_OR_FOLLOWER
                    parts.append(
                        {
                            "partition_index": lp.partition_index,
                            "error_code": code,
                            "offset": -1,
                            "timestamp": -1,
                        }
                    )
                    continue
                ts = int(lp.timestamp)
                if ts < EARLIEST:
                    parts.append(
                        {
                            "partition_index": lp.partition_index,
                            "error_code": UNSUPPORTED_VERSION,
                            "offset": -1,
                        }
                    )
                    continue
                if ts == LATEST:
                    offset = part.high_watermark
                elif ts == EARLIEST:
                    offset = part.log.log_start_offset
                else:
                    offset = part.offset_for_timestamp(ts)
                    if offset >= part.high_watermark:
                        offset = -1  # no record at or after that time: Kafka answers -1
                parts.append(
                    {
                        "partition_index": lp.partition_index,
                        "error_code": NONE,
                        "offset": offset,
                        "timestamp": -1,
                    }
                )
            topics.append({"name": t.name, "partitions": parts})
        return C.respond(C.LIST_OFFSETS, h.api_version, h.correlation_id, {"topics": topics})


def _produce_values(
    results: list[tuple[str, list[tuple[int, Any]]]],
) -> dict[str, Any]:
    return {
        "responses": [
            {
                "name": name,
                "partition_responses": [
                    {
                        "index": i,
                        "error_code": r.error_code,
                        "base_offset": r.base_offset,
                        "log_start_offset": r.log_start_offset,
                        "error_message": r.error_message,
                    }
                    for i, r in ps
                ],
            }
            for name, ps in results
        ]
    }
