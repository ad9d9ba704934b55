"""The coordinator's HTTP API (FastAPI): routes, error translation and the request guard.

Every answer is JSON with ``"error"`` and ``"detail"``. Errors are translated here, at the
boundary: ``PidleaseError`` keeps its own code and status, FastAPI's validation errors and
undecodable JSON become INVALID_REQUEST, unknown routes 404, and anything unexpected is
logged and answered COORDINATOR_UNAVAILABLE (503, retriable) instead of a 500. Handlers
are plain ``def``: kazoo is thread-based, so they run on AnyIO's worker threads, whose
limit is raised to ``worker_threads`` so thousands of concurrent requests queue rather
than fail.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio.to_thread
from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.allocator import PidAllocator
from coordinator.auth import ANONYMOUS, Principal, own_login
from coordinator.dashboard import (
    CSP,
    HORIZON_MS_DEFAULT,
    LOG_PAGE_ROWS,
    LOG_ROWS_MAX,
    PAGE_ROWS,
    PAGE_ROWS_MAX,
    Dashboard,
    LogQuery,
    PidQuery,
)
from coordinator.events import EventLog, ObservedLeaseService
from coordinator.fastlease import FastLease
from coordinator.fleet import Fleet
from coordinator.groups_view import GroupsView
from coordinator.guard import Guard
from coordinator.housekeeper import Housekeeper
from coordinator.leaders import LeaderClient
from coordinator.live_rows import IDLE_MS_DEFAULT, LiveRows
from coordinator.metrics import Metrics
from coordinator.moves import MoveJobs
from coordinator.pid_index import STATES as PID_STATES
from coordinator.pid_index import PidIndex, Producers
from coordinator.schemas import (
    LOG_SETTINGS,
    LeaseBatchBody,
    LeaseBody,
    MovesBody,
    TopicAlterBody,
    TopicBody,
)
from coordinator.service import wall_clock_ms
from coordinator.settings import CoordinatorSettings
from coordinator.store import Store
from coordinator.topics import Topics
from pidlease.errors import CoordinatorUnavailable, InvalidRequest, PidleaseError, Unauthorized
from pidlease.wire.cluster import TOPIC_NAME_MAX, topic_name_problem
from pidlease.wire.kafka_conn import server_groups
from pidlease.wire.protocol import MAX_PID
from pidlease.wire.tls import peer_ssl_context

log = logging.getLogger("coordinator.app")


class Coordinator:
    """Everything one coordinator process holds, wired together."""

    def __init__(
        self, settings: CoordinatorSettings, *, clock_ms: Callable[[], int] = wall_clock_ms
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.store = Store(
            settings.zk,
            request_timeout_ms=settings.zk_request_timeout_ms,
            session_timeout_ms=settings.zk_session_timeout_ms,
        )
        self.allocator = PidAllocator(self.store, settings.pid_block_size)
        # A TLS coordinator calls the partition servers over TLS too (pidlease/wire/tls.py).
        peer_tls = (
            peer_ssl_context(settings.tls_certfile, settings.tls_ca_file)
            if settings.tls_certfile
            else None
        )
        self.leaders = LeaderClient(
            timeout_ms=settings.leader_request_timeout_ms,
            connections_max=settings.leader_connections_max,
            ssl_context=peer_tls,
        )
        self.events = EventLog(settings.coordinator_id, clock_ms=clock_ms)
        self.service = ObservedLeaseService(
            settings,
            self.store,
            self.allocator,
            self.leaders,
            self.metrics,
            clock_ms=clock_ms,
            events=self.events,
        )
        self.fleet = Fleet(
            self.store, self.leaders, self.events, timeout_ms=settings.leader_request_timeout_ms
        )
        # The operator's view of every PID (issue 29): the records' index and the
        # leaders' rows, each refreshed at most once per viewer round (pid_index.py).
        self.live_rows = LiveRows(self.store, self.leaders, clock_ms=clock_ms)
        self.pid_index = PidIndex(
            self.store, clock_ms=clock_ms, retention_ms=settings.pid_retention_ms
        )
        self.producers = Producers(
            self.pid_index,
            self.live_rows,
            clock_ms=clock_ms,
            window_ms=settings.lease_expiring_window_ms,
            fresher=self.service.records.peek,
        )
        self.dashboard = Dashboard(
            lambda: self.service.list_pids(None, settings.pids_list_max),
            self.fleet,
            self.events,
            clock_ms=clock_ms,
            coordinator_id=settings.coordinator_id,
            expiring_window_ms=settings.lease_expiring_window_ms,
            producers=self.producers,
            groups_view=GroupsView(
                self.store.live_servers,
                timeout_ms=settings.leader_request_timeout_ms,
                # SASL/PLAIN as the coordinator's own principal when API tokens are set,
                # TLS when the coordinator calls the servers over TLS.
                fetch=functools.partial(
                    server_groups,
                    sasl=own_login(
                        settings.api_token, settings.api_tokens, settings.api_tokens_file
                    ),
                    ssl_context=peer_tls,
                ),
            ),
        )
        self.topics = Topics(self.store, self.leaders, clock_ms)
        self.moves = MoveJobs(self.store.zk, coordinator_id=settings.coordinator_id)
        info = {
            "id": settings.coordinator_id,
            "host": settings.http_host,
            "port": settings.http_port,
            "started_ms": clock_ms(),
        }
        self.housekeeper = Housekeeper(
            self.store,
            settings.coordinator_id,
            info,
            self.service.sweep,
            settings.pid_sweep_interval_ms,
        )
        g = self.metrics.gauges
        g["pidlease_pid_blocks_fetched_total"] = lambda: self.allocator.blocks_fetched
        g["pidlease_pid_block_conflicts_total"] = lambda: self.allocator.cas_conflicts
        g["pidlease_zk_write_requests_total"] = lambda: self.store.write_requests
        g["pidlease_zk_read_requests_total"] = lambda: self.store.read_requests
        g["pidlease_zk_write_batches_total"] = lambda: self.store.writes.batches
        g["pidlease_zk_batched_writes_total"] = lambda: self.store.writes.batched_writes
        g["pidlease_pid_record_cache_hits_total"] = lambda: self.service.records.hits
        g["pidlease_pid_record_cache_misses_total"] = lambda: self.service.records.misses
        g["pidlease_zk_connected"] = lambda: int(self.store.connected)
        g["pidlease_zk_session_losses_total"] = lambda: self.store.session_losses
        g["pidlease_leader_calls_total"] = lambda: self.leaders.calls
        g["pidlease_leader_call_failures_total"] = lambda: self.leaders.failures
        g["pidlease_pids_swept_total"] = lambda: self.housekeeper.swept
        g["pidlease_server_scrape_failures_total"] = lambda: self.fleet.scrape_failures
        g["pidlease_events_recorded_total"] = lambda: self.events.added
        # From the dashboard's newest snapshot (at most one ZooKeeper scan a second): a
        # scrape never starts a scan of every PID itself.
        self.metrics.labelled["pidlease_pids"] = (
            "Retained PIDs by lease state, as of the dashboard's newest snapshot.",
            "state",
            # A lambda, not the bound method: it follows a dashboard replaced after start-up.
            lambda: self.dashboard.last_counts(),  # noqa: PLW0108
        )
        # Consumer group lag, from the dashboard's newest groups snapshot (issue 25).
        self.metrics.multi_labelled["pidlease_group_lag"] = (
            "Records of a partition below its high watermark that a consumer group has not "
            "committed yet (high watermark minus the group's committed offset), from a "
            "snapshot taken at most once a second, shared with the dashboard.",
            lambda: self.dashboard.group_lag(),  # noqa: PLW0108
        )

    def start(self) -> None:
        self.store.start()
        self.housekeeper.start()
        self.moves.start_watching()  # the cluster's one moves job: progress, takeover

    def stop(self) -> None:
        self.moves.stop_watching()
        self.housekeeper.stop()
        self.fleet.close()
        if self.dashboard.groups_view is not None:
            self.dashboard.groups_view.close()
        self.service.close()
        self.leaders.close()
        self.live_rows.close()
        self.store.stop()

    @property
    def healthy(self) -> bool:
        return self.store.connected and self.store.layout_ready


def _validation_detail(errs: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    items = []
    for e in errs[:20]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        items.append({"field": loc, "problem": e.get("msg", "invalid")})
    detail = "; ".join(f"{i['field']}: {i['problem']}" for i in items) or "malformed request"
    return detail, items


# Repeatable: ?state=active&state=expiring (none: every state).
STATE_FILTER = Query(None, description="lease states to list; repeat for several")


def create_app(
    settings: CoordinatorSettings | None = None,
    *,
    coordinator: Coordinator | None = None,
    start: bool = True,
) -> FastAPI:
    settings = settings or (coordinator.settings if coordinator else CoordinatorSettings())
    coord = coordinator or Coordinator(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        if start:
            coord.start()
        try:
            yield
        finally:
            if start:
                await anyio.to_thread.run_sync(coord.stop)

    app = FastAPI(
        title="pidlease coordinator",
        version="0.1.0",
        lifespan=lifespan,
        description="Leases producer ids (PIDs) with generation fencing.",
    )
    app.state.coordinator = coord
    metrics = coord.metrics

    def error_response(exc: PidleaseError, status: int | None = None) -> JSONResponse:
        metrics.error(exc.name)
        return JSONResponse(exc.to_json(), status_code=status or exc.http_status)

    @app.exception_handler(PidleaseError)
    async def _pidlease_error(_: Request, exc: PidleaseError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = list(exc.errors())
        detail, items = _validation_detail(errs)
        undecodable = any(e.get("type") == "json_invalid" for e in errs)
        if undecodable:
            detail = "body is not valid JSON: " + detail
        return error_response(InvalidRequest(detail, problems=items), 400 if undecodable else 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        what = {
            404: f"no such route: {request.method} {request.url.path}",
            405: f"method {request.method} is not allowed on {request.url.path}",
        }
        detail = what.get(exc.status_code, str(exc.detail))
        return error_response(InvalidRequest(detail), exc.status_code)

    open_api = not settings.principals()

    def principal_of(request: Request) -> Principal:
        # Set by the guard on every guarded route; anonymous (admin) when no API token is
        # configured. Never admin by default when tokens are configured.
        principal = getattr(request.state, "principal", None)
        if principal is None:
            if open_api:
                return ANONYMOUS
            raise Unauthorized("this call carried no API token")
        return principal  # type: ignore[no-any-return]

    # -- leases ----------------------------------------------------------------------------
    @app.post("/v1/lease_pid", summary="Lease, renew or take over a PID for one partition")
    def lease_pid(body: LeaseBody, request: Request) -> dict[str, Any]:
        return coord.service.lease(body.to_request(), principal_of(request)).to_json()

    @app.post("/v1/lease_pid/batch", summary="Several lease_pid requests, answered in order")
    def lease_pid_batch(body: LeaseBatchBody, request: Request) -> dict[str, Any]:
        if len(body.requests) > settings.batch_requests_max:
            raise InvalidRequest(
                f"a batch holds at most {settings.batch_requests_max} requests, "
                f"got {len(body.requests)}"
            )
        responses = coord.service.lease_batch(
            [r.to_request() for r in body.requests], principal_of(request)
        )
        for r in responses:
            if r["error"] != "NONE":
                metrics.error(r["error"])
        return {"error": "NONE", "responses": responses}

    # -- topics ----------------------------------------------------------------------------
    @app.post("/v1/topics", summary="Create a topic")
    def create_topic(body: TopicBody) -> dict[str, Any]:
        factor = body.replication_factor or settings.topic_replication_factor_default
        if body.min_insync_replicas > factor:
            raise InvalidRequest(
                f"min_insync_replicas {body.min_insync_replicas} is more than "
                f"replication_factor {factor} (this coordinator's default)"
            )
        return coord.topics.create(
            body.name, body.partitions, factor, body.dedup, body.log_settings()
        )

    # The body is read by hand, not by a model: a fixed field (partitions, dedup, ...) is a
    # 400 of its own, not a schema error. The schema still shows the fields PATCH takes.
    alter_properties = TopicBody.model_json_schema()["properties"]
    alter_schema = {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        # Without the creation defaults: a field left out keeps its value.
        "properties": {
            f: {k: v for k, v in alter_properties[f].items() if k != "default"}
            for f in LOG_SETTINGS
        },
    }

    @app.patch(
        "/v1/topics/{name}",
        summary="Change a topic's log settings (retention, segments, min in-sync replicas)",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": alter_schema}},
            }
        },
    )
    async def alter_topic(
        request: Request, name: str = Path(min_length=1, max_length=200)
    ) -> dict[str, Any]:
        problem = topic_name_problem(name)
        if problem:
            raise InvalidRequest(problem)
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError as exc:
            raise InvalidRequest(f"body is not valid JSON: {exc}") from exc
        if body is not None and not isinstance(body, dict):
            raise InvalidRequest(f"body must be a JSON object, not {type(body).__name__}")
        if not body:
            raise InvalidRequest(
                f"nothing to change: the body names none of {', '.join(LOG_SETTINGS)}"
            )
        others = sorted(k for k in body if k not in LOG_SETTINGS)
        if others:
            raise InvalidRequest(
                f"{', '.join(others)} cannot be changed with PATCH; it changes only "
                f"{', '.join(LOG_SETTINGS)}",
                problems=[{"field": k, "problem": "not changeable"} for k in others],
            )
        try:
            changes = TopicAlterBody.model_validate(body).changes()
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from exc
        # ZooKeeper calls block: off the event loop, as the plain-def routes run.
        return await anyio.to_thread.run_sync(coord.topics.alter, name, changes)

    @app.get("/v1/topics")
    def list_topics() -> dict[str, Any]:
        return {"error": "NONE", "topics": coord.topics.list()}

    @app.get("/v1/topics/{name}")
    def describe_topic(
        name: str = Path(min_length=1, max_length=200),
        offsets: bool = Query(
            True,
            description="ask each leader for its partitions' offsets and sizes; false: "
            "ZooKeeper only (leaders, replicas, in-sync sets), never blocked by a partition "
            "server that does not answer (what producers and readers use to find leaders)",
        ),
        first: int = Query(0, ge=0, description="the first partition shown (a page)"),
        count: int | None = Query(
            None, ge=1, description="how many partitions from ``first`` (default: all)"
        ),
    ) -> dict[str, Any]:
        problem = topic_name_problem(name)
        if problem:
            raise InvalidRequest(problem)
        return coord.topics.describe(name, with_offsets=offsets, first=first, count=count)

    # -- PIDs, servers ---------------------------------------------------------------------
    @app.get("/v1/pids")
    def list_pids(
        state: list[Literal["active", "expiring", "lapsed"]] | None = STATE_FILTER,
        limit: int = Query(1000, ge=1),
        offset: int = Query(0, ge=0, le=MAX_PID),
        q: str = Query("", max_length=200, description="text in the name, pid or partitions"),
        not_writing: bool = Query(
            False, description="only leases still running whose highwaters did not move"
        ),
        idle_ms: int = Query(IDLE_MS_DEFAULT, ge=0, le=MAX_PID),
        max_age_ms: int = Query(
            0, ge=0, le=MAX_PID, description="how old a cached snapshot may be; 0: fresh"
        ),
    ) -> dict[str, Any]:
        if limit > settings.pids_list_max:
            raise InvalidRequest(f"limit is at most {settings.pids_list_max}")
        body = coord.producers.query(
            states=frozenset(state) if state else frozenset(PID_STATES),
            text=q,
            not_writing=not_writing,
            idle_ms=idle_ms,
            offset=offset,
            limit=limit,
            max_age_ms=max_age_ms,
        )
        return {"error": "NONE", **body}

    @app.get("/v1/pids/{pid}")
    def describe_pid(request: Request, pid: int = Path(ge=1, le=MAX_PID)) -> dict[str, Any]:
        return {"error": "NONE", **coord.service.describe_pid(pid, principal_of(request))}

    @app.get("/v1/servers")
    def servers() -> dict[str, Any]:
        live = coord.store.live_servers()
        return {
            "error": "NONE",
            "servers": [
                {
                    "id": s.id,
                    "address": s.address,
                    "host": s.host,
                    "port": s.port,
                    "kafka_port": s.kafka_port,  # 0: no Kafka listener
                    "started_ms": s.started_ms,
                }
                for s in live
            ],
        }

    @app.get("/v1/coordinators")
    def coordinators() -> dict[str, Any]:
        return {"error": "NONE", "coordinators": coord.store.coordinators()}

    # -- elasticity (issue 27; coordinator/moves.py, rebalance.py): admin scope --------------
    @app.post("/v1/cluster/rebalance", summary="Plan, and unless dry_run start, a rebalance")
    def rebalance(body: MovesBody) -> dict[str, Any]:
        if not coord.healthy:
            raise CoordinatorUnavailable("ZooKeeper is not connected; retry")
        return {
            "error": "NONE",
            **coord.moves.start(
                "rebalance", dry_run=body.dry_run, rollback_after_s=body.rollback_after_s
            ),
        }

    @app.post("/v1/servers/{server_id}/drain", summary="Move every replica off one server")
    def drain(body: MovesBody, server_id: int = Path(ge=0, le=2**31 - 1)) -> dict[str, Any]:
        if not coord.healthy:
            raise CoordinatorUnavailable("ZooKeeper is not connected; retry")
        return {
            "error": "NONE",
            **coord.moves.start(
                f"drain of server {server_id}",
                [server_id],
                dry_run=body.dry_run,
                rollback_after_s=body.rollback_after_s,
            ),
        }

    @app.get("/v1/cluster/moves", summary="Progress of the running or last rebalance or drain")
    def moves_status() -> dict[str, Any]:
        return {"error": "NONE", **coord.moves.status()}

    # -- operations ------------------------------------------------------------------------
    @app.get("/healthz")
    def healthz() -> JSONResponse:
        if not coord.healthy:
            why = "ZooKeeper is not connected" if not coord.store.connected else "layout not ready"
            return error_response(CoordinatorUnavailable(why))
        return JSONResponse(
            {
                "error": "NONE",
                "detail": "ok",
                "coordinator_id": settings.coordinator_id,
                "zk_connected": True,
            }
        )

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/dashboard", response_class=HTMLResponse, summary="The operators' PID-expiry page")
    def dashboard() -> HTMLResponse:
        return HTMLResponse(coord.dashboard.page(), headers={"Content-Security-Policy": CSP})

    @app.get(
        "/dashboard/data", summary="What the dashboard page polls (counts, PIDs, servers, events)"
    )
    def dashboard_data(
        horizon_ms: int = Query(HORIZON_MS_DEFAULT, ge=1),
        state: list[Literal["active", "expiring", "lapsed"]] | None = STATE_FILTER,
        q: str = Query("", max_length=200),
        not_writing: bool = False,
        offset: int = Query(0, ge=0, le=MAX_PID),
        limit: int = Query(PAGE_ROWS, ge=1, le=PAGE_ROWS_MAX),
        logs_topic: str = Query("", max_length=TOPIC_NAME_MAX),
        logs_offset: int = Query(0, ge=0, le=2**31 - 1),
        logs_limit: int = Query(LOG_PAGE_ROWS, ge=1, le=LOG_ROWS_MAX),
    ) -> JSONResponse:
        query = PidQuery(
            states=frozenset(state) if state else frozenset(PID_STATES),
            text=q,
            not_writing=not_writing,
            offset=offset,
            limit=limit,
        )
        logs_query = LogQuery(topic=logs_topic, offset=logs_offset, limit=logs_limit)
        return JSONResponse(
            coord.dashboard.data(horizon_ms, query, logs_query),
            headers={"Cache-Control": "no-store"},
        )

    @app.get("/dashboard/static/{name}", include_in_schema=False)
    def dashboard_asset(name: str) -> Response:
        asset = coord.dashboard.static.get(name)
        if asset is None:
            raise StarletteHTTPException(404)
        return Response(asset[0], media_type=asset[1], headers={"Cache-Control": "no-cache"})

    def on_unexpected(exc: BaseException) -> tuple[int, dict[str, Any]]:
        if isinstance(exc, PidleaseError):
            metrics.error(exc.name)
            return exc.http_status, exc.to_json()
        # Called from the guard's error hook, not from an except block: the traceback is exc's.
        log.error("unexpected error while serving a request", exc_info=exc)
        metrics.error(CoordinatorUnavailable.name)
        return 503, CoordinatorUnavailable(
            f"internal error ({type(exc).__name__}); it was logged; retry"
        ).to_json()

    def on_reject(err: PidleaseError) -> None:
        metrics.error(err.name)

    # Inside the guard (added first = nearer the app): the short path for POST /v1/lease_pid.
    # A lambda, not the bound method: it follows coord.service.lease if it is replaced later.
    app.add_middleware(
        FastLease,
        lease=lambda req, who: coord.service.lease(req, who),  # noqa: PLW0108
        on_error=on_reject,
        threads=settings.worker_threads,
    )
    app.add_middleware(
        Guard,
        bytes_max=settings.request_bytes_max,
        principals=settings.principals(),
        on_unexpected=on_unexpected,
        on_reject=on_reject,
    )
    return app
