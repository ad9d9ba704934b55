"""The Kafka admin APIs beyond CreateTopics: DeleteTopics, CreatePartitions,
DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, over the ZooKeeper writes of
``topics.py`` and the config mapping of ``configs.py`` (the settings of
``PATCH /v1/topics``). Every node answers them (each writes ZooKeeper, as for
CreateTopics); with SASL only an ``admin`` principal may change topics
(TOPIC_AUTHORIZATION_FAILED otherwise), any principal may describe.

Each request is answered item by item: one topic's refusal does not stop the others.
ZooKeeper work runs in an executor; the answer is a future, still answered in request
order by the listener.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

from partition_server.kafka import codec as C
from partition_server.kafka import configs as CF
from partition_server.kafka import topics as T
from partition_server.registry import Registry
from partition_server.settings import ServerSettings
from pidlease.errors import describe
from pidlease.wire import kafka_errors as E
from pidlease.wire.cluster import TopicSpec
from pidlease.wire.kafka_errors import (
    INVALID_REQUEST,
    NONE,
    REQUEST_TIMED_OUT,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_ID,
)

log = logging.getLogger("partition_server.kafka")

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


class AdminApis:
    def __init__(
        self,
        settings: ServerSettings,
        registry: Registry,
        refresh: Callable[[], Awaitable[None]],
    ) -> None:
        self.s = settings
        self.registry = registry
        self._refresh = refresh

    async def _blocking(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: fn(*args, **kw))

    # -- DeleteTopics ----------------------------------------------------------------------
    def delete_topics(
        self, h: C.Header, req: Any, scope: str, principal: str
    ) -> asyncio.Future[bytes]:
        names: list[str | None] = (
            [t.name for t in req.topics] if h.api_version >= 6 else list(req.topic_names)
        )

        async def run() -> bytes:
            out = []
            for name in names:
                entry: dict[str, Any] = {"name": name or "", "error_code": NONE}
                try:
                    if name is None:
                        raise T.CreateError(UNKNOWN_TOPIC_ID, "topic ids are not supported")
                    _admin_only(scope, "delete topics")
                    await self._blocking(T.delete, self.registry.zk, name)
                    log.warning("deleted topic %s for %s", name, principal)
                except T.CreateError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
                except Exception as exc:  # noqa: BLE001 - ZooKeeper trouble: said, not raised
                    entry.update(_failed(exc))
                out.append(entry)
            await self._refresh()
            return C.respond(C.DELETE_TOPICS, h.api_version, h.correlation_id, {"responses": out})

        return asyncio.ensure_future(run())

    # -- CreatePartitions ------------------------------------------------------------------
    def create_partitions(
        self, h: C.Header, req: Any, scope: str, principal: str
    ) -> asyncio.Future[bytes]:
        async def run() -> bytes:
            out = []
            for t in req.topics:
                entry: dict[str, Any] = {"name": t.name, "error_code": NONE}
                try:
                    _admin_only(scope, "add partitions")
                    if t.assignments:
                        raise T.CreateError(
                            INVALID_REQUEST, "manual replica assignments are not supported"
                        )
                    live = sorted(self.registry.assignment.servers)
                    await self._blocking(
                        T.add_partitions,
                        self.registry.zk,
                        t.name,
                        t.count,
                        live,
                        validate_only=req.validate_only,
                    )
                    if not req.validate_only:
                        log.info("topic %s: %d partitions, for %s", t.name, t.count, principal)
                except T.CreateError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
                except Exception as exc:  # noqa: BLE001
                    entry.update(_failed(exc))
                out.append(entry)
            await self._refresh()
            return C.respond(C.CREATE_PARTITIONS, h.api_version, h.correlation_id, {"results": out})

        return asyncio.ensure_future(run())

    # -- DescribeConfigs -------------------------------------------------------------------
    def describe_configs(self, h: C.Header, req: Any) -> asyncio.Future[bytes]:
        async def run() -> bytes:
            out = []
            for r in req.resources:
                entry: dict[str, Any] = {
                    "error_code": NONE,
                    "resource_type": r.resource_type,
                    "resource_name": r.resource_name,
                    "configs": [],
                }
                try:
                    _topic_resource(r.resource_type)
                    spec, _ = await self._blocking(T.read_spec, self.registry.zk, r.resource_name)
                    keys = None if r.configuration_keys is None else list(r.configuration_keys)
                    entry["configs"] = CF.describe(spec, self.s.segment_bytes_max, keys)
                except T.CreateError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
                except Exception as exc:  # noqa: BLE001
                    entry.update(_failed(exc))
                out.append(entry)
            return C.respond(C.DESCRIBE_CONFIGS, h.api_version, h.correlation_id, {"results": out})

        return asyncio.ensure_future(run())

    # -- AlterConfigs / IncrementalAlterConfigs --------------------------------------------
    def alter_configs(
        self, h: C.Header, req: Any, scope: str, principal: str
    ) -> asyncio.Future[bytes]:
        incremental = h.api_key == C.INCREMENTAL_ALTER_CONFIGS

        async def run() -> bytes:
            out = []
            for r in req.resources:
                entry: dict[str, Any] = {
                    "error_code": NONE,
                    "resource_type": r.resource_type,
                    "resource_name": r.resource_name,
                }
                try:
                    _topic_resource(r.resource_type)
                    _admin_only(scope, "change topic configs")
                    sets, deletes = _operations(r.configs, incremental)

                    def change(
                        spec: TopicSpec, sets: Any = sets, deletes: Any = deletes
                    ) -> TopicSpec:
                        return CF.altered(spec, sets, deletes, replace=not incremental)

                    new = await self._blocking(
                        T.alter,
                        self.registry.zk,
                        r.resource_name,
                        change,
                        validate_only=req.validate_only,
                    )
                    if not req.validate_only:
                        log.info(
                            "topic %s configs %s for %s",
                            r.resource_name,
                            {k: getattr(new, f) for k, f in CF.SETTINGS.items()},
                            principal,
                        )
                except T.CreateError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
                except Exception as exc:  # noqa: BLE001
                    entry.update(_failed(exc))
                out.append(entry)
            await self._refresh()
            return C.respond(h.api_key, h.api_version, h.correlation_id, {"responses": out})

        return asyncio.ensure_future(run())


ADMIN_APIS = frozenset(
    {
        C.DELETE_TOPICS,
        C.CREATE_PARTITIONS,
        C.DESCRIBE_CONFIGS,
        C.ALTER_CONFIGS,
        C.INCREMENTAL_ALTER_CONFIGS,
    }
)


def admin_error_values(h: C.Header, req: Any, code: int) -> dict[str, Any]:
    """``code`` for every item of an admin request, in its response's shape."""
    k = h.api_key
    if k == C.DELETE_TOPICS:
        names = [t.name or "" for t in req.topics] if h.api_version >= 6 else list(req.topic_names)
        return {"responses": [{"name": n, "error_code": code} for n in names]}
    if k == C.CREATE_PARTITIONS:
        return {"results": [{"name": t.name, "error_code": code} for t in req.topics]}
    items = [
        {"error_code": code, "resource_type": r.resource_type, "resource_name": r.resource_name}
        for r in req.resources
    ]
    if k == C.DESCRIBE_CONFIGS:
        return {"results": [{**i, "configs": []} for i in items]}
    return {"responses": items}


def _failed(exc: Exception) -> dict[str, Any]:
    """An item that failed on ZooKeeper. A lost connection or a timeout leaves it unknown
    whether the change was made: REQUEST_TIMED_OUT, retriable, as Kafka answers when its
    controller does not finish in time."""
    if isinstance(exc, ConnectionLoss | OperationTimeoutError | SessionExpiredError):
        return {
            "error_code": REQUEST_TIMED_OUT,
            "error_message": f"ZooKeeper: {describe(exc)}; the change may or may not be made",
        }
    return {"error_code": UNKNOWN_SERVER_ERROR, "error_message": describe(exc)}


def _admin_only(scope: str, what: str) -> None:
    if scope != "admin":
        raise T.CreateError(TOPIC_AUTHORIZATION_FAILED, f"only an admin principal may {what}")


def _topic_resource(resource_type: int) -> None:
    if resource_type != TOPIC_RESOURCE:
        raise T.CreateError(
            INVALID_REQUEST,
            f"resource type {resource_type}: only topic configs (type 2) are served here",
        )


def _operations(configs: Any, incremental: bool) -> tuple[dict[str, str | None], list[str]]:
    """(settings to set, settings to reset to their defaults) of one resource's configs."""
    sets: dict[str, str | None] = {}
    deletes: list[str] = []
    for c in configs:
        op = getattr(c, "config_operation", SET) if incremental else SET
        if op == SET:
            sets[c.name] = c.value
        elif op == DELETE:
            deletes.append(c.name)
        else:
            raise T.CreateError(
                E.INVALID_CONFIG,
                f"{c.name}: APPEND and SUBTRACT are for list configs; none is alterable here",
            )
    return sets, deletes
