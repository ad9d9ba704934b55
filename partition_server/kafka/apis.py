"""The Kafka APIs this listener answers, one method each, over the server's log manager and
ZooKeeper registry. ``codec.SUPPORTED`` lists them with their versions; docs/kafka.md is
the matrix for users.

A handler returns bytes (answered now), a future of bytes (answered when it resolves, still
in request order: ``listener.py``), or None (a Produce with acks=0 gets no answer). A
handler may await before returning only for what must happen before the connection's next
request is applied: re-reading ZooKeeper for a partition not known yet, and reading who
owns a PID; the append itself is decided inside the call, so a connection's produces are
applied in the order sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from partition_server.kafka import codec as C
from partition_server.kafka.admin import ADMIN_APIS, AdminApis, admin_error_values
from partition_server.kafka.groups import GROUP_APIS, GroupCoordinator
from partition_server.kafka.pids import KafkaPids, PidError
from partition_server.kafka.records import RecordApis, Reply
from partition_server.kafka.sasl import ANONYMOUS, Principals, parse_plain
from partition_server.kafka.topics import CreateError, create, plan
from partition_server.log_manager import LogManager
from partition_server.registry import Registry
from partition_server.settings import ServerSettings
from pidlease.wire.kafka_errors import (
    ILLEGAL_SASL_STATE,
    INVALID_REQUEST,
    LEADER_NOT_AVAILABLE,
    NONE,
    REQUEST_TIMED_OUT,
    SASL_AUTHENTICATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_SASL_MECHANISM,
    UNSUPPORTED_VERSION,
)

log = logging.getLogger("partition_server.kafka")


CLUSTER_ID = "pidlease"


@dataclass
class Session:
    """One connection's authentication state."""

    principal: str = ANONYMOUS
    scope: str = "admin"
    authenticated: bool = False
    mechanism: str | None = None  # after a SaslHandshake
    raw_sasl: bool = False  # SaslHandshake v0: the next frame is a bare SASL token
    close_after_reply: bool = False


class KafkaApis:
    def __init__(
        self,
        settings: ServerSettings,
        log_manager: LogManager,
        registry: Registry,
        pids: Callable[[], KafkaPids],
        principals: Principals,
        *,
        stopping: Callable[[], bool],
    ) -> None:
        self.s = settings
        self.log_manager = log_manager
        self.registry = registry
        self._pids = pids
        self.principals = principals
        self._stopping = stopping
        self.records = RecordApis(
            settings,
            log_manager,
            self._refresh,
            (lambda pid: self._pids().owner(pid)) if principals.required else None,
            stopping=stopping,
        )
        self.groups = GroupCoordinator(
            settings, log_manager, registry, self._refresh, stopping=stopping
        )
        self.admin = AdminApis(settings, registry, self._refresh)

    # -- entry -----------------------------------------------------------------------------
    async def handle(self, h: C.Header, req: Any, session: Session) -> Reply:
        k = h.api_key
        if k == C.PRODUCE:
            return await self.records.produce(h, req, session.principal)
        if k == C.FETCH:
            return self.records.fetch(h, req)
        if k == C.LIST_OFFSETS:
            return self.records.list_offsets(h, req)
        if k == C.METADATA:
            return await self.metadata(h, req)
        if k == C.API_VERSIONS:
            return self.api_versions(h)
        if k == C.INIT_PRODUCER_ID:
            return self.init_producer_id(h, req, session)
        if k == C.CREATE_TOPICS:
            return self.create_topics(h, req, session)
        if k in GROUP_APIS:
            return self.groups.handle(h, req)
        if k == C.SASL_HANDSHAKE:
            return self.sasl_handshake(h, req, session)
        if k == C.SASL_AUTHENTICATE:
            return self.sasl_authenticate(h, req.auth_bytes, session)
        # the admin APIs: admin.py
        if k == C.DELETE_TOPICS:
            return self.admin.delete_topics(h, req, session.scope, session.principal)
        if k == C.CREATE_PARTITIONS:
            return self.admin.create_partitions(h, req, session.scope, session.principal)
        if k == C.DESCRIBE_CONFIGS:
            return self.admin.describe_configs(h, req)
        if k in (C.ALTER_CONFIGS, C.INCREMENTAL_ALTER_CONFIGS):
            return self.admin.alter_configs(h, req, session.scope, session.principal)
        raise AssertionError(f"api {k} is advertised but has no handler")

    # -- ApiVersions -----------------------------------------------------------------------
    def api_versions(self, h: C.Header) -> bytes:
        return C.respond(C.API_VERSIONS, h.api_version, h.correlation_id, _versions(NONE))

    @staticmethod
    def api_versions_unsupported(corr: int) -> bytes:
        """A too-new ApiVersions: answered in v0 (KIP-511) with our list, so the client
        retries with a version we speak."""
        return C.respond(C.API_VERSIONS, 0, corr, _versions(UNSUPPORTED_VERSION))

    # -- Metadata --------------------------------------------------------------------------
    async def metadata(self, h: C.Header, req: Any) -> Reply:
        names: list[str] | None = None
        if req.topics is not None and (req.topics or h.api_version > 0):
            names = [t.name for t in req.topics if t.name is not None]
        a = self.registry.assignment
        if names and any(n not in a.topics for n in names):
            await self._refresh()  # maybe created a moment ago, elsewhere
            a = self.registry.assignment
        brokers = {sid: info for sid, info in sorted(a.servers.items()) if info.kafka_port > 0}
        topics = []
        for name in sorted(a.topics) if names is None else names:
            spec = a.topics.get(name)
            if spec is None:
                topics.append({"name": name, "error_code": UNKNOWN_TOPIC_OR_PARTITION})
                continue
            parts: list[dict[str, Any]] = []
            for p in range(spec.partitions):
                ps = a.partitions.get((name, p))
                if ps is None:
                    parts.append(
                        {"partition_index": p, "error_code": LEADER_NOT_AVAILABLE, "leader_id": -1}
                    )
                    continue
                live = ps.leader in brokers
                parts.append(
                    {
                        "partition_index": p,
                        "error_code": NONE if live else LEADER_NOT_AVAILABLE,
                        "leader_id": ps.leader if live else -1,
                        "leader_epoch": ps.leader_epoch,
                        "replica_nodes": list(ps.replicas),
                        "isr_nodes": list(ps.isr or ps.replicas),
                        "offline_replicas": [r for r in ps.replicas if r not in brokers],
                    }
                )
            topics.append({"name": name, "error_code": NONE, "partitions": parts})
        return C.respond(
            C.METADATA,
            h.api_version,
            h.correlation_id,
            {
                "brokers": [
                    {"node_id": sid, "host": info.host, "port": info.kafka_port}
                    for sid, info in brokers.items()
                ],
                "cluster_id": CLUSTER_ID,
                # Every node takes CreateTopics (it writes ZooKeeper); name the lowest id so
                # all nodes answer the same.
                "controller_id": min(brokers) if brokers else -1,
                "topics": topics,
            },
        )

    # -- InitProducerId --------------------------------------------------------------------
    def init_producer_id(self, h: C.Header, req: Any, session: Session) -> Reply:
        corr, v = h.correlation_id, h.api_version
        if req.transactional_id is not None:
            return C.respond(
                C.INIT_PRODUCER_ID,
                v,
                corr,
                {"error_code": INVALID_REQUEST, "producer_id": -1, "producer_epoch": -1},
            )
        pid = getattr(req, "producer_id", -1)
        epoch = getattr(req, "producer_epoch", -1)

        async def run() -> bytes:
            loop = asyncio.get_running_loop()
            try:
                got = await loop.run_in_executor(
                    None, self._pids().init, session.principal, pid, epoch
                )
            except PidError as exc:
                log.warning("InitProducerId refused: %s", exc)
                return C.respond(
                    C.INIT_PRODUCER_ID,
                    v,
                    corr,
                    {"error_code": exc.code, "producer_id": -1, "producer_epoch": -1},
                )
            except Exception as exc:  # noqa: BLE001 - ZooKeeper down: retriable for the client
                log.warning("InitProducerId failed: %s", exc)
                return C.respond(
                    C.INIT_PRODUCER_ID,
                    v,
                    corr,
                    {"error_code": REQUEST_TIMED_OUT, "producer_id": -1, "producer_epoch": -1},
                )
            log.info("InitProducerId: pid %d epoch %d for %s", got.pid, got.epoch, got.principal)
            return C.respond(
                C.INIT_PRODUCER_ID,
                v,
                corr,
                {"error_code": NONE, "producer_id": got.pid, "producer_epoch": got.epoch},
            )

        return asyncio.ensure_future(run())

    # -- CreateTopics ----------------------------------------------------------------------
    def create_topics(self, h: C.Header, req: Any, session: Session) -> Reply:
        async def run() -> bytes:
            loop = asyncio.get_running_loop()
            out = []
            for t in req.topics:
                entry: dict[str, Any] = {"name": t.name, "error_code": NONE}
                try:
                    if session.scope != "admin":
                        raise CreateError(
                            TOPIC_AUTHORIZATION_FAILED, "only an admin principal may create topics"
                        )
                    if t.assignments:
                        raise CreateError(
                            INVALID_REQUEST, "manual replica assignments are not supported"
                        )
                    live = sorted(self.registry.assignment.servers)
                    configs = {c.name: c.value for c in t.configs}
                    spec, states = plan(
                        t.name, t.num_partitions, t.replication_factor, live, configs
                    )
                    if not req.validate_only:
                        await loop.run_in_executor(None, create, self.registry.zk, spec, states)
                        log.info(
                            "created topic %s (%d partitions, R=%d) for %s",
                            spec.name,
                            spec.partitions,
                            spec.replication_factor,
                            session.principal,
                        )
                    entry.update(
                        num_partitions=spec.partitions, replication_factor=spec.replication_factor
                    )
                except CreateError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
                except Exception as exc:  # noqa: BLE001 - ZooKeeper trouble: said, not raised
                    entry.update(error_code=UNKNOWN_SERVER_ERROR, error_message=str(exc))
                out.append(entry)
            await self._refresh()
            return C.respond(C.CREATE_TOPICS, h.api_version, h.correlation_id, {"topics": out})

        return asyncio.ensure_future(run())

    # -- SASL ------------------------------------------------------------------------------
    def sasl_handshake(self, h: C.Header, req: Any, session: Session) -> bytes:
        ok = req.mechanism == "PLAIN" and not session.authenticated
        if ok:
            session.mechanism = "PLAIN"
            session.raw_sasl = h.api_version == 0
        else:
            session.close_after_reply = True
        code = (
            NONE
            if ok
            else (ILLEGAL_SASL_STATE if session.authenticated else UNSUPPORTED_SASL_MECHANISM)
        )
        return C.respond(
            C.SASL_HANDSHAKE,
            h.api_version,
            h.correlation_id,
            {"error_code": code, "mechanisms": ["PLAIN"]},
        )

    def authenticate(self, auth_bytes: bytes, session: Session) -> str | None:
        """Check a PLAIN token; None when it passes, else why not."""
        creds = parse_plain(auth_bytes)
        who = None
        if creds is not None:
            user, password = creds
            if not self.principals.required:
                who = (user or ANONYMOUS, "admin")
            else:
                who = self.principals.identify(user, password)
        if who is None:
            return "authentication failed: wrong user or token"
        session.principal, session.scope = who
        session.authenticated = True
        session.mechanism = None
        return None

    def sasl_authenticate(self, h: C.Header, auth_bytes: bytes, session: Session) -> bytes:
        if session.mechanism is None:
            why: str | None = "SaslAuthenticate before a SaslHandshake"
            code = ILLEGAL_SASL_STATE
        else:
            why = self.authenticate(bytes(auth_bytes), session)
            code = NONE if why is None else SASL_AUTHENTICATION_FAILED
        if why is not None:
            session.close_after_reply = True
            log.warning("Kafka client refused: %s", why)
        return C.respond(
            C.SASL_AUTHENTICATE,
            h.api_version,
            h.correlation_id,
            {"error_code": code, "error_message": why, "auth_bytes": b""},
        )

    # -- errors in a request's own shape ---------------------------------------------------
    def error_reply(self, h: C.Header, req: Any, code: int) -> bytes:
        """``code`` for every item of the request, in its version's response shape."""
        corr, v, k = h.correlation_id, h.api_version, h.api_key
        if k == C.PRODUCE:
            values: dict[str, Any] = {
                "responses": [
                    {
                        "name": t.name,
                        "partition_responses": [
                            {"index": p.index, "error_code": code, "base_offset": -1}
                            for p in t.partition_data
                        ],
                    }
                    for t in req.topic_data
                ]
            }
        elif k == C.LIST_OFFSETS:
            values = {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {"partition_index": p.partition_index, "error_code": code, "offset": -1}
                            for p in t.partitions
                        ],
                    }
                    for t in req.topics
                ]
            }
        elif k == C.METADATA:
            values = {"topics": [{"name": t.name, "error_code": code} for t in req.topics or ()]}
        elif k == C.CREATE_TOPICS:
            values = {"topics": [{"name": t.name, "error_code": code} for t in req.topics]}
        elif k == C.FETCH:
            values = {
                "error_code": code,
                "responses": [
                    {
                        "topic": getattr(t, "topic", ""),
                        "partitions": [
                            {
                                "partition_index": p.partition,
                                "error_code": code,
                                "high_watermark": -1,
                            }
                            for p in t.partitions
                        ],
                    }
                    for t in req.topics
                ],
            }
        elif k in ADMIN_APIS:
            values = admin_error_values(h, req, code)
        else:
            values = {"error_code": code}
        return C.respond(k, v, corr, values)

    async def _refresh(self) -> None:
        # Bounded: with ZooKeeper unreachable the request is answered from the view we have.
        try:
            await asyncio.wait_for(self.registry.refresh(), self.s.zk_session_timeout_ms / 1000)
        except TimeoutError:
            log.warning("re-reading ZooKeeper timed out; answering from the last view")


def _versions(code: int) -> dict[str, Any]:
    return {
        "error_code": code,
        "api_keys": [
            {"api_key": k, "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(C.SUPPORTED.items())
        ],
    }
